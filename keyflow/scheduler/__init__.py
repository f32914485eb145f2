"""Scheduling decisions as pure state machines (no Spark): the runtime feeds them facts."""

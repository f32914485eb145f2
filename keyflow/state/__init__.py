"""Keyed state: per-key values stored by key group."""

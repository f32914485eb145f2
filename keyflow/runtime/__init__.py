"""Execution on Spark: sessions, key-group expressions, exchanges and operators."""

"""The ``keyflow`` command line."""

"""Subcommands of the ``cdsjax`` command, one module each (see :mod:`cdsjax.cli`)."""

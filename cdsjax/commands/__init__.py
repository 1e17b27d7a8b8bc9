"""Subcommands of the ``cdsjax`` command, one module each (see :mod:`cdsjax.cli`).

:class:`CLIError` lives here, not in :mod:`cdsjax.cli`, because :mod:`cdsjax.cli` imports the subcommands:
they import it from their own package, so no subcommand imports the module that imports it.
"""


class CLIError(Exception):
    """An error to show the user as one line, with exit code ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def enable_float64() -> None:
    """Turns on ``jax_enable_x64``, for a command whose config asks for float64 (``cdsjax eval`` with
    ``dtype = "float64"``). A process-wide JAX setting, so only entry points change it."""
    import jax

    jax.config.update("jax_enable_x64", True)

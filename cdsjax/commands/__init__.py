"""Subcommands of the ``cdsjax`` command, one module each (see :mod:`cdsjax.cli`).

:class:`CLIError` lives here, not in :mod:`cdsjax.cli`, because :mod:`cdsjax.cli` imports the subcommands:
they import it from their own package, so no subcommand imports the module that imports it.
"""


class CLIError(Exception):
    """An error to show the user as one line, with exit code ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def printable(text) -> str:
    """``text`` with every character that is not printable shown as its Python escape (``\\x1b``,
    ``\\n``, ``\\udce9`` for a byte of a file name that is not UTF-8).

    What cdsjax prints of a name or text it did not write (a file name, a document id, a PDF's text) goes
    through this, so a crafted name cannot send escape sequences to the terminal or split a line in two."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def enable_float64() -> None:
    """Turns on ``jax_enable_x64``, for a command whose config asks for float64 (``cdsjax eval`` with
    ``dtype = "float64"``). A process-wide JAX setting, so only entry points change it."""
    import jax

    jax.config.update("jax_enable_x64", True)


def add_selector_argument(parser, lead: str) -> None:
    """``--selector NAME`` (default None: :data:`cdsjax.catalog.DEFAULT_SELECTOR`, resolved where the selector is
    built).

    Its help is ``lead`` followed by every selector with its one-line help (:func:`cdsjax.catalog.selectors_help`),
    read only when help is shown: the registry imports JAX, which ``cdsjax --help`` and ``cdsjax ask --server``
    must not load.
    """
    import argparse

    class SelectorAction(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            setattr(namespace, self.dest, values)

        @property
        def help(self) -> str:
            from cdsjax.catalog import selectors_help

            return f"{self._lead} ({selectors_help()})"

        @help.setter
        def help(self, value) -> None:
            self._lead = value or ""

    parser.add_argument("--selector", default=None, metavar="NAME", action=SelectorAction, help=lead)

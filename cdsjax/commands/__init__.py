"""Subcommands of the ``cdsjax`` command, one module each (see :mod:`cdsjax.cli`).

:class:`CLIError` lives here, not in :mod:`cdsjax.cli`, because :mod:`cdsjax.cli` imports the subcommands:
they import it from their own package, so no subcommand imports the module that imports it.
"""

from cdsjax.defaults import LOCAL_EVIDENCE_TOKENS


class CLIError(Exception):
    """An error to show the user as one line, with exit code ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def printable(text, keep_newlines: bool = False) -> str:
    """``text`` with every character that is not printable shown as its Python escape (``\\x1b``,
    ``\\n``, ``\\udce9`` for a byte of a file name that is not UTF-8); ``keep_newlines`` keeps line breaks
    (a model's answer, written on lines of its own).

    What cdsjax prints of a name or text it did not write (a file name, a document id, a PDF's text) goes
    through this, so a crafted name cannot send escape sequences to the terminal or split a line in two."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or (keep_newlines and ch == "\n") else
                   ch.encode("unicode_escape").decode("ascii") for ch in text)


def enable_float64() -> None:
    """Turns on ``jax_enable_x64``, for a command whose config asks for float64 (``cdsjax eval`` with
    ``dtype = "float64"``). A process-wide JAX setting, so only entry points change it."""
    import jax

    jax.config.update("jax_enable_x64", True)


def add_relevance_argument(parser) -> None:
    """``--relevance dense|hybrid``: what ranks the notes for every selector (:mod:`cdsjax.io.relevance`; default
    None: the configured one, hybrid unless changed)."""
    from cdsjax.defaults import DEFAULT_RELEVANCE
    from cdsjax.io.relevance import RELEVANCE_MODES

    parser.add_argument("--relevance", choices=RELEVANCE_MODES, default=None,
                        help=f"what ranks the notes for every selector: 'dense' (the embeddings' cosine) or 'hybrid' "
                        f"(the cosine mixed with a BM25 match of the question's words; default: {DEFAULT_RELEVANCE})")


def add_selector_argument(parser, lead: str) -> None:
    """``--selector NAME`` (default None: :data:`cdsjax.pipeline.catalog.DEFAULT_SELECTOR`, resolved where the
    selector is built).

    Its help is ``lead`` followed by every selector with its one-line help
    (:func:`cdsjax.pipeline.catalog.selectors_help`), read only when help is shown: the registry imports JAX, which
    ``cdsjax --help`` and ``cdsjax ask --server`` must not load.
    """
    import argparse

    class SelectorAction(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            setattr(namespace, self.dest, values)

        @property
        def help(self) -> str:
            from cdsjax.pipeline.catalog import selectors_help

            return f"{self._lead} ({selectors_help()})"

        @help.setter
        def help(self, value) -> None:
            self._lead = value or ""

    parser.add_argument("--selector", default=None, metavar="NAME", action=SelectorAction, help=lead)


def add_reader_arguments(p, *, slots: int = 1) -> None:
    """The reader flags of ``ask`` and ``serve``: a remote server (``--reader-url``), or the local one
    (:mod:`cdsjax.io.reading.local.reader`), which answers when no URL is configured and its runtime is installed.
    Their defaults are the fields' of :class:`~cdsjax.io.reading.llm.config.ReaderConfig` and
    :class:`~cdsjax.io.reading.local.reader.LocalReaderConfig` (the evaluation's ``config.reader`` takes them
    there too)."""
    from cdsjax.io.reading.llm.config import IMAGE_MODES, ReaderConfig
    from cdsjax.io.reading.local.reader import LocalReaderConfig

    timeout = ReaderConfig.timeout
    p.add_argument("--reader-url", default=None, help="OpenAI-compatible base URL (env CDSJAX_READER_URL); "
                   "always wins over the local reader")
    p.add_argument("--reader-model", default=None, help="reader model name (env CDSJAX_READER_MODEL)")
    p.add_argument("--timeout", type=float, default=timeout,
                   help=f"seconds the reader may take in all, retries included (default: {timeout:g})")
    p.add_argument("--retries", type=int, default=ReaderConfig.max_retries,
                   help=f"reader retries on transient errors (default: {ReaderConfig.max_retries})")
    p.add_argument("--local-reader", default=None, metavar="MODEL",
                   help="the reader run here when no --reader-url is given (llama.cpp, `pip install "
                   "'cdsjax[reader]'`): a preset ('default': Qwen2.5-Coder-1.5B-Instruct Q4_K_M), a .gguf path "
                   "or hf:OWNER/REPO/FILE.gguf; 'off' reads nothing (env CDSJAX_LOCAL_READER)")
    p.add_argument("--reader-threads", type=int, default=LocalReaderConfig.threads,
                   help="local reader: CPU threads (default: all cores)")
    p.add_argument("--reader-ctx", type=int, default=LocalReaderConfig.ctx_per_slot,
                   help=f"local reader: context tokens per slot (default: {LocalReaderConfig.ctx_per_slot})")
    p.add_argument("--reader-slots", type=int, default=slots,
                   help=f"local reader: requests decoded at once (default: {slots})")
    p.add_argument("--evidence-tokens", type=int, default=None, metavar="N",
                   help="the evidence the reader reads, in estimated tokens: the notes fill it best first, the one "
                   "that does not fit keeps its sentences nearest the question (default: "
                   f"{LOCAL_EVIDENCE_TOKENS} for the local reader, so a warm answer takes seconds on a CPU; a "
                   "remote server's context window less the answer's room; 0: every note whole)")
    p.add_argument("--reader-images", default=ReaderConfig.images, choices=IMAGE_MODES,
                   help="visual notes as images: auto (default) until the reader refuses one, then as caption, summary and "
                   "text; on: always; off: never")

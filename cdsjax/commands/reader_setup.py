"""The reader of ``cdsjax ask``, ``serve`` and ``demo``: the OpenAI-compatible server named by ``--reader-url``
(or CDSJAX_READER_URL), else the local reader when its runtime is installed, else none."""

from __future__ import annotations

import os
import sys
from typing import Optional

from cdsjax.commands import CLIError
from cdsjax.defaults import LOCAL_EVIDENCE_TOKENS, LOCAL_MAX_TOKENS


def local_reader_model(args) -> Optional[str]:
    """The local reader's model when it should answer (no reader URL, reading not skipped, runtime installed),
    else None; one line for a local reader asked for by name whose runtime is missing."""
    url = getattr(args, "reader_url", None) or os.environ.get("CDSJAX_READER_URL")
    if getattr(args, "no_read", False) or url:
        return None
    named = getattr(args, "local_reader", None) or os.environ.get("CDSJAX_LOCAL_READER")
    if named == "off":
        return None
    from cdsjax.io.reading.local.reader import RUNTIME_HINT, runtime_installed

    if not runtime_installed():
        if named:
            raise CLIError(f"--local-reader {named}: no local reader runtime: {RUNTIME_HINT}", 1)
        return None
    return named or "default"


def make_reader(args, stack=None):
    """The reader of ``ask`` / ``serve``: the remote server named by ``--reader-url`` (or CDSJAX_READER_URL),
    else the local one, else None.

    The local server is started here, this process's own, and waited for (its model loads in ~2-5 s; a preset is
    assembled into the cdsjax cache the first time); a server that cannot start is one line (exit 1). ``stack``
    (a :class:`contextlib.ExitStack`) stops it. (``cdsjax ask`` keeps its reader warm between commands through
    the warm server instead, :mod:`cdsjax.commands.warm`.)"""
    if getattr(args, "no_read", False):
        return None
    url = args.reader_url or os.environ.get("CDSJAX_READER_URL")
    images = getattr(args, "reader_images", "auto")
    if url:
        from cdsjax.io.reading.llm.config import ReaderConfig
        from cdsjax.io.reading.reader import Reader

        model = args.reader_model or os.environ.get("CDSJAX_READER_MODEL")
        return Reader(ReaderConfig(base_url=url, model=model, timeout=args.timeout, max_retries=args.retries,
                                   images=images))
    model = local_reader_model(args)
    if model is None or stack is None:
        return None
    from cdsjax.io.reading.local.model import LocalReaderError
    from cdsjax.io.reading.local.reader import start_local_reader

    try:
        local = start_local_reader(model, threads=args.reader_threads, ctx_per_slot=args.reader_ctx,
                                   slots=args.reader_slots, progress=sys.stderr.isatty() and not getattr(args, "json", False))
    except ValueError as err:
        raise CLIError(str(err).replace("LocalReaderConfig.", "local reader: "), 2) from None
    except LocalReaderError as err:
        raise CLIError(f"local reader: {err}", 1) from None
    stack.callback(local.close)
    from cdsjax.io.reading.reader import Reader

    return Reader(local.reader_config(timeout=args.timeout, max_retries=args.retries, max_tokens=LOCAL_MAX_TOKENS,
                                      images=images), local=dict(local.describe(), reused=False))


def read_options(args, reader):
    """The :class:`cdsjax.io.reading.options.ReadOptions` of the command's flags: ``--evidence-tokens``, else the
    local reader's :data:`~cdsjax.defaults.LOCAL_EVIDENCE_TOKENS` when ``reader`` is the local one, else
    None (a remote server's budget is derived from its window); one line for a value out of range."""
    from cdsjax.io.reading.options import ReadOptions

    tokens = getattr(args, "evidence_tokens", None)
    if tokens is None and getattr(reader, "local", None) is not None:
        tokens = LOCAL_EVIDENCE_TOKENS
    try:
        return ReadOptions(evidence_tokens=tokens)
    except (TypeError, ValueError) as err:
        raise CLIError(str(err).replace("ReadOptions.evidence_tokens", "--evidence-tokens"), 2) from None

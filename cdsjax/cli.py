"""The ``cdsjax`` command: ``index``, ``ask``, ``serve``, ``demo``, ``eval``, ``tune``, ``reader``, ``data``.

:data:`COMMANDS` names each subcommand and its help text; the subcommand lives in
:mod:`cdsjax.commands` as a module with ``add_arguments(parser)`` and
``run(args)``; modules import their heavy dependencies (torch, pymupdf, ...)
inside ``run`` so ``cdsjax --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NamedTuple, Optional, Sequence

from cdsjax.commands import CLIError, printable

__all__ = ["COMMANDS", "build_parser", "entry", "main"]


class Command(NamedTuple):
    """How a subcommand shows in ``--help``: a one-line ``help``, its ``description``, and whether its
    module docstring (laid out by hand) follows the options as the epilog."""

    help: str
    description: str
    epilog_from_doc: bool = False


COMMANDS = {
    "index": Command(
        "add PDFs to an index directory; list, remove, verify",
        "Parse PDFs into elements and notes, embed them, and add them to the index in DIR (documents already there "
        "are kept; changed PDFs are re-done). Finished documents go to a shared cache first, so an interrupted run "
        "resumes."),
    "ask": Command(
        "ask a question of indexed documents or PDFs",
        "Select evidence for a question from index directories or PDFs (PDFs are indexed into a cache on first use) "
        "and, with a reader configured, answer it from that evidence.",
        epilog_from_doc=True),
    "serve": Command(
        "serve indexes over a local HTTP JSON API (warm: answers in milliseconds)",
        "Loads index directories (or PDFs) once and answers POST /ask, POST /select, GET /health and GET /documents "
        "as JSON. See `cdsjax ask --server URL`.",
        epilog_from_doc=True),
    "demo": Command(
        "a report that restates one finding: which distinct facts does each selector's evidence cover?",
        "Writes a 10-page report that restates one finding in a chart, its caption, an intro sentence and a summary "
        "beside the distinct facts a full answer needs, indexes it, asks one question and shows, per selector, the "
        "facts its top-B covers and the slots spent on restatements."),
    "eval": Command(
        "evaluate selectors on a benchmark (configs/*.py)",
        "Runs every configured selector on a benchmark, writes one JSONL record per query (resumable) and "
        "summary.csv / summary.md to the config's output_dir.",
        epilog_from_doc=True),
    "tune": Command(
        "fit the learned CDS game (selector cds-learned) on benchmark questions (configs/tune/*.py)",
        "Splits the config's benchmark questions by document, fits the learned game's parameters through the "
        "implicit derivatives of its equilibrium, and writes a parameter file with its provenance (resumable).",
        epilog_from_doc=True),
    "reader": Command(
        "the local reader kept warm between commands: status, stop",
        "Lists (status) or stops (stop) your local llama.cpp readers that stay up after a command for their "
        "keep-alive (--keep-alive), found through the cdsjax cache.",
        epilog_from_doc=True),
    "data": Command(
        "download the benchmark data (MMLongBench-Doc, MMDocIR, QASPER, HotpotQA) and lay it out as data_root",
        "Downloads the public sources the evaluation reads, checks them against recorded sizes and sha256, and "
        "lays them out as data_root expects; resumable.",
        epilog_from_doc=True),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cdsjax",
        description="Evidence selection as constrained dominant sets for question answering over long documents.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        try:
            module = importlib.import_module(f"cdsjax.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"cdsjax.commands.{name}":
                raise
            continue
        doc = command.epilog_from_doc
        p = sub.add_parser(name, help=command.help, description=command.description,
                           epilog=module.__doc__ if doc else None,
                           formatter_class=argparse.RawDescriptionHelpFormatter if doc else argparse.HelpFormatter)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    # LAPACK (the spectral penalty's eigvalsh) through OpenBLAS threads spin-waits on busy cores: a
    # 256x256 solve took 1.3 s instead of 20 ms on two loaded cores. Set before JAX loads LAPACK.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # a subcommand may take flags of its own form (eval: --config.FIELD=VALUE); anything else is an error
    prefix = getattr(args, "extra_prefix", None)
    unknown = [a for a in extra if not (prefix and a.startswith(prefix) and "=" in a)]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.extra = extra
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CLIError as err:
        print(f"cdsjax {args.command}: error: {printable(err)}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print(f"cdsjax {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `cdsjax ask ... --json | head`: the reader left, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def entry() -> None:
    """The ``cdsjax`` executable: :func:`main`, its return value the exit code. The interpreter then ends as
    usual (threads joined, exit handlers run, JAX's included)."""
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left before the last buffered output (Python's documented SIGPIPE recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    sys.exit(code)


if __name__ == "__main__":
    entry()

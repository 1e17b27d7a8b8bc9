"""The ``cdsjax`` command: ``index``, ``ask``, ``serve``, ``demo``, ``eval``.

Each subcommand lives in :mod:`cdsjax.commands` as a module with
``register(subparsers)``; modules import their heavy dependencies (torch,
pymupdf, ...) inside ``run`` so ``cdsjax --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional, Sequence

from cdsjax.commands import CLIError

__all__ = ["COMMANDS", "CLIError", "build_parser", "main"]

COMMANDS = ("index", "ask", "serve", "demo", "eval")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cdsjax",
        description="Evidence selection as constrained dominant sets for question answering over long documents.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"cdsjax.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"cdsjax.commands.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    # LAPACK (the spectral penalty's eigvalsh) through OpenBLAS threads spin-waits on busy cores: a
    # 256x256 solve took 1.3 s instead of 20 ms on two loaded cores. Set before JAX loads LAPACK.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CLIError as err:
        print(f"cdsjax {args.command}: error: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print(f"cdsjax {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `cdsjax ask ... --json | head`: the reader left, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())

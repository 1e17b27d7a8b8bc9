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

COMMANDS = ("index", "ask", "serve", "demo", "eval")


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
        print(f"cdsjax {args.command}: error: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print(f"cdsjax {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `cdsjax ask ... --json | head`: the reader left, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    # `python -m cdsjax.cli`: run the imported module's main, so CLIError raised by the
    # subcommands (which import cdsjax.cli) is the class main() catches
    from cdsjax.cli import main as _main

    sys.exit(_main())

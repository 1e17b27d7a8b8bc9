"""``cdsjax eval --config FILE``: batch retrieval evaluation (the CLI face of experiments/run_eval.py).

    cdsjax eval --config configs/hotpotqa.py --max-queries 20 --set selectors=cosine,cds

Both entry points find the benchmark data with :func:`locate_data` and say in one line where they
looked: the config's ``data_root`` (default ``../shared/data``) from the working directory, then from
the repository root, then ``$CDSJAX_DATA``.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

from cdsjax.commands import CLIError

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_candidates(data_root) -> list:
    """Where ``data_root`` may be, in order, without repeats."""
    import os

    root = Path(str(data_root)).expanduser()
    found = [root] if root.is_absolute() else [Path.cwd() / root, REPO_ROOT / root]
    if os.environ.get("CDSJAX_DATA"):
        found.append(Path(os.environ["CDSJAX_DATA"]).expanduser())
    out = []
    for c in found:
        c = Path(os.path.normpath(c.absolute()))
        if c not in out:
            out.append(c)
    return out


def locate_data(config, *, prog: str = "cdsjax eval") -> Path:
    """Resolves ``config.data_root`` in place and prints one line saying where the data is.

    Raises:
      FileNotFoundError: one line naming every place looked at and how to point at the data.
    """
    import sys

    candidates = data_candidates(config.data_root)
    for c in candidates:
        if c.is_dir():
            print(f"{prog}: benchmark data from {c} (data_root {str(config.data_root)!r})", file=sys.stderr)
            config.data_root = str(c)
            return c
    raise FileNotFoundError(
        f"benchmark data not found: data_root {str(config.data_root)!r} is not a directory (looked in "
        f"{', '.join(str(c) for c in candidates)}); set data_root (--set data_root=DIR, or "
        "--config.data_root=DIR for run_eval.py) or the environment variable CDSJAX_DATA")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate selectors on a benchmark (configs/*.py)",
        description="Runs every configured selector on a benchmark, writes one JSONL record per query "
        "(resumable) and summary.csv / summary.md to the config's output_dir.",
    )
    p.add_argument("--config", required=True, metavar="FILE", help="a config file with get_config()")
    p.add_argument("--max-queries", type=int, default=None, help="evaluate only the first N questions")
    p.add_argument("--output-dir", default=None, help="where records and summaries go")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field (dotted key; VALUE is a Python literal or a string)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def load_config(path: str):
    file = Path(path)
    if not file.is_file():
        raise CLIError(f"{file}: no such config file", 2)
    spec = importlib.util.spec_from_file_location(f"cdsjax_config_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise CLIError(f"{file}: cannot load config ({type(err).__name__}: {err})", 2) from None
    if not hasattr(module, "get_config"):
        raise CLIError(f"{file}: has no get_config()", 2)
    return module.get_config()


def apply_overrides(config, items):
    for item in items:
        if "=" not in item:
            raise CLIError(f"--set expects KEY=VALUE, got {item!r}", 2)
        key, raw = item.split("=", 1)
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        node = config
        *parents, leaf = key.split(".")
        try:
            for part in parents:
                node = node[part]
            if leaf not in node:
                raise KeyError(leaf)
            node[leaf] = value
        except (KeyError, TypeError) as err:
            raise CLIError(f"--set {key}: no such config field ({err})", 2) from None


def run(args) -> int:
    config = load_config(args.config)
    apply_overrides(config, args.set)
    if args.max_queries is not None:
        config.max_queries = args.max_queries
    if args.output_dir is not None:
        config.output_dir = args.output_dir
    from cdsjax.eval.runner import evaluate

    try:
        locate_data(config)
        evaluate(config, progress=not args.no_progress and sys.stderr.isatty())
    except (ValueError, FileNotFoundError, KeyError) as err:
        raise CLIError(str(err).strip("'\""), 1) from None
    return 0

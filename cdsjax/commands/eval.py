"""``cdsjax eval --config FILE``: batch retrieval evaluation (the CLI face of experiments/run_eval.py).

    cdsjax eval --config configs/hotpotqa.py --max-queries 20 --config.selectors=cosine,cds
    cdsjax eval --config configs/ablations/hotpotqa.py:tau

Config fields are set with ``--config.FIELD=VALUE`` (ml_collections ``config_flags``, as in
``experiments/run_eval.py``); ``FILE:ARG`` passes ARG to the file's ``get_config``.

Both entry points find the benchmark data with :func:`locate_data` and say in one line where they
looked: the config's ``data_root`` (default ``../shared/data``) from the working directory, then from
the repository root, then ``$CDSJAX_DATA``. Both keep JAX's compilation cache in the run's cache directory
(``<cache_dir>/jax-compilation``), so a rerun loads its compiled selectors instead of compiling them
(``CDSJAX_JAX_CACHE=0`` turns that off).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from cdsjax.commands import CLIError, enable_float64

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_FLAG = "config"


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
        f"{', '.join(str(c) for c in candidates)}); set data_root (--config.data_root=DIR) or the "
        "environment variable CDSJAX_DATA")


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, metavar="FILE[:ARG]",
                   help="a config file with get_config(); FILE:ARG passes ARG to get_config, e.g. "
                   "configs/ablations/hotpotqa.py:tau picks that ablation sweep")
    p.add_argument("--max-queries", type=int, default=None, help="evaluate only the first N questions")
    p.add_argument("--output-dir", default=None, help="where records and summaries go")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--fresh", action="store_true",
                   help="start the output directory over (records made with other settings are recomputed anyway)")
    p.set_defaults(extra_prefix=f"--{CONFIG_FLAG}.")


def load_config(spec: str, overrides: Sequence[str] = ()):
    """The config of ``FILE[:ARG]`` with ``--config.FIELD=VALUE`` overrides applied, read by
    ml_collections' ``config_flags`` (the parser of ``experiments/run_eval.py``).

    Raises:
      CLIError: a missing or broken file, or an override that names no field or has a bad value (one
        line, exit status 2).
    """
    from absl import flags
    from ml_collections import config_flags

    from cdsjax.config import import_config_package, unknown_field_message

    file = Path(spec.split(":", 1)[0])
    if not file.is_file():
        raise CLIError(f"{file}: no such config file", 2)
    import_config_package(file)
    argv = ["cdsjax eval", f"--{CONFIG_FLAG}={spec}", *overrides]
    values = flags.FlagValues()
    holder = config_flags.DEFINE_config_file(CONFIG_FLAG, None, "config file", flag_values=values,
                                             lock_config=True, sys_argv=argv)
    try:
        values(argv)
        config = holder.value
        config.keys()  # a file that failed to load raises here, on first use
    except (AttributeError, KeyError) as err:  # config_flags names the field it could not find
        raise CLIError(unknown_field_message(err, argv, f"--{CONFIG_FLAG}."), 2) from None
    except flags.Error as err:  # a bad override value, or get_config(ARG) failed while flags were parsed
        line = _last_line(err)
        raise CLIError(line if f"--{CONFIG_FLAG}." in line else f"{file}: cannot load config ({line})", 2) from None
    except Exception as err:  # the config module itself failed: OSError, SyntaxError, NameError, ...
        raise CLIError(f"{file}: cannot load config ({type(err).__name__}: {_last_line(err)})", 2) from None
    return config


def _last_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def run(args) -> int:
    config = load_config(args.config, args.extra)
    if args.max_queries is not None:
        config.max_queries = args.max_queries
    if args.output_dir is not None:
        config.output_dir = args.output_dir
    if config.get("dtype", None) == "float64":
        enable_float64()
    from cdsjax.eval import evaluate
    from cdsjax.eval.settings import cache_dir_of
    from cdsjax.io.compilation_cache import enable_compilation_cache

    try:
        locate_data(config)
        enable_compilation_cache(cache_dir_of(config) / "jax-compilation")  # a rerun loads its executables
        evaluate(config, progress=not args.no_progress and sys.stderr.isatty(), fresh=args.fresh)
    except (ValueError, FileNotFoundError, KeyError) as err:
        raise CLIError(str(err).strip("'\""), 1) from None
    return 0

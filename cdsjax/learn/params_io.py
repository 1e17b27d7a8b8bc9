"""The learned game's parameter file: one JSON object with the parameters and their provenance.

The reader lives in :mod:`cdsjax.core.learned` (the ``cds-learned`` selector reads the file when it is built);
this module adds the writer.
"""

from __future__ import annotations

import json
import pathlib
from typing import Tuple, Union

from cdsjax.core.learned import DEFAULT_PARAMS, PARAMS_FORMAT as FORMAT, PARAMS_VERSION as VERSION, LearnedParams, \
    read_params

__all__ = ["DEFAULT_PARAMS", "FORMAT", "VERSION", "load_params", "save_params"]


def save_params(path: Union[str, pathlib.Path], theta: LearnedParams, provenance: dict) -> pathlib.Path:
    """Writes ``{"format", "version", "theta", "provenance"}`` to ``path`` (atomically); returns the path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"format": FORMAT, "version": VERSION, "theta": theta.to_dict(), "provenance": provenance}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=1, default=_plain) + "\n")
    tmp.replace(path)
    return path


def _plain(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def load_params(path: Union[str, pathlib.Path, None] = None) -> Tuple[LearnedParams, dict]:
    """``(theta, provenance)`` from a parameter file (the shipped default when ``path`` is None).

    Raises:
      ValueError: one line naming the file, when it is missing, not JSON, or not a parameter file.
    """
    return read_params(path)

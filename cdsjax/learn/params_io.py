"""The learned game's parameter file: one JSON object with the parameters and their provenance."""

from __future__ import annotations

import json
import pathlib
from typing import Tuple, Union

from cdsjax.core.learned import LearnedParams

FORMAT = "cdsjax-learned-params"
VERSION = 1
DEFAULT_PARAMS = pathlib.Path(__file__).with_name("default_params.json")


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
    path = DEFAULT_PARAMS if path is None else pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"learned parameter file {str(path)!r} does not exist")
    try:
        body = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"learned parameter file {str(path)!r} is not valid JSON ({e.__class__.__name__})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT or not isinstance(body.get("theta"), dict):
        raise ValueError(f"{str(path)!r} is not a learned parameter file "
                         f"(expected a JSON object with format {FORMAT!r} and a 'theta' object)")
    if body.get("version") != VERSION:
        raise ValueError(f"learned parameter file {str(path)!r} has version {body.get('version')!r}; "
                         f"this cdsjax reads version {VERSION}")
    try:
        theta = LearnedParams.from_dict(body["theta"])
    except ValueError as e:
        raise ValueError(f"learned parameter file {str(path)!r}: {e}") from None
    provenance = body.get("provenance") if isinstance(body.get("provenance"), dict) else {}
    return theta, provenance

"""The learned game's parameter file: one JSON object with the parameters and their provenance.

The one place a parameter file is read or written (the core receives :class:`LearnedParams` values).
:func:`default_params` reads a fit shipped with the package once per process, one per read-out the learned
selectors are fitted through (``SelectorSpec.readout``: ``cds_learned`` its top-B, ``cds_learned_pages`` one note
per page); :func:`resolve_params` turns what a user gives (a path, a value, nothing) into a value;
:func:`params_hash` names a value by a hash of its content (an evaluation run's identity holds it, never a path).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Tuple, Union

from cdsjax.core.games.learned import LearnedParams
from cdsjax.memo import PROCESS

__all__ = ["DEFAULT_PARAMS", "DEFAULT_PARAMS_FILES", "FORMAT", "VERSION", "default_params", "default_params_file",
           "load_params", "params_hash", "resolve_params", "save_params"]

FORMAT = "cdsjax-learned-params"
VERSION = 1
# The fits the package ships, by the read-out they were fitted through (configs/tune/dev.py; SelectorSpec.readout):
# "top" is the default of cds-learned, "pages" of cds-learned-pages.
DEFAULT_PARAMS = pathlib.Path(__file__).resolve().parent / "default_params.json"
DEFAULT_PARAMS_FILES = {"top": DEFAULT_PARAMS, "pages": DEFAULT_PARAMS.with_name("default_params_pages.json")}


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
    """``(theta, provenance)`` of a parameter file (:data:`DEFAULT_PARAMS`, the shipped fit, when ``path`` is None).

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


def default_params_file(readout: str = "top") -> pathlib.Path:
    """The shipped fit of the read-out ``readout`` (a key of :data:`DEFAULT_PARAMS_FILES`)."""
    if readout not in DEFAULT_PARAMS_FILES:
        raise ValueError(f"no shipped fit for read-out {readout!r}; shipped: {sorted(DEFAULT_PARAMS_FILES)}")
    return DEFAULT_PARAMS_FILES[readout]


def default_params(readout: str = "top") -> LearnedParams:
    """The shipped fit of the read-out ``readout`` (``"top"``: :data:`DEFAULT_PARAMS`), read once per process."""
    path = default_params_file(readout)
    return PROCESS.shipped_params.get(path, lambda: load_params(path)[0])


def resolve_params(params: Union[str, pathlib.Path, LearnedParams, None] = None,
                   readout: str = "top") -> LearnedParams:
    """The :class:`LearnedParams` value of what a user gives: itself, a parameter file's (read now), or for None or
    ``""`` the shipped fit of ``readout`` (the selector's ``SelectorSpec.readout``).

    Raises:
      ValueError: a file that cannot be read (one line), or a value of another type.
    """
    if isinstance(params, LearnedParams):
        return params
    if params is None or params == "":
        return default_params(readout)
    if isinstance(params, (str, pathlib.Path)):
        return load_params(params)[0]
    raise ValueError(f"params must be a parameter file path or LearnedParams, got {type(params).__name__}")


def params_hash(theta: LearnedParams) -> str:
    """A short content hash of a parameter value (equal parameters, equal hash; no path involved): a hash of
    :meth:`LearnedParams.content_key`'s values."""
    kind, values = theta.content_key()
    body = json.dumps(dict(values), sort_keys=True).encode()
    return f"{kind}:" + hashlib.sha256(body).hexdigest()[:16]

"""Where a number came from: the code version, the library versions, the device and the resolved config, in one
dictionary that every output holding a measured figure records (an evaluation's ``run.json`` and summaries, the
sensitivity study's ``summary.json``, the learned game's parameter file, the tables the experiment scripts write).
"""

from __future__ import annotations

import datetime
import functools
import json
import pathlib
import subprocess
from typing import Any, Optional

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARIES = ("cdsjax", "jax", "jaxlib", "numpy")


@functools.lru_cache(maxsize=1)
def commit() -> Optional[str]:
    """``git describe --always --dirty`` of the source tree this package runs from (``"e0e6eb5-dirty"``), None
    where it is not a git checkout (an installed wheel). Read once per process."""
    if not (REPO_ROOT / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def code_version() -> str:
    """``git <commit>`` (:func:`commit`), else ``cdsjax <installed version>``, else ``"unknown"``."""
    if commit():
        return f"git {commit()}"
    version = library_versions()["cdsjax"]
    return f"cdsjax {version}" if version else "unknown"


def library_versions() -> dict:
    """``{"cdsjax", "jax", "jaxlib", "numpy"}`` -> installed version (None where one is not installed)."""
    from importlib import metadata

    out = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def device() -> str:
    """The JAX backend and its first device's kind (``"cpu: cpu"``, ``"gpu: NVIDIA H100"``); starts JAX's backend."""
    import jax

    devices = jax.devices()
    return f"{jax.default_backend()}: {devices[0].device_kind} x{len(devices)}"


def plain(config: Any) -> Any:
    """A config (a ConfigDict, a mapping, or None) as plain JSON-able values."""
    if config is None:
        return None
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    return json.loads(json.dumps(config, default=str))


def provenance(config: Any = None, **extra) -> dict:
    """``{"commit", "code", "versions", "device", "created", "config", ...extra}``: what a file of results records
    about where its numbers came from. ``commit`` is the git commit (None outside a checkout), ``code`` that or the
    installed version (:func:`code_version`), ``versions`` cdsjax's, jax's, jaxlib's and numpy's; ``config`` the
    resolved config (a ConfigDict or mapping; None: not recorded)."""
    out = {"commit": commit(), "code": code_version(), "versions": library_versions(), "device": device(),
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if config is not None:
        out["config"] = plain(config)
    out.update(extra)
    return out


def provenance_line(prov: Optional[dict]) -> str:
    """One markdown line naming the code, library versions and device of ``prov`` (:func:`provenance`)."""
    if not prov:
        return ""
    versions = ", ".join(f"{k} {v}" for k, v in prov.get("versions", {}).items())
    return f"_{prov.get('code')}; {versions}; device {prov.get('device')}; {prov.get('created')}_\n"

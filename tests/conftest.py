"""Test configuration: float64 for reference comparisons, paths to the shared data."""

import os
import pathlib

# LAPACK through OpenBLAS threads spin-waits on oversubscribed cores (a 258x258 solve
# took ~400 ms instead of ~1 ms here); one thread per process is faster on 2 cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax
import pytest

jax.config.update("jax_enable_x64", True)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("CDSJAX_SHARED", ROOT.parent / "shared"))
DATA = SHARED / "data"


@pytest.fixture(scope="session")
def data_root() -> pathlib.Path:
    if not DATA.is_dir():
        pytest.skip(f"shared data not found at {DATA}")
    return DATA

"""Test configuration: the ``x64`` marker, paths to the shared data, the demo index.

The suite runs with JAX's defaults (``jax_enable_x64`` off), as the pipeline does. A test that compares against
a float64 reference at tight tolerances opts in with ``@pytest.mark.x64`` (or ``pytestmark = pytest.mark.x64``
for a module): it then runs inside ``jax.enable_x64(True)``, a context that ends with the test.
"""

import contextlib
import io
import json
import os
import pathlib

# LAPACK through OpenBLAS threads spin-waits on oversubscribed cores (a 258x258 solve
# took ~400 ms instead of ~1 ms here); one thread per process is faster on 2 cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("CDSJAX_SHARED", ROOT.parent / "shared"))
DATA = SHARED / "data"


@pytest.fixture(autouse=True)
def _x64(request):
    """Runs ``x64`` tests inside ``jax.enable_x64(True)``; every test ends with x64 as it began."""
    before = jax.config.jax_enable_x64
    try:
        if request.node.get_closest_marker("x64") is None:
            yield
        else:
            with jax.enable_x64(True):
                yield
    finally:
        if jax.config.jax_enable_x64 != before:  # an entry point called in-process switched it globally
            jax.config.update("jax_enable_x64", before)


@pytest.fixture(scope="session")
def data_root() -> pathlib.Path:
    if not DATA.is_dir():
        pytest.skip(f"shared data not found at {DATA}")
    return DATA


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """`cdsjax demo --json` run once for the session (it writes and indexes the report): (dir, output)."""
    from cdsjax import cli

    root = tmp_path_factory.mktemp("demo")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as mp:
        mp.setenv("CDSJAX_CACHE", str(root / "cache"))  # JAX's compilation cache goes here, not to ~/.cache
        code = cli.main(["demo", "--dir", str(root), "--json"])
    assert code == 0
    return root, json.loads(out.getvalue())

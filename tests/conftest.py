"""Test configuration: the ``x64`` marker, the benchmark data (``needs_data``), the demo index, the system tools.

The suite runs with JAX's defaults (``jax_enable_x64`` off), as the pipeline does. A test that compares against
a float64 reference at tight tolerances opts in with ``@pytest.mark.x64`` (or ``pytestmark = pytest.mark.x64``
for a module): it then runs inside ``jax.enable_x64(True)``, a context that ends with the test.

A test that reads the benchmark data (``../shared/data`` or ``$CDSJAX_DATA``) takes the ``data_root`` fixture or
carries ``@pytest.mark.needs_data`` (``pytestmark = pytest.mark.needs_data`` for a module); either marks it.
Without the data such a test skips with the reason, and the run ends with one line counting them and saying how
to get the data; under ``CI=true`` (CI always has the data) it fails instead, in one line.
"""

import json
import os
import pathlib
import shutil
from typing import Callable, Optional

# LAPACK through OpenBLAS threads spin-waits on oversubscribed cores (a 258x258 solve
# took ~400 ms instead of ~1 ms here); one thread per process is faster on 2 cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("CDSJAX_SHARED", ROOT.parent / "shared"))
# The benchmark data: $CDSJAX_DATA when set (as for `cdsjax eval`), else ../shared/data next to the repository.
DATA = pathlib.Path(os.environ.get("CDSJAX_DATA") or SHARED / "data")

# CI runs with CI=true: there a documented tool that is missing fails its tests instead of skipping them.
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

# Whether the benchmark data is there decides which tests run and which coverage floor `make test` uses (the
# Makefile looks at the same directory).
HAVE_DATA = DATA.is_dir()
NO_DATA = f"benchmark data not found at {DATA}"
GET_DATA = ("`cdsjax data fetch` downloads it to ../shared/data beside the repository (or `--to DIR` and "
            "CDSJAX_DATA=DIR; README: Data)")
_data_misses = {"skipped": 0, "failed": 0}

# The system tools the documented features use: the executable's names and the Debian package `make` installs.
TOOLS = {
    "chromium": (("chromium", "chromium-browser"), "chromium"),  # headless, for the web page's test
    "tesseract": (("tesseract",), "tesseract-ocr"),  # OCR of scanned pages (cdsjax.io.parse)
}


@pytest.fixture(scope="session", autouse=True)
def _persistent_cache_for_the_session(tmp_path_factory):
    """JAX's persistent compilation cache on from a worker's first test, in one directory the session's
    workers share (never reused by a later run), so a program compiled once (many tests build the same
    selector afresh) is read back instead of compiled again. Commands run inside a test process
    (``cli.main(["ask", ...])``) then leave JAX's setting alone: JAX keeps the first cache directory a
    process sets. The tests of the cache itself run commands in subprocesses, which turn it on as users get
    it. The commands a test runs in subprocesses (``cdsjax index``, ``eval``, ``serve``, ...) read and write the
    same directory (``CDSJAX_JAX_CACHE``), so a program one of them compiled is not compiled again by the next;
    the tests of where a command puts its cache remove that variable from their command's environment.

    The directory has no size cap (``CDSJAX_JAX_CACHE_MAX_MB=-1``, for the subprocesses too): with a cap, JAX
    lists the whole directory and reads every entry's access time at each write, so each compilation would
    slow down as the suite's hundreds of entries accumulate. The tests of the cap set it themselves."""
    from cdsjax.io import compilation_cache

    base = tmp_path_factory.getbasetemp()  # under xdist, each worker's own folder in the session's
    directory = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax-compilation-cache"
    with pytest.MonkeyPatch.context() as mp:
        # no test reads with the local llama.cpp reader unless it asks for it (the local_model fixture)
        mp.setenv("CDSJAX_LOCAL_READER", "off")
        # `cdsjax ask` in a test loads and reads in its own process (keep-alive 0: no warm server is started);
        # the tests of the warm server set their own keep-alive, and a directory of their own
        mp.setenv("CDSJAX_READER_KEEP_ALIVE", "0")
        mp.setenv("CDSJAX_RUNTIME_DIR", str(base / "warm"))
        mp.setenv("CDSJAX_JAX_CACHE_MAX_MB", "-1")
        compilation_cache.enable_compilation_cache(directory)
        mp.setenv("CDSJAX_JAX_CACHE", str(directory))
        mp.setattr(compilation_cache, "enable_compilation_cache", lambda directory=None: None)
        yield


MAPS_RELEASE_AT = 20_000  # a test worker's memory mappings at which the executables it keeps are dropped


def _memory_maps() -> int:
    from cdsjax.eval.run import memory_maps

    return memory_maps()


@pytest.fixture(autouse=True)
def _keep_memory_maps_in_bounds():
    """After a test, drops JAX's caches of executables (:func:`cdsjax.eval.run.clear_jax_caches`; a run's own
    :class:`~cdsjax.eval.run.Executables` go with the run) once the worker's memory mappings pass
    :data:`MAPS_RELEASE_AT`. A worker that has loaded thousands of executables reaches
    Linux's ``vm.max_map_count`` (65,530 by default), and XLA then aborts while compiling or serializing the
    next one: the intermittent crashes of full runs (stops 41 and 42), always late in a worker."""
    yield
    if _memory_maps() > MAPS_RELEASE_AT:
        from cdsjax.eval.run import clear_jax_caches

        clear_jax_caches()


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


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """The default index configuration, quiet, with a shared document cache of the test module's own (the index
    tests: test_store, test_untrusted_index)."""
    from cdsjax.io.index import default_config

    cfg = default_config()
    cfg.embedder.show_progress = False
    cfg.index.cache_dir = str(tmp_path_factory.mktemp("cache"))
    return cfg


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """An evaluation's cache directory (embeddings, indexes), one per test module (test_run_eval,
    test_eval_reader)."""
    return tmp_path_factory.mktemp("eval_cache")


@pytest.fixture(scope="session")
def data_root() -> pathlib.Path:
    """The benchmark data directory; a test (or fixture) that takes it is marked ``needs_data``."""
    _require_data()
    return DATA


def _require_data() -> None:
    if not HAVE_DATA:
        if IN_CI:
            pytest.fail(f"{NO_DATA}; CI=true needs it: {GET_DATA}", pytrace=False)
        pytest.skip(NO_DATA)


@pytest.fixture(scope="session")
def local_model() -> pathlib.Path:
    """The local reader's default model file (``make`` assembles it into the cdsjax cache); a test that takes it
    runs the real llama.cpp reader. Skips without the runtime or the model, and fails under CI=true, where
    ``make test`` installs both."""
    from cdsjax.io.reading.local import model as M
    from cdsjax.io.reading.local import reader as L

    preset = M.PRESETS[M.DEFAULT_PRESET]
    if not L.runtime_installed() or not M.is_assembled(preset, M.model_path(preset)):
        why = "the local reader (pip install 'cdsjax[reader]'; python -m cdsjax.io.reading.local.reader fetch) is not set up"
        if IN_CI:
            pytest.fail(f"{why}; `make test` sets it up", pytrace=False)
        pytest.skip(why)
    return M.model_path(preset)


@pytest.fixture
def with_local_reader(local_model, monkeypatch):
    """The local reader on for this test's commands (the suite turns it off): CDSJAX_LOCAL_READER unset."""
    monkeypatch.delenv("CDSJAX_LOCAL_READER", raising=False)
    monkeypatch.delenv("CDSJAX_READER_URL", raising=False)
    return local_model


def pytest_configure(config):
    config.addinivalue_line("markers", "local_reader: runs the real local llama.cpp reader (tests/conftest.py "
                            "local_model); a few stay in the default run")
    config.addinivalue_line("markers", "needs_data: reads the benchmark data (../shared/data or $CDSJAX_DATA); "
                            "skips without it, fails without it under CI=true (tests/conftest.py)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "data_root" in item.fixturenames and item.get_closest_marker("needs_data") is None:
            item.add_marker(pytest.mark.needs_data)
        if not HAVE_DATA and not IN_CI and item.get_closest_marker("needs_data") is not None:
            item.add_marker(pytest.mark.skip(reason=NO_DATA))  # listed by -rs with the test's own location


def pytest_runtest_setup(item):
    if item.get_closest_marker("needs_data") is not None:
        _require_data()  # under CI=true: one line, a failure


def pytest_runtest_logreport(report):
    # in the xdist controller this sees every worker's reports, so the count covers the whole run
    if report.when == "setup" and NO_DATA in str(report.longrepr):
        if report.skipped:
            _data_misses["skipped"] += 1
        elif report.failed:
            _data_misses["failed"] += 1


def pytest_unconfigure(config):
    """The run's last line: how many tests the missing data skipped (or failed, under CI=true), and how to get it."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    skipped, failed = _data_misses["skipped"], _data_misses["failed"]
    if reporter is not None and (skipped or failed):
        what = f"{skipped} tests skipped" if skipped else f"{failed} tests failed (CI=true)"
        reporter.write_line(f"{what} for lack of the benchmark data ({NO_DATA}): {GET_DATA}")


def run_command(root, *argv, timeout=600):
    """``python -m cdsjax.cli ARGV`` in its own process with ``CDSJAX_CACHE=root/cache``: (exit code, stdout,
    stderr), as users run the command. ``cdsjax demo`` runs here: it compiles every selector of its table,
    which in a long-lived test worker only adds to the executables the worker keeps (see
    :func:`_keep_memory_maps_in_bounds`)."""
    import subprocess
    import sys

    env = dict(os.environ, CDSJAX_CACHE=str(root / "cache"), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "cdsjax.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """`cdsjax demo --json` run once for the session in its own process (it writes and indexes the report):
    (dir, output)."""
    root = tmp_path_factory.mktemp("demo")
    code, out, err = run_command(root, "demo", "--dir", str(root), "--json")
    assert code == 0, err[-2000:]
    return root, json.loads(out)


def clustered_notes(rng, n: int, size: int, d: int = 48, clusters: int = 6):
    """Unit vectors drawn around a few topic centres (a corpus of a few topics), rows ``n:`` zero (padding);
    float64, drawn from ``rng`` so a caller continues the same stream for its questions."""
    import numpy as np

    centers = rng.normal(size=(clusters, d))
    z = centers[rng.integers(0, clusters, size)] + 1.2 * rng.normal(size=(size, d))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    z[n:] = 0.0
    return z


def find_tool(name: str) -> Optional[str]:
    """The executable of a documented tool: ``$CDSJAX_<NAME>`` when set (a path; one that does not exist
    hides the tool, e.g. ``CDSJAX_CHROMIUM=/nonexistent``), else the first of its names on ``PATH``."""
    override = os.environ.get(f"CDSJAX_{name.upper()}")
    if override is not None:
        return override if os.path.isfile(override) and os.access(override, os.X_OK) else None
    names, _ = TOOLS[name]
    return next((path for path in map(shutil.which, names) if path), None)


def require_module(name: str):
    """The optional package a test needs (an extra or dev dependency `make` installs), imported; when it is
    missing the test fails under ``CI=true`` and skips elsewhere, in one line."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as err:
        line = f"{name} is not installed ({err}); `make` installs the extras of pyproject.toml"
        if IN_CI:
            pytest.fail(f"{line}; CI=true needs it", pytrace=False)
        pytest.skip(line, allow_module_level=True)


def require_modules(*names: str) -> None:
    """:func:`require_module` for each name, at a test module's top (under ``CI=true`` a missing package
    is then a collection error that stops the run, with its one line)."""
    for name in names:
        require_module(name)


def require_tool(name: str, usable: Optional[Callable[[], bool]] = None) -> str:
    """The path of a documented system tool, for a test that needs it.

    When the tool is missing (or ``usable()`` says it cannot be used), the test fails under ``CI=true``
    (the run must show that a documented feature went untested) and skips elsewhere, in one line that
    names the package ``make`` installs.
    """
    path = find_tool(name)
    if path is not None and (usable is None or usable()):
        return path
    _, package = TOOLS[name]
    what = f"{name} is not installed" if path is None else f"{name} at {path} cannot be used"
    line = f"{what} (Debian package {package}; `make` installs it as root where apt works)"
    if IN_CI:
        pytest.fail(f"{line}; CI=true needs it", pytrace=False)
    pytest.skip(line)


def on_arrays(fn: Callable) -> Callable:
    """A registry selector ``fn(problem, key)`` called the array way ``(notes, query, valid, links, key, **structure)``
    (jit- and vmap-able), for tests that build their inputs as arrays."""
    from cdsjax.core import CDSProblem

    def call(notes, query, valid=None, links=None, key=None, **structure):
        return fn(CDSProblem.create(notes, query, valid, links=links, **structure), key)

    return call

"""tests/conftest.py: the suite's JAX precision (float32 by default, float64 only under ``x64``), the system
tools, and the benchmark data (``data_root`` / ``needs_data``: skip without it, fail without it under CI=true)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def test_default_is_float32_like_the_pipeline():
    assert not jax.config.jax_enable_x64
    assert jnp.asarray(np.zeros(2)).dtype == jnp.float32


@pytest.mark.x64
def test_x64_marker_gives_float64():
    assert jnp.asarray(np.zeros(2)).dtype == jnp.float64
    assert jax.jit(lambda x: x * 2)(np.ones(2)).dtype == jnp.float64


def test_a_global_switch_inside_a_test_is_undone():
    jax.config.update("jax_enable_x64", True)  # as an entry point called in-process would
    assert jnp.asarray(np.zeros(2)).dtype == jnp.float64


def test_after_a_global_switch_the_default_is_back():
    test_default_is_float32_like_the_pipeline()


def test_a_missing_documented_tool_fails_under_ci_and_skips_elsewhere(monkeypatch, tmp_path):
    from tests import conftest

    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CDSJAX_CHROMIUM", str(fake))
    assert conftest.require_tool("chromium") == str(fake)  # the override wins over PATH
    monkeypatch.setenv("CDSJAX_CHROMIUM", str(tmp_path / "nonexistent"))
    for in_ci, outcome in ((True, pytest.fail.Exception), (False, pytest.skip.Exception)):
        monkeypatch.setattr(conftest, "IN_CI", in_ci)
        with pytest.raises(outcome) as info:
            conftest.require_tool("chromium")
        line = str(info.value)
        assert "chromium is not installed (Debian package chromium" in line and "\n" not in line
        assert ("CI=true needs it" in line) == in_ci
        with pytest.raises(outcome, match="no_such_module_i29 is not installed"):
            conftest.require_module("no_such_module_i29")
    monkeypatch.setattr(conftest, "IN_CI", True)
    monkeypatch.setenv("CDSJAX_TESSERACT", str(fake))  # there, but without its language data, say
    with pytest.raises(pytest.fail.Exception, match=f"tesseract at {fake} cannot be used"):
        conftest.require_tool("tesseract", usable=lambda: False)


def test_data_root_probe(data_root):
    assert data_root.is_dir()  # a data test (the fixture marks it): the test below runs it without the data


@pytest.mark.needs_data
def test_needs_data_probe():
    from tests.conftest import DATA

    assert DATA.is_dir()


@pytest.mark.parametrize("ci", ["", "true"])
def test_without_the_data_its_tests_skip_with_one_closing_line_and_fail_under_ci(tmp_path, ci):
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("CDSJAX_DATA", "PYTEST_ADDOPTS")}
    env.update(CDSJAX_SHARED=str(tmp_path / "none"), CI=ci)
    probes = [f"tests/test_conftest.py::{name}" for name in ("test_data_root_probe", "test_needs_data_probe")]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-rfEs", *probes], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    last = proc.stdout.strip().splitlines()[-1]
    where = tmp_path / "none" / "data"
    if not ci:
        assert proc.returncode == 0 and "2 skipped" in proc.stdout, proc.stdout[-2000:]
        assert f"benchmark data not found at {where}" in proc.stdout  # each skip's reason (-rs)
        assert last.startswith("2 tests skipped for lack of the benchmark data") and "cdsjax data fetch" in last
    else:
        assert proc.returncode == 1 and "CI=true needs it" in proc.stdout, proc.stdout[-2000:]
        assert last.startswith("2 tests failed (CI=true) for lack of the benchmark data")

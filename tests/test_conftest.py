"""The suite's JAX precision (tests/conftest.py): float32 by default, float64 only under ``x64``."""

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

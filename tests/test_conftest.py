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

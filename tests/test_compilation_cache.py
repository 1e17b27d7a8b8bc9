"""JAX's persistent compilation cache as the commands turn it on (cdsjax.io.compilation_cache): its size cap is
JAX's own ``jax_compilation_cache_max_size``."""

import json
import os
import subprocess
import sys

import pytest

from cdsjax.io import compilation_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cache_max_bytes_reads_megabytes():
    assert compilation_cache.cache_max_bytes(None) == compilation_cache.DEFAULT_JAX_CACHE_MAX_MB * 2**20
    assert compilation_cache.cache_max_bytes("") == compilation_cache.DEFAULT_JAX_CACHE_MAX_MB * 2**20
    assert compilation_cache.cache_max_bytes("0.5") == 2**19
    assert compilation_cache.cache_max_bytes("0") == 0
    assert compilation_cache.cache_max_bytes("-1") == -1 and compilation_cache.cache_max_bytes("-3") == -1
    for bad in ("lots", "nan"):
        with pytest.raises(ValueError):
            compilation_cache.cache_max_bytes(bad)


def test_undated_entries_get_an_access_time(tmp_path):
    (tmp_path / "old-cache").write_bytes(b"x" * 10)
    (tmp_path / "new-cache").write_bytes(b"y")
    (tmp_path / "new-atime").write_bytes((7).to_bytes(8, "little"))
    compilation_cache._date_undated_entries(tmp_path)
    assert int.from_bytes((tmp_path / "old-atime").read_bytes(), "little") == (tmp_path / "old-cache").stat().st_mtime_ns
    assert int.from_bytes((tmp_path / "new-atime").read_bytes(), "little") == 7  # left alone


SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp
from cdsjax.io.compilation_cache import enable_compilation_cache
directory = enable_compilation_cache(sys.argv[1]).directory
for k in range(6):  # six programs (new ones for each argv[2]), each its own cache entry
    jax.jit(lambda x, k=k: jnp.sin(x) * k + jnp.cos(x * k))(jnp.ones(5 + k + int(sys.argv[2]))).block_until_ready()
print(json.dumps(dict(directory=str(directory), max_size=jax.config.jax_compilation_cache_max_size)))
"""


def run_script(directory, max_mb, shapes):
    env = dict(os.environ, PYTHONPATH=ROOT, CDSJAX_JAX_CACHE_MAX_MB=max_mb, JAX_PLATFORMS="cpu")
    env.pop("CDSJAX_JAX_CACHE", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(directory), str(shapes)], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    assert "Error writing persistent compilation cache entry" not in out.stderr, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def entries(directory):
    return {p.name: p.stat().st_size for p in directory.glob("*-cache")}


@pytest.mark.slow
def test_the_cap_is_jax_own_and_jax_evicts(tmp_path):
    directory = tmp_path / "jax"
    directory.mkdir()
    (directory / "undated-cache").write_bytes(b"z" * 100)  # written by JAX without a cap: no access time
    uncapped = run_script(directory, "-1", 0)
    assert uncapped["max_size"] == -1
    sizes = entries(directory)
    assert len(sizes) > 6 and not (directory / "undated-atime").exists()
    total = sum(sizes.values())
    cap_mb = total / 2**20  # room for what is there, not for six more
    capped = run_script(directory, repr(cap_mb), 100)  # new programs: JAX evicts as it writes them
    assert capped["directory"] == str(directory) and capped["max_size"] == int(cap_mb * 2**20)
    kept = entries(directory)
    assert 0 < sum(kept.values()) <= capped["max_size"] and set(kept) - set(sizes)  # the new ones written
    assert "undated-cache" not in kept  # the oldest (dated by its modification time): evicted first

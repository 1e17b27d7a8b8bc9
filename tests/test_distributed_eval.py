"""run_eval.py --processes N: processes joined by jax.distributed give the records and summary.csv of one
process; a process killed midway (kill -9) ends the run with one line, and the next run, started by hand with
JAX's environment variables instead of flags, resumes to the same summary; a partial cluster setting is one
line."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdsjax.eval import distributed
from cdsjax.io.util import pid_alive
from cdsjax.io.util import free_port
from tests.conftest import DATA, ROOT

QUERIES = 10
RECORDS = QUERIES * 3 * 2  # cosine, mmr, cds at budgets 2 and 3 (configs/hotpotqa.py)


def _args(out: Path, cache: Path):
    return [sys.executable, str(ROOT / "experiments" / "run_eval.py"), "--config", str(ROOT / "configs" / "hotpotqa.py"),
            f"--config.max_queries={QUERIES}", "--config.selectors=cosine,mmr,cds", f"--config.output_dir={out}",
            f"--config.cache_dir={cache}", "--config.num_resamples=200", f"--config.data_root={DATA}",
            "--config.max_batch=4", "--noprogress"]  # several chunks, so both processes get questions


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
    for name in ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        if name not in extra:
            env.pop(name, None)
    return env


def _records(out: Path):
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    return {(r["selector"], r["budget"], r["qid"]): r for r in rows}


@pytest.fixture(scope="module")
def single(data_root, tmp_path_factory):
    """One process's run; it fills the cache (question and paragraph vectors, compiled selectors) the other
    runs of this file read, so they start in seconds."""
    base = tmp_path_factory.mktemp("dist")
    out = base / "one"
    subprocess.run(_args(out, base / "cache"), env=_env(), check=True, capture_output=True, timeout=600)
    return base, out


@pytest.mark.slow
def test_two_processes_equal_one(single):
    base, one = single
    two = base / "two"
    proc = subprocess.run(_args(two, base / "cache") + ["--processes", "2"], env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not list(two.glob("records.*-of-*.jsonl")), "process 0 merges the shards"
    a, b = _records(one), _records(two)
    assert len(a) == RECORDS and a.keys() == b.keys()
    assert all(a[k] == b[k] for k in a), "record for record"
    assert (one / "summary.csv").read_bytes() == (two / "summary.csv").read_bytes()


def _child(pid: int, process_id: int, timeout: float = 120.0) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for child in (Path(f"/proc/{pid}/task/{pid}/children").read_text().split()):
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if f"--process_id={process_id}".encode() in cmd:
                return int(child)
        time.sleep(0.05)
    raise AssertionError("no such child process")


def test_killed_process_resumes_with_jax_environment_variables(single):
    base, one = single
    out = base / "killed"
    # the vectors are cached, the compiled selectors are not: each selector compiles between its records and
    # the next selector's, so the kill lands while the victim still has records to write
    cache = base / "cache-killed"
    shutil.copytree(base / "cache", cache, ignore=shutil.ignore_patterns("jax-compilation"))
    args = _args(out, cache)
    launcher = subprocess.Popen(args + ["--processes", "2"], env=_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    victim = _child(launcher.pid, 1)
    shard = out / "records.001-of-002.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (shard.is_file() and shard.read_text().count("\n") >= 1):
        time.sleep(0.01)
    os.kill(victim, signal.SIGKILL)  # midway: some of its records are on disk, not all
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode != 0
    lines = [line for line in err.splitlines() if line.startswith("run_eval: error:")]
    assert len(lines) == 1 and "process 1 of 2 failed" in lines[0] and "resumes" in lines[0], err[-2000:]
    assert not (out / "summary.csv").exists()
    done = shard.read_text().count("\n")
    assert 1 <= done < RECORDS // 2, done

    # The same run as a cluster would start it: one command per process, JAX_COORDINATOR_ADDRESS,
    # JAX_NUM_PROCESSES and JAX_PROCESS_ID instead of --coordinator, --num_processes and --process_id.
    port = free_port()
    procs = [subprocess.Popen(args, env=_env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                             JAX_PROCESS_ID=str(i), JAX_PLATFORMS="cpu"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (o, e) in zip(procs, results):
        assert p.returncode == 0, e[-2000:]
    assert "resuming" in "".join(o + e for o, e in results)
    assert (out / "summary.csv").read_bytes() == (one / "summary.csv").read_bytes()
    assert _records(out).keys() == _records(one).keys()
    assert not list(out.glob("records.*-of-*.jsonl"))


@pytest.mark.slow
def test_a_partial_cluster_setting_is_one_line(data_root, tmp_path):
    """A process given some of the three settings (here only JAX_COORDINATOR_ADDRESS) stops before it
    loads anything, naming all three."""
    proc = subprocess.run(_args(tmp_path / "out", tmp_path / "cache"), capture_output=True, text=True, timeout=300,
                          env=_env(JAX_COORDINATOR_ADDRESS="127.0.0.1:1"))
    lines = [line for line in proc.stderr.splitlines() if "error" in line or "Traceback" in line]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("run_eval: error: a multi-process run needs all of --coordinator HOST:PORT")
    assert "JAX_NUM_PROCESSES" in lines[0] and not (tmp_path / "out" / "records.jsonl").exists()


def test_cluster_settings_from_flags_and_environment(monkeypatch):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.settings(None, None, None) is None  # a plain single-process run
    assert distributed.settings("h:1", 4, 3) == ("h:1", 4, 3)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "3")
    monkeypatch.setenv("JAX_PROCESS_ID", "2")
    assert distributed.settings(None, None, None) == ("10.0.0.1:1234", 3, 2)
    assert distributed.settings("h:9", 4, 0) == ("h:9", 4, 0)  # flags win over the environment
    assert distributed.initialize(*distributed.settings(None, None, None)) == distributed.Process(2, 3, "10.0.0.1:1234")
    monkeypatch.delenv("JAX_PROCESS_ID")
    with pytest.raises(ValueError, match="needs all of --coordinator HOST:PORT, --num_processes N and --process_id I"):
        distributed.settings(None, None, None)
    assert distributed.settings(None, None, 1) == ("10.0.0.1:1234", 3, 1)  # the missing one as a flag
    with pytest.raises(ValueError, match=r"--process_id must be in \[0, 3\), got 3"):
        distributed.settings(None, None, 3)
    monkeypatch.setenv("JAX_PROCESS_ID", "0")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "0")
    with pytest.raises(ValueError, match="--process_id must be in"):
        distributed.settings(None, None, None)


def test_split_hands_out_whole_chunks():
    """Every process gets whole (bucket, chunk) batches of the single-process run, so it compiles only its
    shapes and solves exactly the batches one process would; the split covers every problem once."""
    from cdsjax.core.batching import bucket_size
    from cdsjax.eval.distributed import split_problems

    rng = __import__("numpy").random.default_rng(0)
    sizes = [int(n) for n in rng.integers(5, 700, size=300)]
    buckets, max_batch = (16, 32, 64, 128, 256, 512, 1024), 32
    parts = split_problems(sizes, 2, buckets=buckets, max_batch=max_batch)
    assert parts == split_problems(sizes, 2, buckets=buckets, max_batch=max_batch)  # deterministic
    assert sorted(i for p in parts for i in p) == list(range(len(sizes)))
    assert all(p == sorted(p) and p for p in parts)

    def chunks(positions):  # run_selector's chunks of a list of problems
        by = {}
        for i in positions:
            by.setdefault(bucket_size(sizes[i], buckets), []).append(i)
        return {tuple(v[s:s + max_batch]) for v in by.values() for s in range(0, len(v), max_batch)}

    assert chunks(parts[0]) | chunks(parts[1]) == chunks(range(len(sizes)))
    assert not chunks(parts[0]) & chunks(parts[1])
    assert split_problems(sizes, 1, buckets=buckets, max_batch=max_batch) == [list(range(len(sizes)))]
    assert split_problems(sizes[:3], 4, buckets=buckets, max_batch=max_batch).count([]) >= 1  # more processes than chunks


@pytest.mark.slow
def test_compiling_on_one_core_is_this_thread_only_and_restored():
    """run_selector compiles with the compiling thread on one core (so every process, pinned or not, gets the
    same XLA partitioning and so the same float rounding), and gives the thread its cores back afterwards."""
    import os

    import jax
    import jax.numpy as jnp

    from cdsjax.eval.run import Executables, compiling_on_one_core

    before = os.sched_getaffinity(0)
    seen = {}
    with compiling_on_one_core():
        seen["inside"] = os.sched_getaffinity(0)
    assert len(seen["inside"]) == 1 and seen["inside"] <= before
    assert os.sched_getaffinity(0) == before
    with pytest.raises(RuntimeError):
        with compiling_on_one_core():
            raise RuntimeError("boom")
    assert os.sched_getaffinity(0) == before  # restored on error too
    f = jax.jit(lambda a, x: jnp.tanh(a @ x))
    a, x = jnp.arange(64.0).reshape(8, 8) / 64, jnp.ones(8)
    ex = Executables()
    assert (ex.executable(f, [a, x])(a, x) == f(a, x)).all()
    assert ex.executable(f, [a, x]) is ex.executable(f, [a, x])  # compiled once


def test_launch_local_stops_the_others_when_one_fails(tmp_path, capsys):
    """The launcher's own part, with a stand-in script: each process gets its place and (with enough cores) a core
    of its own; one that fails stops the others (cdsjax.io.child.stop) and says so in one line."""
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys, time\n"
        "i = int(next(a for a in sys.argv if a.startswith('--process_id=')).split('=')[1])\n"
        f"open(os.path.join({str(pids)!r}, str(i)), 'w').write(str(os.getpid()))\n"
        "if 'fail' in sys.argv and i == 1:\n"
        "    while len(os.listdir(" + repr(str(pids)) + ")) < 2: time.sleep(0.02)\n"
        "    sys.exit(3)\n"
        "if 'fail' in sys.argv: time.sleep(120)\n")
    assert distributed.launch_local(str(script), ["ok"], 2, prog="job") == 0
    t0 = time.monotonic()
    assert distributed.launch_local(str(script), ["fail"], 2, prog="job", output_dir="OUT") == 1
    assert time.monotonic() - t0 < 60  # process 0 was stopped, not waited for
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "job: error: process 1 of 2 failed (exit code 3)" in err[0] and "in OUT" in err[0]
    assert not pid_alive(int((pids / "0").read_text()))

"""Evaluation over several processes joined by JAX's distributed runtime.

One evaluation can run as N processes: on one machine ``run_eval.py --processes N`` starts them
(:func:`launch_local`: a coordinator on 127.0.0.1 with a free port, one CPU device each); on a cluster the
same script runs once per host with ``--coordinator HOST:PORT --num_processes N --process_id I`` (or
``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), and each host shards its batches
over its own local devices. Every process joins through :func:`jax.distributed.initialize`, takes the
its share of the questions (:func:`split_problems`: whole compiled chunks, so no shape is compiled
twice and the selections equal a single process's), and appends its records to its own
shard ``records.I-of-N.jsonl`` (so resuming is per shard); process 0 merges the shards into
``records.jsonl`` and writes ``summary.csv``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import sys
import time
from typing import List, Optional, Sequence

from cdsjax.io.child import spawn, stop
from cdsjax.io.util import atomic_write, free_port, usable_core_ids

BARRIER_TIMEOUT_S = 6 * 3600  # processes may differ by hours (indexing on a cold cache) before they join
SHARD_RE = re.compile(r"^records\.(\d+)-of-(\d+)\.jsonl$")


@dataclasses.dataclass(frozen=True)
class Process:
    """This process's place in a multi-process evaluation."""

    index: int
    count: int
    coordinator: str = ""

    def join(self) -> "Process":
        """Joins the distributed runtime (``jax.distributed.initialize``; blocks until every process has
        joined) and returns this process's place as the runtime reports it."""
        import jax

        jax.distributed.initialize(coordinator_address=self.coordinator, num_processes=self.count,
                                   process_id=self.index, initialization_timeout=BARRIER_TIMEOUT_S)
        jax.devices()  # every process starts its backend now (each start waits for all of them)
        joined = Process(index=jax.process_index(), count=jax.process_count(), coordinator=self.coordinator)
        if (joined.index, joined.count) != (self.index, self.count):
            raise RuntimeError(f"jax.distributed reports process {joined.index} of {joined.count}, "
                               f"expected {self.index} of {self.count}")
        return joined

    def barrier(self, name: str, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
        """Waits until every process has reached the barrier ``name``."""
        from jax._src import distributed

        distributed.global_state.client.wait_at_barrier(f"cdsjax-{name}", int(timeout_s * 1000))


def shard_path(out_dir: pathlib.Path, index: int, count: int) -> pathlib.Path:
    return pathlib.Path(out_dir) / f"records.{index:03d}-of-{count:03d}.jsonl"


def shard_files(out_dir: pathlib.Path) -> List[pathlib.Path]:
    """Every records shard in ``out_dir`` (of this run's process count or an earlier one)."""
    out_dir = pathlib.Path(out_dir)
    if not out_dir.is_dir():
        return []
    return sorted(p for p in out_dir.iterdir() if SHARD_RE.match(p.name))


def settings(coordinator: Optional[str], num_processes: Optional[int],
             process_id: Optional[int]) -> Optional[tuple]:
    """``(coordinator, num_processes, process_id)`` from the flags, else JAX's environment variables;
    None when this is a plain single-process run."""
    coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
        num_processes = int(os.environ["JAX_NUM_PROCESSES"])
    if process_id is None and os.environ.get("JAX_PROCESS_ID"):
        process_id = int(os.environ["JAX_PROCESS_ID"])
    given = [v is not None for v in (coordinator, num_processes, process_id)]
    if not any(given):
        return None
    if not all(given):
        raise ValueError("a multi-process run needs all of --coordinator HOST:PORT, --num_processes N and "
                         "--process_id I (or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID)")
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(f"--process_id must be in [0, {num_processes}), got {process_id}")
    return coordinator, int(num_processes), int(process_id)


def initialize(coordinator: str, num_processes: int, process_id: int) -> Process:
    """This process's place; :meth:`Process.join` joins the runtime (evaluate does, before using JAX)."""
    return Process(index=process_id, count=num_processes, coordinator=coordinator)


def split_problems(sizes: Sequence[int], count: int, *, buckets: Sequence[int], max_batch: int) -> List[List[int]]:
    """The problem positions each of ``count`` processes answers: whole compiled chunks, not every N-th question.

    :func:`cdsjax.eval.run.run_selector` pads problems into note-count buckets and cuts each bucket, in order,
    into chunks of at most ``max_batch``; each (bucket, padded chunk size) is one compilation. This split hands
    out those same chunks, so every process solves exactly the batches a single process would (the same
    selections, bit for bit: :func:`cdsjax.eval.run.run_selector` compiles as for one core in every process)
    and compiles only the shapes of its own chunks. Chunks of one shape stay
    together (one compilation) unless that shape alone is more than a process's share; the groups go, largest
    first, to the least loaded process. Cost: :data:`cdsjax.core.batching.COMPILE_COST` per shape plus padded
    problems times bucket size squared (the per-step cost of a dense solver). Deterministic: every process
    computes the same split.

    Args:
      sizes: the note count of each problem, in order.
      count: number of processes.
      buckets: the bucket sizes of the run.
      max_batch: most problems per compiled call.

    Returns:
      ``count`` lists of positions, each ascending.
    """
    from cdsjax.core.batching import COMPILE_COST, bucket_size, padded_batch

    by_bucket: dict = {}
    for i, n in enumerate(sizes):
        by_bucket.setdefault(bucket_size(max(1, int(n)), buckets), []).append(i)
    shapes: dict = {}  # (bucket, padded chunk) -> [chunk positions, ...]
    for b in sorted(by_bucket):
        pos = by_bucket[b]
        for start in range(0, len(pos), max_batch):
            chunk = pos[start:start + max_batch]
            shapes.setdefault((b, padded_batch(len(chunk), b)), []).append(chunk)

    def cost(shape, chunks):  # compiling a shape, plus solving its chunks
        return COMPILE_COST + len(chunks) * shape[1] * shape[0] ** 2

    share = sum(cost(s, c) for s, c in shapes.items()) / max(1, count)
    units = []  # (cost, order, chunks): one compiled shape, or one chunk of an oversized shape
    for shape, chunks in shapes.items():
        if cost(shape, chunks) > share and len(chunks) > 1:
            units += [(cost(shape, [c]), len(units), [c]) for c in chunks]
        else:
            units.append((cost(shape, chunks), len(units), chunks))
    load = [0] * count
    out: List[List[int]] = [[] for _ in range(count)]
    for c, _, chunks in sorted(units, key=lambda u: (-u[0], u[1])):
        k = min(range(count), key=lambda j: (load[j], j))
        load[k] += c
        for chunk in chunks:
            out[k].extend(chunk)
    return [sorted(o) for o in out]


def launch_local(script: str, argv: Sequence[str], processes: int, *, prog: str = "run_eval",
                 output_dir: str = "") -> int:
    """Runs ``script argv`` as ``processes`` local processes joined through a coordinator on 127.0.0.1.

    Each process gets one CPU device (``JAX_PLATFORMS=cpu``) and, when there are enough cores, a core of
    its own; only process 0 shows progress bars. The processes end with this one (:func:`cdsjax.io.child.spawn`
    with ``die_with_parent``: also when it is killed). If one process fails, the others are stopped and one line
    says which failed; the records written so far stay, so the same command resumes. Returns the exit code.
    """
    port = free_port()
    cores = usable_core_ids()
    children = []
    for i in range(processes):
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env.pop("JAX_COORDINATOR_ADDRESS", None)
        args = [sys.executable, script, *argv, f"--coordinator=127.0.0.1:{port}",
                f"--num_processes={processes}", f"--process_id={i}"]
        if i > 0:
            args.append("--noprogress")
        children.append(spawn(args, env=env, die_with_parent=True,
                              core=cores[i] if len(cores) >= processes else None))
    failed = None
    try:
        while failed is None:
            codes = [c.poll() for c in children]
            bad = [(i, rc) for i, rc in enumerate(codes) if rc not in (None, 0)]
            if bad:
                failed = bad[0]
                break
            if all(rc == 0 for rc in codes):
                return 0
            time.sleep(0.2)
    except KeyboardInterrupt:
        failed = (None, "interrupted")
    finally:
        stop(*children, timeout=10)
    i, rc = failed
    where = f" in {output_dir}" if output_dir else ""
    who = "interrupted" if i is None else f"process {i} of {processes} failed (exit code {rc})"
    print(f"{prog}: error: {who}; the other processes were stopped; the records written so far are kept{where} "
          f"and the same command resumes from them", file=sys.stderr)
    return 1


def merged_records(out_dir: pathlib.Path, records_name: str, bench_name: str, specs, budgets, problems, *,
                   merge: bool, digests=None) -> List[dict]:
    """This config's records from ``records.jsonl`` and every shard (a later line wins), in a fixed
    order (selector, budget, question), so the summary does not depend on how the questions were split.
    With ``digests`` (label -> identity digest), a selector's records made with other settings are left out
    (:func:`cdsjax.eval.records.is_current`).

    With ``merge``, ``records.jsonl`` is rewritten (atomically) with every record of the directory and the
    shards are removed.
    """
    import json

    from cdsjax.eval.records import is_current, read_records, record_key

    out_dir = pathlib.Path(out_dir)
    shards = shard_files(out_dir)
    latest = {}
    for path in [out_dir / records_name, *shards]:
        for r in read_records(path):
            if digests is None or is_current(r, digests):
                latest[record_key(r)] = r
    order = {label: i for i, (label, _, _) in enumerate(specs)}
    position = {p.query.qid: i for i, p in enumerate(problems)}
    wanted = {(bench_name, label, b, p.query.qid) for label, _, _ in specs for b in budgets for p in problems}
    records = sorted((r for k, r in latest.items() if k in wanted),
                     key=lambda r: (order[r["selector"]], r["budget"], position[r["qid"]]))
    if merge and shards:
        others = [r for k, r in latest.items() if k not in wanted]
        atomic_write(out_dir / records_name, "".join(json.dumps(r) + "\n" for r in others + records))
        for s in shards:
            s.unlink()
    return records

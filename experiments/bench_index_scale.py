r"""Indexing at scale on this machine: one process vs ``--workers`` vs ``--ray``, measured in one run.

    python experiments/bench_index_scale.py                 # the 5-PDF subset of profile_ingest.py (90 pages)
    python experiments/bench_index_scale.py --pdfs a.pdf b.pdf

Each row is a fresh process (imports, model loads and, for Ray, starting a local Ray included, as a new
``cdsjax index`` pays them) indexing the same PDFs into a fresh document cache: ``build_index(...,
workers=1)``, the same held to one core (onnxruntime and torch on one thread; the bound the scale section
uses: on 2 cores, 2 processes cannot beat 2 x t(1 process) / t(1 process on one core) over one process),
``workers=2``, and ``ray=""`` (a local Ray with this machine's cores). Every index must equal the
one-process index (notes, elements, embeddings within 1e-5, links).

For Ray the script also measures, in the same process after the build: how long starting the local Ray took;
Ray's per-document overhead (round trips of tasks that carry a PDF's bytes in and a parse result of the run's
average size back, no work: what each document costs Ray beyond its parsing); and the driver's commit rate
(documents committed to the cache per second of the driver's commit time, from the run's own stage times).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "experiments"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_scale import _child_init, cpu_seconds, ingest, same_index  # noqa: E402
from profile_ingest import DATA, SUBSET  # noqa: E402


def _ray_build(pdfs, out, cache):
    """In a fresh process: start a local Ray (timed), build on it, then measure Ray's per-document overhead."""
    import ray

    from cdsjax.io.index import build_index, default_config
    from cdsjax.io.util import usable_cores

    config = default_config()
    config.embedder.show_progress = False
    t0, c0 = time.perf_counter(), cpu_seconds()
    ray.init(num_cpus=usable_cores(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    start = time.perf_counter() - t0
    s = build_index(pdfs, out, config=config, cache_dir=cache, ray="", progress=True)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - c0  # this process only: Ray's workers are not its children
    # per-document overhead: a PDF's bytes in, a result of the average size out, no work
    sizes = [pathlib.Path(p).stat().st_size for p in pdfs]
    result_bytes = sum(f.stat().st_size for f in pathlib.Path(out).rglob("*") if f.is_file()) // max(1, len(pdfs))
    pdf = os.urandom(int(sum(sizes) / len(sizes)))

    @ray.remote(num_cpus=1)
    def echo(data: bytes, n: int) -> bytes:
        return b"x" * n

    ray.get([echo.remote(pdf, result_bytes) for _ in range(4)])  # workers started
    n = 64
    t1 = time.perf_counter()
    ray.get([echo.remote(pdf, result_bytes) for _ in range(n)])
    overhead = (time.perf_counter() - t1) / n
    ray.shutdown()
    return wall, cpu, s, dict(start=start, overhead=overhead, pdf_bytes=len(pdf), result_bytes=result_bytes)


def ray_ingest(pdfs, tmp: pathlib.Path):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from cdsjax.io.index import load_index

    out, cache = tmp / "index-ray", tmp / "cache-ray"
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_child_init,
                             initargs=(None,)) as pool:
        pool.submit(os.getpid).result()
        wall, cpu, s, extra = pool.submit(_ray_build, pdfs, out, cache).result()
    if s.failures or s.processed != len(pdfs):
        raise SystemExit(f"bench_index_scale: the Ray build failed: {s.failures}")
    return wall, cpu, s, load_index(out), extra


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pdfs", nargs="+", default=None, help="PDFs (default: profile_ingest.py's 5-PDF subset)")
    args = ap.parse_args()
    docs = DATA / "documents"
    pdfs = [pathlib.Path(p) if pathlib.Path(p).exists() else docs / p for p in (args.pdfs or SUBSET)]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_index_scale_"))
    load_before = os.getloadavg()
    runs = {}
    runs["1 process"] = ingest(pdfs, 1, tmp)
    print(f"[{time.strftime('%H:%M:%S')}] 1 process {runs['1 process'][0]:.1f} s", file=sys.stderr)
    runs["1 process on one core"] = ingest(pdfs, 1, tmp, one_core=True)
    print(f"[{time.strftime('%H:%M:%S')}] one core {runs['1 process on one core'][0]:.1f} s", file=sys.stderr)
    runs["--workers 2"] = ingest(pdfs, 2, tmp)
    print(f"[{time.strftime('%H:%M:%S')}] workers 2 {runs['--workers 2'][0]:.1f} s", file=sys.stderr)
    wall, cpu, s, index, extra = ray_ingest(pdfs, tmp)
    runs["--ray (local, 2 CPUs)"] = (wall, cpu, s, index)
    load_after = os.getloadavg()
    pages = runs["1 process"][2].pages
    t1, tcore = runs["1 process"][0], runs["1 process on one core"][0]
    bound = 2 * t1 / tcore
    print(f"\n## bench_index_scale: {len(pdfs)} PDFs, {pages} pages; {len(os.sched_getaffinity(0))} cores")
    print(f"load average before {' '.join(f'{v:.2f}' for v in load_before)}, "
          f"after {' '.join(f'{v:.2f}' for v in load_after)}\n")
    print("| run | wall s | pages/s | x 1 process | share of the 2-core ceiling | CPU s (this process tree) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (w, c, _, _) in runs.items():
        ratio = t1 / w
        share = f"{100 * ratio / bound:.0f}%" if name in ("--workers 2", "--ray (local, 2 CPUs)") else ""
        print(f"| {name} | {w:.1f} | {pages / w:.2f} | {ratio:.2f} | {share} | {c:.1f} |")
    print(f"\n2-core ceiling for 2/1: 2 x t(1 process) / t(1 process on one core) = {bound:.2f}")
    ref = runs["1 process"][3]
    print("indexes equal to the one-process index: "
          + ", ".join(f"{n}: {same_index(ref, r[3])}" for n, r in runs.items() if n != "1 process"))
    rs = runs["--ray (local, 2 CPUs)"][2]
    commit = rs.seconds.get("commit", 0.0)
    print(f"\nRay: local start {extra['start']:.1f} s (inside the wall above); per-document overhead "
          f"{1000 * extra['overhead']:.1f} ms (a task with {extra['pdf_bytes'] / 1e6:.2f} MB in and "
          f"{extra['result_bytes'] / 1e6:.2f} MB back, no work); driver commit {commit:.2f} s for "
          f"{rs.processed} documents = {rs.processed / max(commit, 1e-9):.1f} documents/s "
          f"({pages / max(commit, 1e-9):.0f} pages/s)")
    import resource

    def size(d):
        return sum(f.stat().st_size for f in pathlib.Path(d).rglob("*") if f.is_file())

    cache_mb, index_mb = size(tmp / "cache-w1-parent") / 1e6, size(tmp / "index-w1-parent") / 1e6
    print(f"storage: document cache {cache_mb:.1f} MB, index {index_mb:.1f} MB for {len(pdfs)} documents "
          f"({pages} pages, {runs['1 process'][2].notes} notes): {cache_mb / pages:.3f} + {index_mb / pages:.3f} MB "
          f"per page; largest process of the run (max RSS): "
          f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6:.2f} GB")
    print(f"stage seconds, 1 process: { {k: round(v, 1) for k, v in runs['1 process'][2].seconds.items()} }")
    print(f"stage seconds, Ray: { {k: round(v, 1) for k, v in rs.seconds.items()} }")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Embedding the notes of an index: sentence-transformers (torch) and the onnxruntime encoder, one run, fresh
processes.

    python experiments/bench_embed.py --index DIR [--rounds 2] [--backends onnx,sentence-transformers]

Each backend runs in a fresh process (as a new ``cdsjax index`` or ``cdsjax ask PDF`` does), alternating: the
import and model load (torch + sentence-transformers, or the model's ONNX export in an onnxruntime session of
:mod:`cdsjax.io.onnx_encoder`), then the encoding of every note of ``DIR`` (its ``embedding_text``) twice (the
second is the steady state). Wall and CPU seconds (all threads) of each step, the largest difference between any
two runs' vectors, and the steady state of the onnxruntime encoder against sentence-transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(index: Path, backend: str, out: Path, jax_cache: str) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    sys.path.insert(0, str(ROOT))
    if jax_cache:
        from cdsjax.io.compilation_cache import enable_compilation_cache

        enable_compilation_cache(jax_cache)
    from cdsjax.io.embed import Embedder
    from cdsjax.io.index import default_config
    from cdsjax.io.notes import embedding_text

    texts = [embedding_text(json.loads(line)) for line in open(index / "notes.jsonl", encoding="utf-8")]
    config = default_config()
    config.embedder.show_progress = False
    config.embedder.backend = backend
    embedder = Embedder(config)
    embedder.load()
    steps = dict(load=(time.perf_counter() - t0, time.process_time() - c0))
    for name in ("encode (first call)", "encode (again)"):
        t0, c0 = time.perf_counter(), time.process_time()
        vectors = embedder.encode_documents(texts, show_progress=False)
        steps[name] = (time.perf_counter() - t0, time.process_time() - c0)
    import numpy as np

    np.save(out, vectors)
    print(json.dumps(dict(steps=steps, notes=len(texts), torch="torch" in sys.modules)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--jax-cache", default="", help="a JAX compilation cache directory (default: none)")
    ap.add_argument("--backends", default="onnx,sentence-transformers",
                    help="comma-separated: onnx (the model's ONNX export on onnxruntime), sentence-transformers")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.index, args.child, args.out, args.jax_cache)
        return 0
    import numpy as np

    work = Path(tempfile.mkdtemp(prefix="bench_embed_"))
    load = os.getloadavg()
    rows = []
    for rnd in range(args.rounds):
        for backend in args.backends.split(","):
            out = work / f"{backend}{rnd}.npy"
            proc = subprocess.run([sys.executable, __file__, "--index", str(args.index), "--child", backend,
                                   "--out", str(out), "--jax-cache", args.jax_cache], capture_output=True,
                                  text=True, timeout=1800)
            if proc.returncode != 0:
                raise SystemExit(f"bench_embed: {backend} failed: {proc.stderr[-2000:]}")
            rows.append((backend, json.loads(proc.stdout.strip().splitlines()[-1]), np.load(out)))
    after = os.getloadavg()
    diff = max(float(np.abs(a[2] - b[2]).max()) for a in rows for b in rows)
    print(f"\n## bench_embed: {rows[0][1]['notes']} notes of {args.index.name}; {os.cpu_count()} cores; load average "
          f"before {load[0]:.2f}, after {after[0]:.2f}\n")
    print("| backend | torch imported | load s (CPU s) | encode, first call s (CPU s) | encode, again s (CPU s) |")
    print("|---|---|---:|---:|---:|")
    for backend, r, _ in rows:
        s = r["steps"]
        cells = " | ".join(f"{s[k][0]:.2f} ({s[k][1]:.2f})" for k in ("load", "encode (first call)", "encode (again)"))
        print(f"| {backend} | {r['torch']} | {cells} |")
    print(f"\nlargest |difference| between any two runs' vectors: {diff:.2e}")
    again = {}
    for backend, r, _ in rows:
        again.setdefault(backend, []).append(r["steps"]["encode (again)"])
    median = {b: [float(np.median([v[i] for v in vs])) for i in (0, 1)] for b, vs in again.items()}
    base = "sentence-transformers"
    for b in median:
        if b != base and base in median:
            print(f"encode (again), {b} / {base}: wall {median[b][0] / median[base][0]:.2f}x, "
                  f"CPU {median[b][1] / median[base][1]:.2f}x (medians over {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

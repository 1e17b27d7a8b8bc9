r"""Scanned MMLongBench-Doc documents: notes' text and page recall with and without OCR.

A document counts as scanned when at least half of its pages have no text layer. Each one is indexed twice
with the same settings except ``ingest.use_ocr`` ("off": pages become page images; "auto": Tesseract reads
them through PyMuPDF), then every question on those documents is answered by the same selectors at the same
budget, and gold-page recall is compared per question (paired bootstrap of the difference).

    nice -n 10 python experiments/ocr_scanned.py --out runs/ocr_scanned

Needs ``tesseract`` (``apt-get install tesseract-ocr``); prints one markdown table per measure.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def scanned_documents(bench, threshold: float = 0.5):
    import pymupdf

    out = {}
    for doc_id, path in sorted(bench.documents.items()):
        with pymupdf.open(str(path)) as d:
            empty = sum(1 for p in d if not p.get_text().strip())
            if empty and empty >= threshold * d.page_count:
                out[doc_id] = (empty, d.page_count)
    return out


def note_text_stats(indexes) -> dict:
    notes = [n for idx in indexes.values() for n in idx.notes]
    words = [len((n.get("text") or "").split()) for n in notes]
    return dict(notes=len(notes), text_notes=sum(n["kind"] == "text" for n in notes),
                notes_with_text=sum(w >= 5 for w in words), words=int(sum(words)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/ocr_scanned")
    parser.add_argument("--data-root", default=str(ROOT / ".." / "shared" / "data"))
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, PAPER_SELECTOR, REFERENCE_SELECTOR

    parser.add_argument("--selectors", default=",".join((REFERENCE_SELECTOR, DEFAULT_SELECTOR, PAPER_SELECTOR)))
    parser.add_argument("--budget", type=int, default=10)
    args = parser.parse_args()

    from cdsjax.pipeline.catalog import selector_spec
    from cdsjax.eval.problems import pdf_problems
    from cdsjax.eval.run import Executables, batch_chunk, cached_selector, run_selector
    from cdsjax.eval.scoring import score_problem
    from cdsjax.io.datasets import load_benchmark
    from cdsjax.io.embed import Embedder
    from cdsjax.io.parse import ocr_available
    from configs.mmlongbench import get_config

    if not ocr_available():
        print("tesseract is not installed: apt-get install tesseract-ocr", file=sys.stderr)
        return 2
    bench = load_benchmark("mmlongbench", args.data_root)
    scanned = scanned_documents(bench)
    queries = [q for q in bench.queries if all(d in scanned for d in q.doc_ids)]
    sub = dataclasses.replace(bench, queries=queries,
                              documents={d: p for d, p in bench.documents.items() if d in scanned})
    print(f"scanned documents: {len(scanned)} ({sum(e for e, _ in scanned.values())} of "
          f"{sum(n for _, n in scanned.values())} pages without text layer); questions: {len(queries)}")
    for d, (e, n) in scanned.items():
        print(f"  {d}: {e}/{n} pages without text")
    out = pathlib.Path(args.out)
    selectors = args.selectors.split(",")
    recall = {}
    stats = {}
    executables = Executables()  # the run's compiled calls, per selector and shape
    for mode in ("off", "auto"):
        config = get_config()
        config.ingest.use_ocr = mode
        config.index.cache_dir = str(out / mode / "doccache")
        embedder = Embedder(config)
        t0 = time.time()
        problems = pdf_problems(sub, config, embedder, cache_dir=out / mode, progress=True)
        from cdsjax.io.index import index_pdf

        indexes = {d: index_pdf(p, config=config, cache_dir=out / mode / "indexes") for d, p in sub.documents.items()}
        stats[mode] = note_text_stats(indexes)
        stats[mode]["seconds"] = time.time() - t0
        for name in selectors:
            fn = cached_selector(name, args.budget, {})
            sels = run_selector(fn, problems, buckets=(64, 128, 256, 512, 1024, 2048, 4096), max_batch=32,
                                chunk=batch_chunk(fn), spec=selector_spec(name),
                                executables=executables)
            recall[(mode, name)] = np.array([score_problem(p, s, kind="pdf")["page_recall"] for p, s in
                                             zip(problems, sels)], dtype=object)

    print("\n| OCR | notes | text notes | notes with >= 5 words | words in notes | index seconds |")
    print("|---|---|---|---|---|---|")
    for mode in ("off", "auto"):
        s = stats[mode]
        print(f"| {mode} | {s['notes']} | {s['text_notes']} | {s['notes_with_text']} | {s['words']} | "
              f"{s['seconds']:.0f} |")
    rng = np.random.default_rng(0)
    print(f"\n| selector | page recall@{args.budget}, OCR off | OCR auto | difference (95% CI, paired) | n |")
    print("|---|---|---|---|---|")
    for name in selectors:
        a, b = recall[("off", name)], recall[("auto", name)]
        keep = np.array([x is not None and y is not None for x, y in zip(a, b)])
        a, b = a[keep].astype(float), b[keep].astype(float)
        diff = b - a
        boots = [diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(10_000)]
        lo, hi = np.percentile(boots, [2.5, 97.5])
        print(f"| {name} | {a.mean():.3f} | {b.mean():.3f} | {diff.mean():+.3f} ({lo:+.3f}, {hi:+.3f}) | {len(diff)} |")
    print(f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

r"""Where indexing time goes, per stage, for the code before and after a change, next to two floors, in one run.

    python experiments/profile_ingest.py --old-root OLD_CHECKOUT                 # the default subset (5 PDFs)
    python experiments/profile_ingest.py --old-root OLD_CHECKOUT --all           # all 41 dev PDFs
    python experiments/profile_ingest.py --old-root OLD --pdfs a.pdf b.pdf --rounds 2

Each variant is a fresh process (``build_index(PDFS, OUT, workers=1)`` into a fresh document cache, the code
on PYTHONPATH: ``--old-root`` for "old", this checkout for "new"), so each pays its imports and model loads as
a new ``cdsjax index`` does. Old and new alternate (``--rounds`` times), so both see the same load. Inside
each process the stages are timed by wrapping the functions that do them (the same wrappers for both codes):

- PDF open (``parse.pymupdf.open_pdf``); layout model (PyMuPDF's ``BoxRFDGNN.predict`` per page), split into its
  image network, graph network and table model (onnxruntime ``run`` by model file) and the rest of it (page
  features in Python/MuPDF); pymupdf4llm's own work around the model (reading order, text lines, tables:
  ``parse_document`` minus the model); region and chunk building (``parse.pymupdf._page_elements``); crops
  (``parse.pymupdf.write_crop``); the rest of the parse (text-layer probe per page, OCR, context);
  enrichment (``notes.enrich_lite``) and links (``notes.structural_links``); embedding; commit to the
  document cache (``DocCache.write``) and the index write.

Floors, measured in a third fresh process on the same pages, in the same run: the layout model's own
inference (``page.get_layout()`` on every page: what this parser cannot do without) and plain PyMuPDF text
extraction (``page.get_text()`` on every page: what any parser must do). The new code's thread settings are
used for the floor (``cdsjax.io.parse.layout.prepare_models``).

The script also checks that old and new extracted the same elements and notes, and prints the gold-box
coverage of both (``bench_ingest.coverage``, MMDocIR boxes on the PDFs that have them).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "mmlongbench"
# one of each kind: an arXiv paper, a brochure, a report, a handbook/guide, a slide deck (90 pages)
SUBSET = ["2310.07609v1.pdf", "GPL-Graduate-Studies-Professional-Learning-Brochure-Jul-2021.pdf",
          "f8d3a162ab9507e021d83dd109118b60.pdf", "DSA-278777.pdf",
          "measuringsuccessonfacebooktwitterlinkedin-160317142140_95.pdf"]


# --------------------------------------------------------------------------- child: one timed build


def _timer(acc, name, fn):
    def wrapped(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[name] += time.perf_counter() - t0
    wrapped.__wrapped__ = fn
    return wrapped


def _instrument(acc):
    """Wraps the functions of each stage (old and new code alike) so their time adds up in ``acc``."""
    import onnxruntime.capi.onnxruntime_inference_collection as oic

    run = oic.Session.run

    def timed_run(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return run(self, *a, **k)
        finally:
            name = os.path.basename(str(getattr(self, "_model_path", "") or ""))
            kind = "image network" if "feature_imf" in name else "table model" if "table" in name else \
                "graph network" if "layout" in name else "other onnx"
            acc[f"onnx: {kind}"] += time.perf_counter() - t0
    oic.Session.run = timed_run

    import pymupdf4llm  # noqa: F401  (loads pymupdf.layout)
    from pymupdf.layout.onnx import BoxRFDGNN as gnn_module
    from pymupdf4llm.helpers import document_layout

    gnn_module.BoxRFDGNN.predict = _timer(acc, "layout model", gnn_module.BoxRFDGNN.predict)
    document_layout.parse_document = _timer(acc, "pymupdf4llm total", document_layout.parse_document)
    from cdsjax.io import doccache, notes, parse
    from cdsjax.io.parse import pymupdf as pymupdf_parse

    parse.parse_pdf = _timer(acc, "parse total", parse.parse_pdf)  # where the index build looks it up
    pymupdf_parse.open_pdf = _timer(acc, "PDF open", pymupdf_parse.open_pdf)
    pymupdf_parse._page_elements = _timer(acc, "regions and chunks", pymupdf_parse._page_elements)
    pymupdf_parse.write_crop = _timer(acc, "crops", pymupdf_parse.write_crop)
    notes.enrich_lite = _timer(acc, "enrichment", notes.enrich_lite)
    notes.structural_links = _timer(acc, "captions and links", notes.structural_links)
    doccache.DocCache.write = _timer(acc, "commit to cache", doccache.DocCache.write)


def child(args) -> int:
    acc = collections.defaultdict(float)
    t_start = time.perf_counter()
    if args.mode == "floors":
        return _floors(args)
    _instrument(acc)
    from cdsjax.io.index import build_index, default_config

    config = default_config()
    config.embedder.show_progress = False
    if args.batch:
        from cdsjax.io.parse.layout import set_page_batching

        set_page_batching(True)
    t0 = time.perf_counter()
    s = build_index(args.pdfs, args.out, config=config, workers=args.workers, cache_dir=args.cache,
                    page_split=not args.one_process)
    wall = time.perf_counter() - t0
    try:  # the new code's helper process: stopped, so its CPU time counts below
        from cdsjax.io.parse.layout_split import stop_helper

        stop_helper()
    except ImportError:
        pass
    import resource

    cpu = sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                resource.getrusage(resource.RUSAGE_CHILDREN)))
    print(json.dumps(dict(wall=wall, cpu=cpu, process=time.perf_counter() - t_start, pages=s.pages, notes=s.notes,
                          documents=s.documents, failures=len(s.failures), seconds=dict(s.seconds),
                          stages=dict(acc))))
    return 0


def _floors(args) -> int:
    from cdsjax.io.parse.layout import ocr_regions, prepare_models

    prepare_models()
    import pymupdf

    from cdsjax.io import store
    from cdsjax.io.parse import ocr_available

    acc = collections.defaultdict(float)
    _instrument(acc)
    pages = ocr_pages = 0
    use_ocr = ocr_available()
    for pdf in args.pdfs:
        doc = pymupdf.open(pdf)
        t0 = time.perf_counter()
        texts = [page.get_text() for page in doc]
        acc["text extraction"] += time.perf_counter() - t0
        t0, c0 = time.perf_counter(), time.process_time()
        for page in doc:
            page.get_layout()
            pages += 1
        acc["get_layout"] += time.perf_counter() - t0
        acc["get_layout CPU"] += time.process_time() - c0  # every thread of this process
        # OCR of the pages without a text layer, by the parser's own function
        blank = [i for i, t in enumerate(texts) if not t.strip()]
        if use_ocr and blank:
            t0, c0 = time.perf_counter(), time.process_time()
            for i in blank:
                ocr_regions(doc[i], start=0)
            acc["ocr"] += time.perf_counter() - t0
            acc["ocr CPU"] += time.process_time() - c0
            ocr_pages += len(blank)
        doc.close()
    out = dict(pages=pages, ocr_pages=ocr_pages, ocr=use_ocr)
    if args.out is not None and (args.out / store.MANIFEST).is_file():
        # the note embedding: the new index's notes encoded again by its encoder, load and compile excluded
        from cdsjax.io.embed import Embedder
        from cdsjax.io.index import default_config, load_index
        from cdsjax.io.notes import embedding_text

        config = default_config()
        embedder = Embedder(config)
        note_texts = [embedding_text(n) for n in load_index(args.out).notes]
        embedder.encode_documents(note_texts, show_progress=False)  # loads and compiles every bucket they need
        t0, c0 = time.perf_counter(), time.process_time()
        embedder.encode_documents(note_texts, show_progress=False)
        acc["embed"] += time.perf_counter() - t0
        acc["embed CPU"] += time.process_time() - c0
        out["notes"] = len(note_texts)
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps(dict(out, stages=dict(acc), cpu=ru.ru_utime + ru.ru_stime)))
    return 0


# --------------------------------------------------------------------------- parent


def run_child(code_root: Path, mode: str, pdfs, out: Path, cache: Path, workers=1, batch=False,
              one_process=False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code_root))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--out", str(out), "--cache", str(cache),
           "--workers", str(workers), "--pdfs", *map(str, pdfs)] + (["--batch"] if batch else []) \
        + (["--one-process"] if one_process else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(code_root), timeout=7200)
    if proc.returncode != 0:
        raise SystemExit(f"profile_ingest: the {mode} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def stage_rows(r: dict):
    """``(stage, seconds)`` in pipeline order, derived from the wrapped functions' totals."""
    st, sec = collections.defaultdict(float, r["stages"]), collections.defaultdict(float, r["seconds"])
    onnx = {k: v for k, v in st.items() if k.startswith("onnx: ")}
    model = st["layout model"]
    p4l = st["pymupdf4llm total"] - model
    parse_rest = st["parse total"] - st["pymupdf4llm total"] - st["PDF open"] - st["regions and chunks"] - st["crops"]
    rows = [("PDF open", st["PDF open"])]
    rows += [(f"layout model: {k[6:]}", v) for k, v in sorted(onnx.items())]
    rows += [("layout model: page features (Python, MuPDF)", model - sum(onnx.values())),
             ("pymupdf4llm around the model (reading order, lines, tables)", p4l),
             ("regions and chunks", st["regions and chunks"]), ("crops", st["crops"]),
             ("text-layer probe, OCR, context", parse_rest),
             ("enrichment (lite notes)", st["enrichment"]), ("captions and links", st["captions and links"]),
             ("embedding", sec["embed"]), ("commit to cache", st["commit to cache"]),
             ("index write, hashing", sec["write"] + sec["hash"])]
    return rows


def compare_indexes(a: Path, b: Path) -> str:
    sys.path.insert(0, str(ROOT))
    from cdsjax.io.index import load_index

    x, y = load_index(a), load_index(b)
    strip = lambda n: {k: v for k, v in n.items() if k != "image_path"}  # noqa: E731
    same_notes = [strip(n) for n in x.notes] == [strip(n) for n in y.notes]
    same_el = x.elements() == y.elements() if hasattr(x, "elements") else None
    import numpy as np

    emb = float(np.abs(x.embeddings - y.embeddings).max()) if x.embeddings.shape == y.embeddings.shape else None
    return (f"notes identical: {same_notes}; elements identical: {same_el}; notes {len(x.notes)} vs "
            f"{len(y.notes)}; max |embedding difference| {emb}")


def gold_coverage(index: Path) -> str:
    sys.path.insert(0, str(ROOT / "experiments"))
    sys.path.insert(0, str(ROOT))
    from bench_ingest import coverage
    from cdsjax.io.index import load_index

    corpus = load_index(index)
    rows = coverage(corpus.elements(), DATA / "mmdocir_annotations.jsonl", set(corpus.doc_ids))
    if not rows:
        return "no MMDocIR boxes on these PDFs"
    hit = sum(r["covered"] for r in rows)
    return f"{hit}/{len(rows)} = {100 * hit / len(rows):.1f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", choices=("build", "floors"), default=None, dest="mode", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--batch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--one-process", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--old-root", type=Path, help="a checkout of the code to compare against")
    ap.add_argument("--pdfs", nargs="+", default=None, help="PDFs (default: the 5-PDF subset)")
    ap.add_argument("--all", action="store_true", help="all dev PDFs")
    ap.add_argument("--rounds", type=int, default=1, help="old/new pairs (default 1)")
    ap.add_argument("--with-batching", action="store_true", help="also a new run with page batching on")
    args = ap.parse_args()
    if args.mode:
        return child(args)
    if args.old_root is None:
        ap.error("--old-root is required")
    docs = DATA / "documents"
    pdfs = sorted(docs.glob("*.pdf")) if args.all else [Path(p) if Path(p).exists() else docs / p
                                                        for p in (args.pdfs or SUBSET)]
    work = Path(tempfile.mkdtemp(prefix="profile_ingest_"))
    load_before = os.getloadavg()
    commit = lambda root: subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],  # noqa: E731
                                         capture_output=True, text=True).stdout.strip()
    # "new, 1 process": long documents not split over a helper process, so every stage is timed here
    variants = [("old", args.old_root, {}), ("new, 1 process", ROOT, dict(one_process=True)), ("new", ROOT, {})]
    if args.with_batching:
        variants.append(("new, pages batched", ROOT, dict(batch=True)))
    results = collections.defaultdict(list)
    try:
        for rnd in range(args.rounds):
            for name, root, opts in variants:
                tag = f"{name.replace(' ', '_').replace(',', '')}{rnd}"
                t0 = time.time()
                r = run_child(root, "build", pdfs, work / f"index-{tag}", work / f"cache-{tag}", **opts)
                results[name].append(r)
                print(f"[{time.strftime('%H:%M:%S')}] {name} round {rnd}: {r['wall']:.1f} s wall, "
                      f"{r['pages'] / r['wall']:.2f} pages/s, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
        floors = run_child(ROOT, "floors", pdfs, work / "index-new0", work / "unused-cache")
        load_after = os.getloadavg()
        check = compare_indexes(work / "index-old0", work / "index-new0")
        cov_old, cov_new = gold_coverage(work / "index-old0"), gold_coverage(work / "index-new0")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    old0 = results["old"][0]
    pages, notes = old0["pages"], old0["notes"]
    print(f"\n## profile_ingest: {len(pdfs)} PDFs, {pages} pages, {notes} notes; old = {commit(args.old_root)}, "
          f"new = {commit(ROOT)}; {os.cpu_count()} cores; {args.rounds} round(s), old and new alternating")
    print(f"load average before {' '.join(f'{v:.2f}' for v in load_before)}, "
          f"after {' '.join(f'{v:.2f}' for v in load_after)}\n")
    print("PDFs: " + ", ".join(p.name for p in pdfs) + "\n")
    med = lambda rs, f: sorted(f(r) for r in rs)[len(rs) // 2]  # noqa: E731
    # the stage table: runs where every stage runs in the timed process (not "new": its helper's stages are not)
    cols = [n for n in results if n != "new"]
    print("| stage | " + " | ".join(f"{n} s | {n} share | {n} pages/s" for n in cols) + " |")
    print("|---|" + "---:|---:|---:|" * len(cols))
    per = {n: dict(stage_rows(rs[0])) for n, rs in results.items()}
    walls = {n: med(rs, lambda r: r["wall"]) for n, rs in results.items()}
    for stage in per["old"]:
        cells = []
        for n in cols:
            v = per[n].get(stage, 0.0)
            rate = f"{pages / v:.1f}" if v > 0.05 else "-"
            cells.append(f"{v:.1f} | {100 * v / rs_wall(results[n]):.0f}% | {rate}")
        print(f"| {stage} | " + " | ".join(cells) + " |")
    print("| **wall (build_index)** | " + " | ".join(
        f"**{walls[n]:.1f}** | 100% | **{pages / walls[n]:.2f}**" for n in cols) + " |")
    print("\n(with the embedding on its own thread, overlapping the next document's parse, a run's stage seconds "
          "can add up to more than its wall time)")
    print("\n| run | wall s | pages/s | x old | CPU s per page |")
    print("|---|---:|---:|---:|---:|")
    for n, rs in results.items():
        print(f"| {n} | {walls[n]:.1f} | {pages / walls[n]:.2f} | {walls['old'] / walls[n]:.2f} | "
              f"{med(rs, lambda r: r.get('cpu', 0.0)) / pages:.2f} |")
    fl = floors["stages"]
    model_onnx = sum(v for k, v in fl.items() if k.startswith("onnx: "))
    print(f"\nFloors on the same {floors['pages']} pages (a third process, the new code's thread settings):\n")
    print("| floor | seconds | pages/s |")
    print("|---|---:|---:|")
    print(f"| layout model, `page.get_layout()` per page | {fl['get_layout']:.1f} | {floors['pages'] / fl['get_layout']:.2f} |")
    if "get_layout CPU" in fl:
        print(f"| layout model, CPU seconds (all threads; core-seconds per page: "
              f"{fl['get_layout CPU'] / floors['pages']:.2f}) | {fl['get_layout CPU']:.1f} | |")
    print(f"| of which its networks (onnxruntime) | {model_onnx:.1f} | {floors['pages'] / model_onnx:.2f} |")
    if "cpu" in floors:
        print(f"| (CPU seconds of the floor process, imports and model load included: {floors['cpu']:.1f}) | | |")
    print(f"| plain text extraction, `page.get_text()` per page | {fl['text extraction']:.1f} | "
          f"{floors['pages'] / fl['text extraction']:.1f} |")
    if "ocr CPU" in fl:
        print(f"| OCR of the {floors['ocr_pages']} pages without a text layer (Tesseract through MuPDF, the parser's "
              f"dpi) | {fl['ocr']:.1f} | {floors['ocr_pages'] / fl['ocr']:.2f} |")
        print(f"| the same, CPU seconds | {fl['ocr CPU']:.1f} | |")
    if "embed CPU" in fl:
        print(f"| note embedding, the encoder alone on the new index's {floors['notes']} notes (load and compile "
              f"excluded) | {fl['embed']:.1f} | {floors['notes'] / fl['embed']:.1f} notes/s |")
        print(f"| the same, CPU seconds | {fl['embed CPU']:.1f} | |")
    # what the floors leave: the 3x of the issue in pages/s on this machine's cores, and with the old code's
    # pages/s taken as if it had held one core (what the machine allows a one-process code to be sped up by)
    need = {k: fl.get(f"{k} CPU", 0.0) / pages for k in ("get_layout", "ocr", "embed")}
    floor_sum = sum(need.values())
    cores = os.cpu_count() or 1
    old_cpu = med(results["old"], lambda r: r["cpu"]) / pages
    budget_strict = cores * walls["old"] / (3 * pages)
    budget_one_core = cores * max(old_cpu, walls["old"] / pages) / 3
    new_cpu = med(results["new"], lambda r: r["cpu"]) / pages
    print(f"\nFloors in core-seconds per page: layout model {need['get_layout']:.3f}, OCR {need['ocr']:.3f}, "
          f"note embedding {need['embed']:.3f}; together **{floor_sum:.3f}**. The new code takes {new_cpu:.3f}; "
          f"everything but the floors {new_cpu - floor_sum:.3f}.")
    print(f"3x the old code's pages/s on {cores} cores, all busy, allows at most {budget_strict:.3f} core-seconds "
          f"per page ({'below' if budget_strict < floor_sum else 'above'} the floors); against the old code held "
          f"to one core ({cores} x max(its CPU, its wall) / 3) at most {budget_one_core:.3f}, which leaves "
          f"{budget_one_core - floor_sum:.3f} for everything but the floors.")
    print("\nCPU seconds per page (this process and its children, imports and model loads included; under load "
          "the fairer measure of work, since wall time also depends on how many threads compete): "
          + "; ".join(f"{n}: {med(rs, lambda r: r['cpu']) / pages:.2f}" for n, rs in results.items()))
    print("\nWall times per round (s): " + "; ".join(f"{n}: " + ", ".join(f"{r['wall']:.1f}" for r in rs)
                                                    for n, rs in results.items()))
    speed = walls["old"] / walls["new"]
    print(f"\nnew / old pages/s (median of rounds): {speed:.2f}x")
    for n in results:
        print(f"gap to the layout-model floor, {n}: wall / floor = {walls[n] / fl['get_layout']:.2f}")
    print(f"\nold vs new index: {check}")
    print(f"gold-box coverage (MMDocIR): old {cov_old}; new {cov_new}")
    return 0


def rs_wall(rs) -> float:
    return sorted(r["wall"] for r in rs)[len(rs) // 2]


if __name__ == "__main__":
    sys.exit(main())

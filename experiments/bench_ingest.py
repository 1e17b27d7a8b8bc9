r"""Ingestion benchmark: parse -> notes -> embed -> write over the MMLongBench-Doc PDFs, then a cached re-run.

Prints, from one run:
- pages/s of parsing, notes/s of embedding, the time share of each stage;
- first run vs cached re-run of the same command (and the speed-up);
- gold-box coverage: the share of MMDocIR gold boxes (``mmdocir_annotations.jsonl``) that some parsed
  element covers (IoU >= 0.3, or the gold box >= 50% inside the element), overall, by question type and by
  document, with a breakdown of the misses.

    .venv/bin/python experiments/bench_ingest.py                       # all 41 PDFs
    .venv/bin/python experiments/bench_ingest.py --limit 3 --out runs/bench_small
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cdsjax.io.elements import inside_fraction, iou  # noqa: E402
from cdsjax.io.index import build_index, default_config, load_index  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "mmlongbench"


def covered(gold, box, *, iou_min=0.3, inside_min=0.5) -> bool:
    return iou(gold, box) >= iou_min or inside_fraction(gold, box) >= inside_min


def coverage(elements, annotations_path: Path, doc_ids):
    """Returns (rows, misses): one row per unique gold box with whether an element covers it."""
    by_page = collections.defaultdict(list)
    for e in elements:
        by_page[(e["doc_id"], e["page"])].append(e)
    rows = []
    seen = set()
    with open(annotations_path) as f:
        for line in f:
            ann = json.loads(line)
            doc = ann["doc_name"]
            if doc not in doc_ids:
                continue
            for q in ann["questions"]:
                qtype = q.get("type", "?").strip("[]'\"").split("'")[0] or "?"
                for lm in q.get("layout_mapping", []):
                    key = (doc, lm["page"], tuple(round(v, 1) for v in lm["bbox"]))
                    if key in seen:
                        continue
                    seen.add(key)
                    gold = [float(v) for v in lm["bbox"]]
                    cands = by_page.get((doc, lm["page"]), [])
                    hit = [e for e in cands if covered(gold, e["bbox"])]
                    # stricter view: text chunks only by the blocks they were cut from
                    strict_hit = [
                        e for e in cands
                        if (e["kind"] != "text" or e["role"] == "caption") and covered(gold, e["bbox"])
                        or any(covered(gold, b) for b in e.get("boxes") or [])
                    ]
                    best_iou = max((iou(gold, e["bbox"]) for e in cands), default=0.0)
                    best_in = max((inside_fraction(gold, e["bbox"]) for e in cands), default=0.0)
                    rows.append(dict(doc=doc, page=lm["page"], type=qtype, gold=gold, covered=bool(hit),
                                     strict=bool(strict_hit), kinds=sorted({e["kind"] for e in hit}),
                                     n_on_page=len(cands), best_iou=best_iou, best_inside=best_in,
                                     page_kinds=sorted({e["kind"] for e in cands})))
    return rows


def miss_reason(r) -> str:
    if r["n_on_page"] == 0:
        return "no element on the page"
    if r["best_iou"] == 0 and r["best_inside"] == 0:
        return "no element overlaps the box"
    if r["best_inside"] >= 0.25:
        return "partly inside an element (25-50%)"
    return "small overlap only"


def fmt_table(header, rows) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=Path, default=DATA / "documents")
    ap.add_argument("--annotations", type=Path, default=DATA / "mmdocir_annotations.jsonl")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_ingest"))
    ap.add_argument("--limit", type=int, default=0, help="only the first N PDFs (sorted by name)")
    ap.add_argument("--show-misses", type=int, default=15)
    args = ap.parse_args(argv)

    pdfs = sorted(args.docs.glob("*.pdf"))
    if args.limit:
        pdfs = pdfs[: args.limit]
    if args.out.exists():
        shutil.rmtree(args.out)
    config = default_config()
    config.embedder.show_progress = False

    t = time.perf_counter()
    first = build_index(pdfs, args.out, config=config, progress=False,
                        log=lambda line: print(line, file=sys.stderr))
    t_first = time.perf_counter() - t
    t = time.perf_counter()
    again = build_index(pdfs, args.out, config=config, progress=False)
    t_again = time.perf_counter() - t
    t = time.perf_counter()
    corpus = load_index(args.out)
    t_load = time.perf_counter() - t

    print(f"# ingestion benchmark: {len(pdfs)} PDFs from {args.docs}")
    print(f"documents indexed {first.documents}, failed {len(first.failures)}, pages {first.pages}, "
          f"notes {first.notes}, links {first.links}, warnings {len(first.warnings)}")
    for path, reason in first.failures:
        print(f"  failed: {path}: {reason}")
    print("elements by kind:", ", ".join(f"{k} {v}" for k, v in first.elements_by_kind.items()))
    total = sum(first.seconds.values())
    rows = [[stage, f"{sec:.1f}", f"{100 * sec / total:.1f}%"] for stage, sec in first.seconds.items()]
    print()
    print(fmt_table(["stage", "seconds", "share"], rows))
    print()
    print(f"parsing:   {first.pages / max(first.seconds.get('parse', 0), 1e-9):.2f} pages/s")
    print(f"notes:     {first.notes / max(first.seconds.get('notes', 0), 1e-9):.1f} notes/s (lite enrichment)")
    print(f"embedding: {first.notes / max(first.seconds.get('embed', 0), 1e-9):.1f} notes/s "
          f"({config.embedder.model}, batch {config.embedder.batch_size}, {config.embedder.device})")
    print()
    print(fmt_table(["run", "seconds", "documents reused", "index rewritten"], [
        ["first", f"{t_first:.2f}", first.reused, first.written],
        ["cached re-run", f"{t_again:.2f}", again.reused, again.written],
        ["load_index", f"{t_load:.2f}", "", ""],
    ]))
    print(f"re-run speed-up: {t_first / t_again:.0f}x")

    if not args.annotations.exists():
        return 0
    rows = coverage(corpus.elements(), args.annotations, set(corpus.doc_ids))
    if not rows:
        return 0
    n = len(rows)
    hit = sum(r["covered"] for r in rows)
    strict = sum(r["strict"] for r in rows)
    print()
    print(f"# gold-box coverage (MMDocIR, {n} unique boxes on {len({r['doc'] for r in rows})} documents)")
    print(f"covered (IoU >= 0.3 or >= 50% inside an element): {hit}/{n} = {100 * hit / n:.1f}%")
    print(f"stricter (text chunks judged by their own blocks, not their union box): "
          f"{strict}/{n} = {100 * strict / n:.1f}%")
    by_type = collections.defaultdict(lambda: [0, 0])
    for r in rows:
        by_type[r["type"]][0] += r["covered"]
        by_type[r["type"]][1] += 1
    print()
    print(fmt_table(["question type", "covered", "boxes", "share"],
                    [[t, c, m, f"{100 * c / m:.1f}%"] for t, (c, m) in sorted(by_type.items())]))
    misses = [r for r in rows if not r["covered"]]
    reasons = collections.Counter(miss_reason(r) for r in misses)
    print()
    print(fmt_table(["miss reason", "boxes"], sorted(reasons.items(), key=lambda x: -x[1])))
    by_doc = collections.defaultdict(lambda: [0, 0])
    for r in rows:
        by_doc[r["doc"]][0] += r["covered"]
        by_doc[r["doc"]][1] += 1
    worst = sorted(by_doc.items(), key=lambda x: x[1][0] / x[1][1])[:8]
    print()
    print(fmt_table(["document (lowest coverage)", "covered", "boxes"], [[d, c, m] for d, (c, m) in worst]))
    if args.show_misses:
        print()
        print("sample misses (doc, page, type, gold box, best IoU, best inside share, element kinds on page):")
        for r in misses[: args.show_misses]:
            print(f"  {r['doc']} p{r['page']} {r['type']} {[round(v) for v in r['gold']]} "
                  f"iou={r['best_iou']:.2f} inside={r['best_inside']:.2f} page={r['page_kinds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Latency by corpus size: cold and warm selection for the default selector, converged CDS and cosine, old
code against this one in one run, and the evaluation's questions per second.

Run (from the repository root; ``--old-root`` is a checkout of the code to compare against)::

    python experiments/bench_latency.py --old-root ../base --index runs/idx3
    python experiments/bench_latency.py --sizes 164,1000 --questions 20          # a quick look, new code only

Three measurements, each old and new interleaved so both see the same load (the load average is
recorded with every figure):

- **corpora by size** (164, ~1k, ~4k, ~10k notes): synthetic corpora from real embeddings, QASPER's
  paragraphs (all-MiniLM-L6-v2, cached under ``runs/bench_latency/``) concatenated paper by paper, five
  consecutive paragraphs to a "page", each paper a document; questions are QASPER questions on those
  papers. A fresh process per (code, size) builds a :class:`cdsjax.pipeline.Pipeline` over the corpus
  and, per selector, times the first ``select`` (cold: compilation and, in the new code, the corpus's
  spectral bound) and then ``--questions`` more, the selectors taking turns question by question (warm
  p50/p95, selection only: the question is encoded beforehand).
- **a real index over HTTP** (``--index DIR``): one ``cdsjax serve`` per code; a client POSTs
  ``/select`` with MMLongBench-Doc questions, the servers and selectors taking turns; latency as the
  client sees it (encoding and HTTP included), the form of the issue's figure.
- **evaluation throughput**: :func:`cdsjax.eval.run.run_selector` with the default selector over the
  first ``--eval-questions`` QASPER problems (each question over its own paper), questions per second
  after a first run that compiles (warm) and including it (cold).

Old code at sizes where one question takes minutes (``--old-max``, default 4100 notes) is left out.
Writes ``--out`` (JSON) and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from cdsjax.io.util import free_port

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "runs" / "bench_latency"


def selectors(given: str = "") -> tuple:
    """The selectors timed: ``given`` (comma-separated registry names), else the default selector, converged CDS
    (the paper's game, beta an option) and cosine, from the registry."""
    from cdsjax.core.registry import SPECS
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, REFERENCE_SELECTOR, selector_spec

    if given:
        return tuple(selector_spec(n.strip()).name for n in given.split(",") if n.strip())
    converged = next(s.name for s in SPECS.values() if s.mode == "converged" and "beta" in s.options)
    return DEFAULT_SELECTOR, converged, REFERENCE_SELECTOR


PAGE_SIZE = 5
QASPER_QUESTIONS = 240  # the first questions of QASPER and their papers: about 3,000 real paragraphs


def load() -> float:
    return round(os.getloadavg()[0], 1)


def stats(ms) -> dict:
    ms = np.asarray(ms, float)
    return {"p50": round(float(np.percentile(ms, 50)), 1), "p95": round(float(np.percentile(ms, 95)), 1),
            "n": int(ms.size)}


# ---------------------------------------------------------------------------------------------- data
def qasper_embeddings(progress: bool = True, data_root=None) -> Path:
    """QASPER paragraphs and questions embedded once (the evaluation's embedding cache), as one ``.npz``
    (``data_root``: the benchmarks' directory; None: ``shared/data`` beside the repository)."""
    out = CACHE / "qasper.npz"
    if out.is_file():
        return out
    from cdsjax.eval.problems import text_problems
    from cdsjax.io.datasets import load_benchmark
    from cdsjax.io.embed import Embedder
    from cdsjax.io.index import default_config

    data_root = ROOT.parent / "shared" / "data" if data_root is None else data_root
    bench = load_benchmark("qasper", str(data_root), max_queries=QASPER_QUESTIONS)
    problems = text_problems(bench, Embedder(default_config()), cache_dir=CACHE / "emb", progress=progress)
    papers, notes, questions, paper_of = {}, [], [], []
    for p in problems:
        doc = p.docs[0]
        if doc not in papers:
            papers[doc] = (sum(len(x) for x in notes), len(p.notes))
            notes.append(np.asarray(p.notes, np.float32))
        questions.append(np.asarray(p.query_emb, np.float32))
        paper_of.append(list(papers).index(doc))
    starts = np.asarray([papers[d][0] for d in papers])
    sizes = np.asarray([papers[d][1] for d in papers])
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(out, notes=np.concatenate(notes), questions=np.stack(questions), paper_of=np.asarray(paper_of),
             starts=starts, sizes=sizes)
    return out


def synthetic_corpus(data, size: int):
    """QASPER's papers in order up to ``size`` notes (the last one cut), pages of five paragraphs, and the
    questions on those papers. Past the real paragraphs the papers come round again as new documents whose
    notes are the real ones plus noise (cosine about 0.8 to their source), so a corpus of any size keeps
    the real embeddings' geometry."""
    starts, sizes = data["starts"], data["sizes"]
    rng = np.random.default_rng(size)
    blocks, docs, pages, papers, total, doc = [], [], [], set(), 0, 0
    while total < size:
        for i, (s, k) in enumerate(zip(starts, sizes)):
            k = min(int(k), size - total)
            z = data["notes"][s:s + k].astype(np.float64)
            if doc >= len(starts):  # a second round: the same paper's paragraphs, perturbed
                z = z + 0.75 * rng.normal(size=z.shape) / np.sqrt(z.shape[1])
                z /= np.linalg.norm(z, axis=1, keepdims=True)
            blocks.append(z.astype(np.float32))
            docs.append(np.full(k, doc))
            pages.append(np.arange(k) // PAGE_SIZE)
            papers.add(i)
            total += k
            doc += 1
            if total >= size:
                break
    questions = data["questions"][np.isin(data["paper_of"], sorted(papers))]
    return np.concatenate(blocks), np.concatenate(docs), np.concatenate(pages), questions


# ---------------------------------------------------------------------------------------------- worker
def worker_corpus(spec: dict) -> dict:
    """In a fresh process (old or new code on PYTHONPATH): cold and warm selection on one corpus."""
    import jax

    from cdsjax.pipeline import Corpus, Pipeline

    data = np.load(spec["data"])
    emb, docs, pages, questions = synthetic_corpus(data, spec["size"])
    n = len(emb)
    notes = [{"note_id": f"n{i}", "doc_id": f"paper{docs[i]}", "page": int(pages[i]), "kind": "text",
              "text": "", "bbox": None} for i in range(n)]
    corpus = Corpus(embeddings=emb, links=np.zeros((n, n), bool), notes=notes,
                    embedder={"model": "all-MiniLM-L6-v2"}, roots=[])
    pipe = Pipeline(corpus, embedder=object())
    rng = np.random.default_rng(0)
    qs = questions[rng.choice(len(questions), size=spec["questions"] + 1, replace=len(questions) <= spec["questions"])]
    out = {"notes": n, "padded": int(pipe.size), "selectors": {}}
    for name in spec["selectors"]:
        t0 = time.perf_counter()
        jax.block_until_ready(pipe.select(qs[0], selector=name, budget=10))
        out["selectors"][name] = {"cold_ms": round(1000 * (time.perf_counter() - t0), 1), "load_cold": load()}
    warm = {name: [] for name in spec["selectors"]}
    picks = {name: [] for name in spec["selectors"]}
    for q in qs[1:]:
        for name in spec["selectors"]:
            t0 = time.perf_counter()
            sel = jax.device_get(pipe.select(q, selector=name, budget=10))
            warm[name].append(1000 * (time.perf_counter() - t0))
            picks[name].append(np.asarray(sel.indices)[np.asarray(sel.selected_valid)].tolist())
    for name in spec["selectors"]:
        out["selectors"][name].update(warm=stats(warm[name]), picks=picks[name])
    out["load"] = load()
    return out


def worker_eval(spec: dict) -> dict:
    """Questions per second of the evaluation's batched run of the default selector on QASPER problems."""
    from cdsjax.core.batching import DEFAULT_BUCKETS
    from cdsjax.core.registry import SPECS  # (the old code this runs too has the same table)
    from cdsjax.eval.problems import Problem
    from cdsjax.eval.run import batch_chunk, cached_selector, run_selector
    from cdsjax.io.datasets import Query

    data = np.load(spec["data"])
    problems = []
    for k in range(spec["questions"]):
        i = int(data["paper_of"][k])
        s, n = int(data["starts"][i]), int(data["sizes"][i])
        q = Query(qid=f"q{k}", question="", answer="", doc_ids=(f"paper{i}",))
        problems.append(Problem(q, data["notes"][s:s + n], data["questions"][k], np.zeros((n, n), bool),
                                [f"n{j}" for j in range(n)], [f"paper{i}"] * n,
                                pages=list(np.arange(n) // PAGE_SIZE)))
    name = spec["selector"]
    fn = cached_selector(name, 10, {})
    chunk = batch_chunk(fn)
    import inspect

    params = inspect.signature(run_selector).parameters
    extra = {"spec": SPECS[name]} if "spec" in params else {}
    if "executables" in params:  # the run's compiled calls, kept for the warm run (older code: a module cache)
        from cdsjax.eval.run import Executables

        extra["executables"] = Executables()
    t0 = time.perf_counter()
    first = run_selector(fn, problems, buckets=DEFAULT_BUCKETS, max_batch=16, chunk=chunk, **extra)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_selector(fn, problems, buckets=DEFAULT_BUCKETS, max_batch=16, chunk=chunk, **extra)
    warm = time.perf_counter() - t0
    picks = [np.asarray(s.indices)[np.asarray(s.selected_valid)].tolist() for s in first]
    scores = [np.asarray(s.scores).tobytes().hex() for s in first]
    return {"questions": len(problems), "cold_qps": round(len(problems) / cold, 2),
            "warm_qps": round(len(problems) / warm, 2), "load": load(), "picks": picks, "scores": scores}


def run_worker(root: Path, task: str, spec: dict, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", task, f.name],
                              capture_output=True, text=True, env=env, timeout=timeout, cwd=str(root))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- HTTP
def post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def serve_index(roots: dict, index: str, questions, selectors, cache: Path) -> dict:
    """One server per code; questions interleaved across servers and selectors; client-side latency."""
    servers = {}
    try:
        for label, root in roots.items():
            port = free_port()
            env = dict(os.environ, PYTHONPATH=str(root), CDSJAX_CACHE=str(cache / label))
            proc = subprocess.Popen([sys.executable, "-m", "cdsjax.cli", "serve", *index.split(","), "--port", str(port)],
                                    cwd=str(root), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            servers[label] = (proc, f"http://127.0.0.1:{port}")
        for label, (proc, url) in servers.items():
            t0 = time.perf_counter()
            while True:
                try:
                    urllib.request.urlopen(url + "/health", timeout=5).read()
                    break
                except OSError:
                    if proc.poll() is not None or time.perf_counter() - t0 > 900:
                        raise RuntimeError(f"{label} server did not start: {proc.stderr.read().decode()[-400:]}")
                    time.sleep(1.0)
        out = {label: {s: {"cold_ms": None, "warm": []} for s in selectors} for label in servers}
        picks = {label: {s: [] for s in selectors} for label in servers}
        for i, q in enumerate(questions):
            for s in selectors:
                for label, (_, url) in servers.items():
                    t0 = time.perf_counter()
                    ans = post(url + "/select", {"question": q, "selector": s, "budget": 10})
                    ms = 1000 * (time.perf_counter() - t0)
                    if i == 0:
                        out[label][s]["cold_ms"] = round(ms, 1)
                    else:
                        out[label][s]["warm"].append(ms)
                    picks[label][s].append([e.get("note_id") for e in ans.get("evidence", [])])
        for label in servers:
            for s in selectors:
                out[label][s]["warm"] = stats(out[label][s]["warm"])
        same = {s: sum(a == b for a, b in zip(*(picks[k][s] for k in servers))) for s in selectors} \
            if len(servers) == 2 else {}
        return {"servers": out, "same_picks": same, "questions": len(questions), "load": load()}
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def mmlongbench_questions(k: int):
    samples = json.loads((ROOT.parent / "shared" / "data" / "mmlongbench" / "samples.json").read_text())
    return [s["question"] for s in samples[:k]]


# ---------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old-root", default=None, help="a checkout of the code to compare against")
    p.add_argument("--sizes", default="164,1000,4000,10000")
    p.add_argument("--questions", type=int, default=30, help="warm questions per corpus")
    p.add_argument("--large-questions", type=int, default=3, help="warm questions per corpus above 2,000 notes")
    p.add_argument("--old-max", type=int, default=4100, help="largest corpus the old code is timed on")
    p.add_argument("--index", default=None, help="index directories to serve (old and new) over HTTP, comma-separated")
    p.add_argument("--converged-max", type=int, default=5000,
                   help="largest corpus converged CDS is timed on (its equilibrium holds every note: one dense "
                        "Newton system of the whole corpus per question)")
    p.add_argument("--http-questions", type=int, default=30)
    p.add_argument("--eval-questions", type=int, default=200)
    p.add_argument("--timeout", type=float, default=3000, help="seconds per worker process")
    p.add_argument("--skip", default="", help="comma list of parts to skip: corpora, http, eval")
    p.add_argument("--selectors", default="", help="comma list of selectors to time on the corpora and over HTTP "
                   "(default: the default selector, converged CDS, cosine)")
    p.add_argument("--out", default=str(CACHE / "latency.json"))
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        task, path = args.worker
        spec = json.loads(Path(path).read_text())
        print(json.dumps({"corpus": worker_corpus, "eval": worker_eval}[task](spec)))
        return 0

    roots = {"new": ROOT}
    if args.old_root:
        roots = {"old": Path(args.old_root).resolve(), "new": ROOT}
    skip = set(filter(None, args.skip.split(",")))
    data = str(qasper_embeddings())
    report = {"sizes": {}, "http": None, "eval": {}, "cores": os.cpu_count()}
    if "corpora" not in skip:
        for size in [int(s) for s in args.sizes.split(",")]:
            report["sizes"][size] = {}
            for label, root in roots.items():
                if label == "old" and size > args.old_max:
                    continue
                questions = args.questions if size <= 2000 else args.large_questions
                converged = selectors()[1]  # the default list's converged CDS: skipped past converged_max
                names = [s for s in selectors(args.selectors) if size <= args.converged_max or s != converged]
                spec = {"data": data, "size": size, "selectors": names, "questions": questions}
                report["sizes"][size][label] = r = run_worker(root, "corpus", spec, args.timeout)
                brief = {k: (v["cold_ms"], v["warm"]) for k, v in r.get("selectors", {}).items()}
                print(f"size {size} {label}: load {r.get('load')} {brief or r}", flush=True)
                save(args.out, report)
    if args.index and "http" not in skip:
        with tempfile.TemporaryDirectory() as cache:
            report["http"] = serve_index(roots, args.index, mmlongbench_questions(args.http_questions + 1),
                                         selectors(args.selectors), Path(cache))
        print(f"http: {json.dumps(report['http'])}", flush=True)
        save(args.out, report)
    if "eval" not in skip:
        for label, root in roots.items():
            spec = {"data": data, "questions": args.eval_questions, "selector": selectors()[0]}
            report["eval"][label] = run_worker(root, "eval", spec, args.timeout)
            print(f"eval {label}: {json.dumps({k: v for k, v in report['eval'][label].items() if k not in ('picks', 'scores')})}", flush=True)
        if len(report["eval"]) == 2 and all("picks" in v for v in report["eval"].values()):
            old, new = report["eval"]["old"], report["eval"]["new"]
            report["eval"]["same_picks"] = sum(a == b for a, b in zip(old["picks"], new["picks"]))
            report["eval"]["same_scores"] = sum(a == b for a, b in zip(old["scores"], new["scores"]))
    save(args.out, report)
    print(tables(report))
    return 0


def save(path: str, report: dict) -> None:
    """Writes the report so far (each part as it finishes)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1))


def tables(report: dict) -> str:
    lines = ["| notes (padded) | code | selector | cold, ms | warm p50, ms | warm p95, ms | load |",
             "|---|---|---|---:|---:|---:|---:|"]
    for size, by_code in report["sizes"].items():
        for label, r in by_code.items():
            if "error" in r:
                lines.append(f"| {size} | {label} | all | {r['error']} | | | |")
                continue
            for s, v in r["selectors"].items():
                lines.append(f"| {r['notes']} ({r['padded']}) | {label} | {s} | {v['cold_ms']:.0f} | "
                             f"{v['warm']['p50']:.1f} | {v['warm']['p95']:.1f} | {r['load']} |")
        if len(by_code) == 2 and all("selectors" in r for r in by_code.values()):
            same = {s: sum(a == b for a, b in zip(by_code["old"]["selectors"][s]["picks"],
                                                 by_code["new"]["selectors"][s]["picks"]))
                    for s in by_code["new"]["selectors"]}
            lines.append(f"| | | same picks old/new | {same} | | | |")
    if report.get("http"):
        h = report["http"]
        lines += ["", f"HTTP /select ({h['questions'] - 1} warm questions, load {h['load']}, same picks "
                      f"{h['same_picks']}):", "| code | selector | first, ms | warm p50 | warm p95 |",
                  "|---|---|---:|---:|---:|"]
        for label, by_sel in h["servers"].items():
            for s, v in by_sel.items():
                lines.append(f"| {label} | {s} | {v['cold_ms']:.0f} | {v['warm']['p50']:.1f} | {v['warm']['p95']:.1f} |")
    for label, e in report["eval"].items():
        if isinstance(e, dict) and "warm_qps" in e:
            lines.append(f"eval {label}: {e['questions']} questions, {e['cold_qps']} q/s cold, {e['warm_qps']} q/s "
                         f"warm (load {e['load']})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

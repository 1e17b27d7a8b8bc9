r"""Checks that behaviour is unchanged between an old checkout and this tree, and prints what was compared.

Run from the repository root, against a checkout of the reference commit::

    git worktree add ../old fea2c25
    python experiments/check_identity.py --old ../old
    python experiments/check_identity.py --old ../old --qasper 40 --mmlongbench 0 --selectors cosine,cds_learned

Each side runs as its own subprocess with ``PYTHONPATH=<that tree>``, the same Python (this one), and its own
output, index, document and compilation caches under ``--work`` (``old/``, ``new/``, ``own/``):

- **evaluation** (``experiments/run_eval.py`` of each tree, ``configs/qasper.py`` and ``configs/mmlongbench.py``,
  the first ``--qasper`` / ``--mmlongbench`` questions, every selector registered in both trees'
  ``cdsjax.core.registry.SPECS`` unless ``--selectors``): the old tree runs first; the new tree then runs on a
  copy of the old run's embedding cache (note and question vectors, and the benchmark's PDF indexes), so both
  select from the same vectors ("same embeddings"). ``records.jsonl`` is compared record by record, every field
  but timings; per selector a record is identical, or has the same picks (``selected``, in order) with other
  fields differing (which fields, and the max |diff| of the scores, the selection weights), or different picks
  (counted; how many of those pick the same set in another order). ``summary.csv`` rows are
  compared by (benchmark, selector, metric). Fields present on one side only are listed, not counted as
  differences (a field added on purpose shows up there).
- **encoders**: the new tree also runs with caches of its own (``own/``, selectors ``--own-selectors``): every
  embedding file both caches hold (same texts, same embedder settings) gives the max |diff| between the two
  encoders, and the records of that run are compared with the old ones as above ("own embeddings").
- **index files**: ``cdsjax index PDF --out DIR`` (``--pdf``) with each tree; ``notes.jsonl``,
  ``elements.jsonl`` and every crop must be byte-identical, the embeddings are compared by max |diff|, the links
  exactly; the same for every PDF index of the benchmark runs (the old cache's indexes vs the own run's).
- **ask**: ``cdsjax ask INDEX QUESTION --json --budget B --no-read --selector S`` for every selector, both trees
  asking the old tree's index (the same note vectors; the question is encoded by each tree's own encoder, whose
  max |diff| is printed). Every field but ``timings`` is compared, crop paths relative to the index; evidence
  ids and order, and the scores' max |diff|, are reported when the answers are not identical.

A rerun reuses the old side's results when its commit and command lines are unchanged (the evaluation
resumes from its records); the new side always runs afresh (its compilation cache is kept).
"""

from __future__ import annotations

import argparse
import csv
import filecmp
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
REFERENCE_COMMIT = "fea2c25"
BENCHMARKS = {"qasper": "configs/qasper.py", "mmlongbench": "configs/mmlongbench.py"}
ASK_QUESTION = "What information does the table in this document give?"
IGNORED_KEYS = ("timings", "seconds", "elapsed", "wall_s")

_SELECTOR_NAMES = "import json; from cdsjax.core.registry import SPECS; print(json.dumps(list(SPECS)))"
_WHERE = "import cdsjax, json; print(json.dumps(cdsjax.__file__))"
_INDEX_ARRAYS = """
import sys, numpy as np
from cdsjax.io.index import load_index
idx = load_index(sys.argv[1])
np.save(sys.argv[2], np.asarray(idx.embeddings)); np.save(sys.argv[3], np.asarray(idx.links))
"""
_QUESTION_VECTOR = """
import sys, numpy as np
from cdsjax.io.embed import Embedder
from cdsjax.io.index import default_config
np.save(sys.argv[2], np.asarray(Embedder(default_config()).encode_queries([sys.argv[1]]), np.float32))
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- running a side


class Side:
    """One tree's runs: its code (``tree``, on PYTHONPATH) and its own caches under ``work``."""

    def __init__(self, name: str, tree: pathlib.Path, work: pathlib.Path):
        self.name, self.tree, self.work = name, tree, work
        self.seconds: Dict[str, float] = {}

    def env(self) -> dict:
        return dict(os.environ, PYTHONPATH=str(self.tree), CDSJAX_CACHE=str(self.work / "home"),
                    CDSJAX_JAX_CACHE=str(self.work / "jax"), PYTHONHASHSEED="0")

    def run(self, args: List[str], *, what: str, stdout=None, check: bool = True) -> subprocess.CompletedProcess:
        """Runs ``python ARGS`` in the tree; stderr goes to ``<work>/logs/<what>.log``; returns the process."""
        logs = self.work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(logs / f"{what.replace('/', '_')}.log", "w") as err:
            proc = subprocess.run([sys.executable, *args], cwd=self.tree, env=self.env(), stderr=err,
                                  stdout=stdout if stdout is not None else subprocess.PIPE, text=True)
        self.seconds[what] = self.seconds.get(what, 0.0) + time.perf_counter() - t0
        if check and proc.returncode != 0:
            tail = (logs / f"{what.replace('/', '_')}.log").read_text(errors="replace").splitlines()[-15:]
            raise SystemExit(f"check_identity: {self.name} side failed at {what} (exit {proc.returncode}); "
                             f"log {logs / what.replace('/', '_')}.log ends:\n  " + "\n  ".join(tail))
        return proc

    def python(self, code: str, *args: str, what: str, check: bool = True) -> Optional[str]:
        """Runs ``python -c CODE ARGS`` in the tree; its stdout, or None when it failed and not ``check``."""
        proc = self.run(["-c", code, *args], what=what, check=check)
        return proc.stdout if proc.returncode == 0 else None


def commit_of(tree: pathlib.Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    head = out.stdout.strip() if out.returncode == 0 else "unknown"
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def stamped(directory: pathlib.Path, stamp: dict) -> bool:
    """True when ``directory`` holds a run with this stamp; otherwise empties it and writes the stamp."""
    path = directory / "stamp.json"
    if path.is_file() and json.loads(path.read_text()) == stamp:
        return True
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    path.write_text(json.dumps(stamp, indent=1))
    return False


def eval_args(side: Side, bench: str, n: int, selectors: List[str], out: pathlib.Path, cache: pathlib.Path,
              data: pathlib.Path) -> List[str]:
    return [str(side.tree / "experiments" / "run_eval.py"), f"--config={side.tree / BENCHMARKS[bench]}",
            f"--config.max_queries={n}", f"--config.selectors={','.join(selectors)}",
            f"--config.output_dir={out}", f"--config.cache_dir={cache}", f"--config.data_root={data}",
            "--noprogress"]


def seed_cache(src: pathlib.Path, dst: pathlib.Path) -> None:
    """Copies an evaluation cache (embeddings, indexes) without its compiled executables."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("jax-compilation", "*.tmp.npy"), symlinks=True)


# ----------------------------------------------------------------------------------------------- comparing JSON


def _numbers(a: Any, b: Any, path: str, out: dict) -> None:
    """Walks two JSON values; ``out`` collects value paths that differ, paths on one side only, and max |diff|."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() | b.keys():
            if any(s in k for s in IGNORED_KEYS):
                continue
            if k not in b:
                out["only_old"].add(f"{path}.{k}".lstrip("."))
            elif k not in a:
                out["only_new"].add(f"{path}.{k}".lstrip("."))
            else:
                _numbers(a[k], b[k], f"{path}.{k}", out)
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for x, y in zip(a, b):
            _numbers(x, y, f"{path}[]", out)
        return
    if a == b and type(a) is type(b):
        return
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) \
            or not isinstance(b, (int, float)):
        out["differ"].add(path.lstrip("."))
        out["nonnumeric"] = True
        return
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return
    out["differ"].add(path.lstrip("."))
    out["max"] = max(out["max"], abs(float(a) - float(b)))


def json_diff(a: Any, b: Any) -> dict:
    """Differences between two JSON values, timings ignored: ``differ`` (paths, list items as ``[]``),
    ``only_old`` / ``only_new`` (keys on one side), ``max`` (max |diff| of differing numbers), ``nonnumeric``."""
    out = {"differ": set(), "only_old": set(), "only_new": set(), "max": 0.0, "nonnumeric": False}
    _numbers(a, b, "", out)
    return out


def read_jsonl(path: pathlib.Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def max_abs_diff(a: List[Optional[float]], b: List[Optional[float]]) -> float:
    """max |a_i - b_i| over two equally long lists of numbers (None entries skipped)."""
    return max((abs(x - y) for x, y in zip(a, b) if x is not None and y is not None), default=0.0)


def record_key(r: dict) -> Tuple:
    return (r.get("benchmark"), r.get("selector"), r.get("budget"), r.get("qid"))


def compare_records(old: List[dict], new: List[dict], selectors: List[str]) -> List[dict]:
    """Per selector: how many records are identical, have the same picks, or differ in their picks."""
    old_by, new_by = {record_key(r): r for r in old}, {record_key(r): r for r in new}
    rows = []
    for sel in selectors:
        keys = sorted(k for k in old_by.keys() | new_by.keys() if k[1] == sel)
        row = {"selector": sel, "records": 0, "identical": 0, "same_picks": 0, "picks_differ": 0, "max": 0.0,
               "missing": 0, "fields": set(), "only_old": set(), "only_new": set(), "order_only": 0}
        for k in keys:
            if k not in old_by or k not in new_by:
                row["missing"] += 1
                continue
            a, b = old_by[k], new_by[k]
            row["records"] += 1
            d = json_diff(a, b)
            row["only_old"] |= d["only_old"]
            row["only_new"] |= d["only_new"]
            if not d["differ"]:
                row["identical"] += 1
            elif a.get("selected") == b.get("selected"):
                row["same_picks"] += 1
                row["max"] = max(row["max"], max_abs_diff(a.get("scores") or [], b.get("scores") or []))
                row["fields"] |= d["differ"]
            else:
                row["picks_differ"] += 1
                row["order_only"] += sorted(a.get("selected") or []) == sorted(b.get("selected") or [])
                row["fields"] |= d["differ"]
        rows.append(row)
    return rows


def compare_summaries(old: pathlib.Path, new: pathlib.Path, *, selectors: Optional[List[str]] = None
                      ) -> Tuple[int, int, List[str]]:
    """Rows of two ``summary.csv`` (of ``selectors``, default all) keyed by (benchmark, selector, metric, budget
    columns): how many are equal, how many in all, which differ."""
    def rows(path):
        with open(path, newline="") as f:
            table = [r for r in csv.DictReader(f) if selectors is None or r.get("selector") in selectors]
        keys = [c for c in (table[0].keys() if table else ()) if c in ("benchmark", "selector", "metric", "budget")]
        return {tuple(r[c] for c in keys): r for r in table}

    a, b = rows(old), rows(new)
    equal = sum(1 for k in a.keys() & b.keys() if a[k] == b[k])
    differ = sorted("/".join(k) for k in a.keys() & b.keys() if a[k] != b[k])
    differ += [f"{'/'.join(k)} (old only)" for k in sorted(a.keys() - b.keys())]
    differ += [f"{'/'.join(k)} (new only)" for k in sorted(b.keys() - a.keys())]
    return equal, len(a.keys() | b.keys()), differ


# ----------------------------------------------------------------------------------------------- comparing files


def npy_max_diff(a: pathlib.Path, b: pathlib.Path) -> Tuple[Optional[float], str]:
    import numpy as np

    x, y = np.load(a), np.load(b)
    if x.shape != y.shape:
        return None, f"shapes {x.shape} vs {y.shape}"
    return float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)), initial=0.0)), f"{x.shape}"


def tree_files(root: pathlib.Path, sub: str) -> Dict[str, pathlib.Path]:
    base = root / sub
    if base.is_file():
        return {sub: base}
    return {str(p.relative_to(root)): p for p in sorted(base.rglob("*")) if p.is_file()} if base.is_dir() else {}


def compare_index_dirs(old_side: Side, new_side: Side, a: pathlib.Path, b: pathlib.Path, tag: str,
                       scratch: pathlib.Path) -> dict:
    """notes.jsonl, elements.jsonl and crops byte for byte; embeddings max |diff| and links, each read by its
    own tree's ``load_index``."""
    import numpy as np

    out = {"files": 0, "equal": 0, "differ": [], "emb": None, "links": None}
    for sub in ("notes.jsonl", "elements.jsonl", "crops"):
        fa, fb = tree_files(a, sub), tree_files(b, sub)
        for rel in sorted(fa.keys() | fb.keys()):
            out["files"] += 1
            if rel in fa and rel in fb and filecmp.cmp(fa[rel], fb[rel], shallow=False):
                out["equal"] += 1
            else:
                out["differ"].append(rel + ("" if rel in fa and rel in fb else " (one side only)"))
    scratch.mkdir(parents=True, exist_ok=True)
    arrays = []
    for side, d in ((old_side, a), (new_side, b)):
        e = (scratch / f"{tag}-{side.name}-emb.npy").resolve()
        l = (scratch / f"{tag}-{side.name}-links.npy").resolve()
        if side.python(_INDEX_ARRAYS, str(d.resolve()), str(e), str(l), what=f"load-index-{tag}",
                       check=False) is None:
            out["differ"].append(f"{side.name} tree cannot load {d} (log {side.work / 'logs'})")
            return out
        arrays.append((np.load(e), np.load(l)))
    (ea, la), (eb, lb) = arrays
    if ea.shape == eb.shape:
        out["emb"] = float(np.max(np.abs(ea.astype(np.float64) - eb), initial=0.0))
    out["links"] = la.shape == lb.shape and bool(np.array_equal(la, lb))
    return out


def cache_files(cache: pathlib.Path) -> Dict[str, str]:
    """Files of an evaluation cache (its compiled executables left out): relative path -> size."""
    return {str(p.relative_to(cache)): str(p.stat().st_size) for p in cache.rglob("*")
            if p.is_file() and "jax-compilation" not in p.relative_to(cache).parts}


def index_dirs(cache: pathlib.Path) -> Dict[str, pathlib.Path]:
    """Index directories (those with a manifest.json and notes.jsonl) under an evaluation cache, by their path
    inside it; the document-cache entries they were assembled from are left out."""
    return {str(p.parent.relative_to(cache)): p.parent for p in sorted(cache.rglob("manifest.json"))
            if (p.parent / "notes.jsonl").is_file()}


# ----------------------------------------------------------------------------------------------- ask


def relative_paths(answer: dict, index: pathlib.Path) -> dict:
    for ev in answer.get("evidence") or []:
        for k in ("image_path", "crop_path"):
            if ev.get(k):
                p = pathlib.Path(ev[k])
                try:
                    ev[k] = str(p.resolve().relative_to(index.resolve()))
                except ValueError:
                    ev[k] = p.name
    return answer


def ask_one(side: Side, index: pathlib.Path, selector: str, budget: int, question: str) -> dict:
    proc = side.run(["-m", "cdsjax.cli", "ask", str(index), question, "--json", "--budget", str(budget),
                     "--no-read", "--selector", selector], what=f"ask-{selector}")
    return relative_paths(json.loads(proc.stdout), index)


# ----------------------------------------------------------------------------------------------- table


def links_word(equal: Optional[bool]) -> str:
    return "-" if equal is None else "equal" if equal else "differ"


def fmt(x: Optional[float]) -> str:
    return "-" if x is None else ("0" if x == 0 else f"{x:.1e}")


def print_table(title: str, header: List[str], rows: Iterable[List[Any]]) -> None:
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


RECORD_HEADER = ["benchmark", "selector", "records", "identical", "same picks, fields differ",
                 "scores max abs diff (same picks)", "picks differ", "verdict", "notes"]


def record_rows(bench: str, rows: List[dict]) -> List[List[Any]]:
    out = []
    for r in rows:
        verdict = ("identical" if r["records"] and r["identical"] == r["records"] and not r["missing"]
                   else "picks identical, other fields differ" if not r["picks_differ"] and not r["missing"]
                   else "picks differ" if r["picks_differ"] else "records missing")
        notes = []
        if r["fields"]:
            notes.append("differ: " + ", ".join(sorted(r["fields"])[:6]) + (" ..." if len(r["fields"]) > 6 else ""))
        if r["order_only"]:
            notes.append(f"{r['order_only']} same set, other order")
        if r["only_new"]:
            notes.append("new only: " + ", ".join(sorted(r["only_new"])))
        if r["only_old"]:
            notes.append("old only: " + ", ".join(sorted(r["only_old"])))
        if r["missing"]:
            notes.append(f"{r['missing']} on one side only")
        out.append([bench, r["selector"], r["records"], r["identical"], r["same_picks"],
                    fmt(r["max"]) if r["same_picks"] else "-", r["picks_differ"], verdict,
                    "; ".join(notes)])
    return out


# ----------------------------------------------------------------------------------------------- main


def default_data() -> Optional[pathlib.Path]:
    """$CDSJAX_DATA, else ../shared/data from the working directory, else from the repository root."""
    candidates = [pathlib.Path(os.environ["CDSJAX_DATA"])] if os.environ.get("CDSJAX_DATA") else []
    candidates += [pathlib.Path.cwd() / "../shared/data", ROOT / "../shared/data"]
    for c in candidates:
        if c.expanduser().is_dir():
            return c.expanduser().resolve()
    return None


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help=f"checkout of the reference code (git worktree add DIR "
                    f"{REFERENCE_COMMIT})")
    ap.add_argument("--new", default=str(ROOT), help="the tree to check (default: this repository)")
    ap.add_argument("--ref", default=REFERENCE_COMMIT, help="commit --old should be at (a mismatch is printed)")
    ap.add_argument("--data", default=None, help="benchmark data (default: $CDSJAX_DATA, else ../shared/data)")
    ap.add_argument("--work", default="runs/identity", help="where both sides write (default: runs/identity)")
    ap.add_argument("--qasper", type=int, default=12, help="QASPER questions (0: skip)")
    ap.add_argument("--mmlongbench", type=int, default=10, help="MMLongBench-Doc questions (0: skip)")
    ap.add_argument("--selectors", default=None, help="comma-separated registry names (default: every selector "
                    "registered in both trees)")
    ap.add_argument("--own-selectors", default=None, help="selectors of the new tree's run on its own caches "
                    "(default: the same as --selectors; 'none': skip that run)")
    ap.add_argument("--pdf", default=None, help="PDF for the index and ask checks (default: <data>/pdfs/"
                    "multicolumn.pdf; 'none': skip)")
    ap.add_argument("--budget", type=int, default=4, help="ask --budget (default 4)")
    ap.add_argument("--question", default=ASK_QUESTION, help="the question asked")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    old_tree, new_tree = pathlib.Path(args.old).resolve(), pathlib.Path(args.new).resolve()
    for t in (old_tree, new_tree):
        if not (t / "cdsjax" / "__init__.py").is_file():
            raise SystemExit(f"check_identity: {t} is not a cdsjax checkout (no cdsjax/__init__.py)")
    data = pathlib.Path(args.data).expanduser().resolve() if args.data else default_data()
    if data is None or not data.is_dir():
        raise SystemExit(f"check_identity: benchmark data not found ({args.data or '$CDSJAX_DATA, ../shared/data'}"
                         "); pass --data DIR")
    work = pathlib.Path(args.work).resolve()
    old = Side("old", old_tree, work / "old")
    new = Side("new", new_tree, work / "new")
    own = Side("own", new_tree, work / "own")
    old_commit, new_commit = commit_of(old_tree), commit_of(new_tree)
    log(f"old {old_tree} at {old_commit}; new {new_tree} at {new_commit}; data {data}; work {work}")
    if not old_commit.startswith(subprocess.run(["git", "-C", str(old_tree), "rev-parse", args.ref],
                                                capture_output=True, text=True).stdout.strip() or args.ref):
        log(f"warning: --old is at {old_commit}, not at --ref {args.ref}")
    for side in (old, new):
        where = pathlib.Path(json.loads(side.python(_WHERE, what="where")))
        if side.tree not in where.parents:
            raise SystemExit(f"check_identity: the {side.name} side imports cdsjax from {where}, not from "
                             f"{side.tree} (is cdsjax installed non-editable?)")
    names = {s.name: json.loads(s.python(_SELECTOR_NAMES, what="selectors")) for s in (old, new)}
    kept = [n for n in names["old"] if n in names["new"]]
    dropped = {k: [n for n in v if n not in kept] for k, v in names.items()}
    if args.selectors:
        wanted = [s.strip() for s in args.selectors.split(",") if s.strip()]
        unknown = [s for s in wanted if s not in kept]
        if unknown:
            raise SystemExit(f"check_identity: not registered in both trees: {', '.join(unknown)} "
                             f"(both have: {', '.join(kept)})")
        kept = wanted
    own_selectors = kept if args.own_selectors is None else (
        [] if args.own_selectors == "none" else [s.strip() for s in args.own_selectors.split(",") if s.strip()])
    log(f"selectors ({len(kept)}): {', '.join(kept)}; not compared: old {dropped['old'] or '-'}, "
        f"new {dropped['new'] or '-'}")

    record_table, summary_table, emb_table, index_table, own_table, reads = [], [], [], [], [], []
    for bench, n in (("qasper", args.qasper), ("mmlongbench", args.mmlongbench)):
        if n <= 0:
            continue
        o_dir = old.work / bench
        o_args = eval_args(old, bench, n, kept, o_dir / "out", o_dir / "cache", data)
        reused = stamped(o_dir, {"commit": old_commit, "args": o_args})
        log(f"{bench}: old tree, {n} questions x {len(kept)} selectors{' (resuming)' if reused else ''}")
        old.run(o_args, what=f"eval-{bench}")
        log(f"{bench}: old done ({old.seconds[f'eval-{bench}']:.0f} s); new tree on the old embedding cache")
        n_dir = new.work / bench
        if n_dir.exists():
            shutil.rmtree(n_dir)
        seed_cache(o_dir / "cache", n_dir / "cache")
        before = cache_files(n_dir / "cache")
        new.run(eval_args(new, bench, n, kept, n_dir / "out", n_dir / "cache", data), what=f"eval-{bench}")
        written = sorted(k for k, v in cache_files(n_dir / "cache").items() if before.get(k) != v)
        if written:
            log(f"warning: the new tree wrote embeddings or indexes of its own ({', '.join(written[:5])}): their "
                "cache keys changed, so it did not select from the old vectors")
        reads.append([bench, len(before), "yes" if not written else f"no: wrote {len(written)} files ("
                      + ", ".join(written[:3]) + ")"])
        log(f"{bench}: new done ({new.seconds[f'eval-{bench}']:.0f} s)")
        old_recs, new_recs = read_jsonl(o_dir / "out" / "records.jsonl"), read_jsonl(n_dir / "out" / "records.jsonl")
        record_table += record_rows(bench, compare_records(old_recs, new_recs, kept))
        eq, total, differ = compare_summaries(o_dir / "out" / "summary.csv", n_dir / "out" / "summary.csv")
        summary_table.append([bench, "same embeddings", f"{eq} of {total}", ", ".join(differ[:8]) or "-"])

        if own_selectors:
            w_dir = own.work / bench
            if w_dir.exists():
                shutil.rmtree(w_dir)
            log(f"{bench}: new tree on caches of its own (its encoder), {len(own_selectors)} selectors")
            own.run(eval_args(own, bench, n, own_selectors, w_dir / "out", w_dir / "cache", data),
                    what=f"eval-{bench}")
            log(f"{bench}: own done ({own.seconds[f'eval-{bench}']:.0f} s)")
            for f in sorted((o_dir / "cache").glob("*.npy")):
                g = w_dir / "cache" / f.name
                if g.is_file():
                    diff, shape = npy_max_diff(f, g)
                    kind = "questions" if "-q-" in f.name else "notes"
                    emb_table.append([bench, f"{kind} {shape}", fmt(diff)])
                else:
                    emb_table.append([bench, f.name, "not in the own cache (key changed?)"])
            o_idx, w_idx = index_dirs(o_dir / "cache"), index_dirs(w_dir / "cache")
            for rel in sorted(o_idx.keys() & w_idx.keys()):
                c = compare_index_dirs(old, own, o_idx[rel], w_idx[rel], f"{bench}-{len(index_table)}",
                                       work / "scratch")
                index_table.append([f"{bench} cache {rel}", f"{c['equal']} of {c['files']}",
                                    ", ".join(c["differ"][:5]) or "-", fmt(c["emb"]),
                                    links_word(c["links"])])
                emb_table.append([bench, f"index {rel} notes", fmt(c["emb"])])
            for rel in sorted(o_idx.keys() ^ w_idx.keys()):
                index_table.append([f"{bench} cache {rel}", "in one cache only", "-", "-", "-"])
            own_recs = read_jsonl(w_dir / "out" / "records.jsonl")
            own_table += record_rows(bench, compare_records(
                [r for r in old_recs if r.get("selector") in own_selectors], own_recs, own_selectors))
            eq, total, differ = compare_summaries(o_dir / "out" / "summary.csv", w_dir / "out" / "summary.csv",
                                                  selectors=own_selectors)
            summary_table.append([bench, "own embeddings", f"{eq} of {total}", ", ".join(differ[:8]) or "-"])

    ask_table, question_diff = [], None
    pdf = None if args.pdf == "none" else pathlib.Path(args.pdf or data / "pdfs" / "multicolumn.pdf").resolve()
    if pdf is not None:
        import numpy as np

        indexes = {}
        for side in (old, new):
            d = side.work / "index"
            if d.exists():
                shutil.rmtree(d)
            for entry in (side.work / "home").glob("*"):  # a fresh document cache; an ONNX export is kept
                if entry.name != "onnx":
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            log(f"index {pdf.name} with the {side.name} tree")
            side.run(["-m", "cdsjax.cli", "index", str(pdf), "--out", str(d), "--no-progress"], what="index")
            indexes[side.name] = d
        c = compare_index_dirs(old, new, indexes["old"], indexes["new"], "pdf", work / "scratch")
        index_table.append([f"`cdsjax index {pdf.name}`", f"{c['equal']} of {c['files']}",
                            ", ".join(c["differ"][:5]) or "-", fmt(c["emb"]), links_word(c["links"])])
        emb_table.append(["index", f"{pdf.name} notes", fmt(c["emb"])])
        vecs = []
        for side in (old, new):
            path = work / "scratch" / f"question-{side.name}.npy"
            side.python(_QUESTION_VECTOR, args.question, str(path), what="question-vector")
            vecs.append(np.load(path))
        question_diff = float(np.max(np.abs(vecs[0].astype(np.float64) - vecs[1])))
        emb_table.append(["ask", "question vector", fmt(question_diff)])
        for sel in kept:
            log(f"ask --selector {sel}: old, new (both on the old tree's index)")
            a = ask_one(old, indexes["old"], sel, args.budget, args.question)
            b = ask_one(new, indexes["old"], sel, args.budget, args.question)
            d = json_diff(a, b)
            ids_a = [e.get("note_id") for e in a.get("evidence") or []]
            ids_b = [e.get("note_id") for e in b.get("evidence") or []]
            sa = [e.get("score") for e in a.get("evidence") or []]
            sb = [e.get("score") for e in b.get("evidence") or []]
            smax = max_abs_diff(sa, sb) if ids_a == ids_b else None
            verdict = ("identical" if not d["differ"] else "same evidence, other fields differ"
                       if ids_a == ids_b else "evidence differs")
            notes = []
            if d["differ"]:
                notes.append("differ: " + ", ".join(sorted(d["differ"])[:6]))
            if d["only_new"]:
                notes.append("new only: " + ", ".join(sorted(d["only_new"])))
            if d["only_old"]:
                notes.append("old only: " + ", ".join(sorted(d["only_old"])))
            if ids_a != ids_b:
                notes.append(f"old {ids_a} new {ids_b}")
            ask_table.append([sel, verdict, "yes" if ids_a == ids_b else "no", fmt(smax),
                              "; ".join(notes) or "-"])

    print(f"\n## Behaviour check: old {old_tree.name} at {old_commit[:12]} vs new {new_tree.name} at "
          f"{new_commit[:12]}")
    print(f"\nselectors compared ({len(kept)}): {', '.join(kept)}")
    if any(dropped.values()):
        print(f"registered in one tree only: old {dropped['old'] or '-'}, new {dropped['new'] or '-'}")
    if record_table:
        print_table("Evaluation records, both trees on the old tree's embedding cache (every field but timings)",
                    RECORD_HEADER, record_table)
    if reads:
        print_table("Did the new tree read the old tree's embedding cache?", ["benchmark", "files seeded",
                    "read them without writing its own"], reads)
    if summary_table:
        print_table("summary.csv rows (benchmark, selector, metric)", ["benchmark", "run", "rows equal",
                                                                      "rows that differ"], summary_table)
    if emb_table:
        print_table("Encoders: max |diff| of the vectors of the same texts, old vs new encoder",
                    ["where", "what", "max abs diff"], emb_table)
    if own_table:
        print_table("Evaluation records, the new tree on its own embeddings (its encoder)",
                    RECORD_HEADER, own_table)
    if index_table:
        print_table("Index files (notes.jsonl, elements.jsonl, crops byte for byte; embeddings; links)",
                    ["index", "files byte-identical", "files that differ", "embeddings max abs diff", "links"],
                    index_table)
    if ask_table:
        print_table(f"`cdsjax ask --json --budget {args.budget} --no-read` on {pdf.name}, both trees on the old "
                    f"tree's index (question vectors differ by {fmt(question_diff)}; every field but timings, "
                    "crop paths relative)",
                    ["selector", "verdict", "same evidence ids and order", "scores max abs diff", "notes"],
                    ask_table)
    steps = []
    for side in (old, new, own):
        groups: Dict[str, List[float]] = {}
        for k, v in side.seconds.items():
            step = next((p for p in ("ask", "load-index") if k.startswith(p + "-")), k)
            groups.setdefault(step, []).append(v)
        steps += [[side.name, k if len(v) == 1 else f"{k} (x{len(v)})", f"{sum(v):.0f}"] for k, v in groups.items()]
    print_table("Seconds", ["side", "step", "seconds"],
                steps + [["all", "total", f"{time.perf_counter() - t_start:.0f}"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())

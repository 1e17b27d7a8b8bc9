r"""Which game beats the page rule? Structured read-outs, the page game and the sparse regime against cosine,
``cosine-pages`` and tuned MMR / k-DPP, cross-validated by document, with recall@B and has-answer@B (issue 34).

Usage (from the repository root; one benchmark per run; ``--pool_size=5`` for 5-document pools)::

    python experiments/structured_cv.py --benchmark=mmlongbench --cache_dir=CACHE_M \
        --output_dir=runs/structured/mmlongbench [--pool_size=5 --grid=pool]
    python experiments/structured_cv.py --benchmark=qasper --cache_dir=CACHE_Q --output_dir=runs/structured/qasper
    python experiments/structured_cv.py --merge_runs=runs/structured/mmlongbench,runs/structured/qasper \
        --output_dir=runs/structured/merged     # transfer and fit on both, from the two runs' values

Every selector is reduced to its **ranking** of all the notes of a question (computed once per setting, in JAX:
cosine; MMR and k-DPP greedy to 80 picks, then cosine; the learned game's equilibrium, support by weight then its
fill rule; the page game's pages, best notes first; the sparse learned game's -- both in
``experiments/page_game.py``), and read three ways: top-B (no read-out), or at most k = 1 or 2 notes per page per
round (``cdsjax.core.readouts``). On QASPER a "page" is a paragraph group, as for ``cosine-pages``. A *family*
is a ranking with its knob grid:

* ``cosine`` (no knob), ``mmr`` (lambda), ``dpp`` (theta), the learned game (the fit's grid starts: the grid
  does the fit's work, RESULTS "Learned CDS: the model and the fit"), the page game (beta; alpha factor 1 or the sparse 0.5), the
  sparse learned game (alpha factor 0.5 or 0 of the spectral bound, grid starts) with the query kept in the
  support by peeling (``keep="peel"``) or by reading the bound's game where it leaves (``keep="bound"``);
* ``any game (CV structure)``: every game setting with every read-out, one choice.

Folds: 5 by document, seed 0 (as experiments/learned_cv.py). With pools, each fold's pools are drawn inside its
own documents, so a test pool holds no training document and a knob is chosen on pools of training documents
only. For each test fold each family picks its knob and its read-out on the other folds' questions by mean
recall@B, separately for "read-out none", "read-out k in {1, 2}" and "chosen among none, 1, 2"; the test fold's
questions are scored with both metrics. ``--merge_runs``: transfer (chosen on all of one benchmark, scored on the
other) and fit on both (chosen on the other folds of both benchmarks, each weighed the same). Paired bootstrap
differences (10,000 resamples) against ``cosine-pages`` and ``cosine`` with win / tie / loss. Outputs:
``values.npz`` (every ranking's per-question metrics; a rerun resumes after the last setting), ``summary.json``,
``tables.md``.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Dict, List

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from absl import app, flags  # noqa: E402

_BENCH = flags.DEFINE_string("benchmark", "mmlongbench", "mmlongbench or qasper")
_MAXDOCS = flags.DEFINE_integer("max_documents", None, "first documents of the benchmark (None: all)")
_CACHE = flags.DEFINE_string("cache_dir", "", "the benchmark's index / embedding cache")
_OUT = flags.DEFINE_string("output_dir", "runs/structured", "where to write")
_BUDGETS = flags.DEFINE_list("budgets", ["5", "10"], "budgets B")
_RESAMPLES = flags.DEFINE_integer("num_resamples", 10_000, "bootstrap resamples")
_POOL = flags.DEFINE_integer("pool_size", 1, "documents per question: 1, or pools drawn inside each test fold's "
                             "documents (a knob is chosen on the other folds' pools, drawn inside their documents)")
_GRID = flags.DEFINE_enum("grid", "full", ["full", "lean", "pool", "bound"], "the settings (see settings())")
_MERGE = flags.DEFINE_list("merge_runs", None, "two output directories (one per benchmark, same settings and pool "
                           "size): write the transfer and fit-on-both tables into --output_dir, without loading data")

GREEDY_DEPTH = 80
READOUTS = (0, 1, 2)  # 0: top-B (no read-out); k: at most k notes per page per round


SPARSE_THETAS = ({"beta": 0.03, "w_page": -1.0}, {"beta": 0.3, "w_page": -1.0}, {"beta": 0.3})


def settings(grid: str = "full"):
    """``[(family, label, kind, params)]``: every ranking to compute. ``grid``: ``"full"``; ``"lean"``, fewer points
    per family (the learned game at the shipped θ and its neighbours); ``"pool"``, fewer again (5-document pools:
    each setting solves every question's pool); ``"bound"`` adds the sparse game read at the bound where the query
    leaves (last session's regime) to the full grid."""
    from cdsjax.learn.fit_config import DEFAULT_STARTS

    if grid not in ("full", "lean", "pool", "bound"):
        raise ValueError(f"grid must be full, lean, pool or bound, got {grid!r}")
    full = grid in ("full", "bound")
    starts = DEFAULT_STARTS if full else [s for s in DEFAULT_STARTS if s in SPARSE_THETAS[:1 if grid == "pool" else 3]]
    lams = (0.3, 0.5, 0.7, 0.9) if grid != "pool" else (0.7, 0.9)
    dpps = (1.0, 3.0, 10.0) if grid != "pool" else (3.0, 10.0)
    betas = (0.03, 0.1, 0.3, 1.0) if full else (0.03, 0.3) if grid == "lean" else (0.03,)
    factors = (1.0, 0.5) if grid != "pool" else (1.0,)
    thetas = SPARSE_THETAS if full else SPARSE_THETAS[:1 if grid == "pool" else 2]
    sparse_f = (0.5, 0.0) if grid != "pool" else (0.5,)
    out = [("cosine ranking", "cosine top-B", "rank_cosine", None)]
    out += [("mmr ranking", f"mmr lam={v:g}", "rank_mmr", v) for v in lams]
    out += [("dpp ranking", f"dpp theta={v:g}", "rank_dpp", v) for v in dpps]
    out += [("learned game", "learned " + _theta_label(s), "rank_learned", dict(s)) for s in starts]
    out += [("page game", f"pages beta={b:g} f={f:g}", "rank_pages", {"beta": b, "alpha_factor": f})
            for f in factors for b in betas]
    for keep, family in (("bound", "sparse learned game (bound)"), ("peel", "sparse learned game (peel)")):
        if keep == "bound" and grid != "bound":
            continue
        out += [(family, f"sparse-{keep} " + _theta_label(t) + f" f={f:g}", "rank_sparse", (dict(t), f, keep))
                for f in sparse_f for t in thetas]
    return out


def _theta_label(theta: dict) -> str:
    return ",".join(f"{k}={v:g}" for k, v in theta.items())


def _rank_fn(kind: str, keep: str = "peel"):
    """``f(notes, query, valid, links, pages_game, units, doc_ids, kinds, param) -> (rank [n], kept [])`` (jittable;
    ``kept``: the sparse regime's equilibrium kept the query, True for every other ranking)."""
    import jax.numpy as jnp

    from cdsjax.core.readouts import ranking_of
    from experiments.page_game import page_game_ranking, sparse_learned_ranking
    from cdsjax.core.baselines import select_cosine, select_dpp, select_mmr
    from cdsjax.core.strategies.cds import cds
    from cdsjax.core.strategies.select import Single
    from cdsjax.core.types import CDSProblem

    def f(*args):
        out = g(*args)
        return out if isinstance(out, tuple) else (out, jnp.asarray(True))

    def g(notes, query, valid, links, pages_game, units, doc_ids, kinds, param):
        n = notes.shape[0]
        if kind == "rank_cosine":
            return ranking_of(lambda b: lambda z, q, v: select_cosine(z, q, v, budget=b), notes, query, valid)[0]
        if kind == "rank_mmr":
            return ranking_of(lambda b: lambda z, q, v: select_mmr(z, q, v, budget=b, lam=param), notes, query,
                                valid, min(n, GREEDY_DEPTH))[0]
        if kind == "rank_dpp":
            return ranking_of(lambda b: lambda z, q, v: select_dpp(z, q, v, budget=b, theta=param), notes, query,
                                valid, min(n, GREEDY_DEPTH))[0]
        if kind == "rank_learned":
            def build(b):
                problem = CDSProblem.create(notes, query, valid, links=links, pages=pages_game, doc_ids=doc_ids,
                                            kinds=kinds)
                return lambda z, q, v: cds(problem, Single(), param, budget=b)
            return ranking_of(build, notes, query, valid)[0]
        if kind == "rank_pages":
            rank, _, kept = page_game_ranking(notes, query, valid, units, param, doc_ids=doc_ids)
            return rank, kept
        if kind == "rank_sparse":
            theta, factor = param
            rank, _, kept = sparse_learned_ranking(notes, query, valid, theta, factor, links=links,
                                                     pages=pages_game, doc_ids=doc_ids, kinds=kinds, keep=keep)
            return rank, kept
        raise ValueError(kind)

    return f


def _param(kind, p):
    from cdsjax.core.games.learned import LearnedParams
    from experiments.page_game import PageGameParams

    if kind == "rank_learned":
        return LearnedParams.from_dict(p)
    if kind == "rank_pages":
        return PageGameParams(**p)
    if kind == "rank_sparse":
        return (LearnedParams.from_dict(p[0]), float(p[1]))
    return p


def _keep(kind, p) -> str:
    return p[2] if kind == "rank_sparse" else "peel"


def rankings(problems, kind, param, buckets=(64, 128, 256, 512, 1024, 2048, 4096), chunk=16):
    """``(ranks, kept)``: each problem's rank positions under one setting, and whether the query stayed in the
    support (sparse regime) (padded into buckets, jit + vmap, the knob traced where it
    is a pytree so one compilation serves a family)."""
    import jax
    import jax.numpy as jnp

    traced = kind in ("rank_learned", "rank_pages", "rank_sparse")
    f = _rank_fn(kind, _keep(kind, param))
    if traced:
        call = _CALLS.setdefault((kind, _keep(kind, param)), jax.jit(jax.vmap(f, in_axes=(0,) * 8 + (None,))))
        run = lambda *a: call(*a, _param(kind, param))
    else:
        key = (kind, param)
        call = _CALLS.setdefault(key, jax.jit(jax.vmap(lambda *a: f(*a, param))))
        run = call
    out: List[np.ndarray] = [None] * len(problems)
    kept = np.ones(len(problems), bool)
    groups: Dict[int, list] = {}
    for i, p in enumerate(problems):
        n = p.notes.shape[0]
        groups.setdefault(min(b for b in buckets if b >= n), []).append(i)
    for size, members in sorted(groups.items()):
        step = max(1, min(chunk, (chunk * 256 * 256) // (size * size)))  # ~ the memory of 16 problems of 256 notes
        for s in range(0, len(members), step):
            rows = members[s:s + step]
            batch = rows + [rows[0]] * (step - len(rows)) if len(members) > step else rows
            arrays = [_padded(problems[i], size) for i in batch]
            stacked = [jnp.asarray(np.stack([a[j] for a in arrays])) for j in range(8)]
            ranks, keeps = (np.asarray(a) for a in run(*stacked))
            for r, kp, i in zip(ranks, keeps, rows):
                out[i] = r[: problems[i].notes.shape[0]]
                kept[i] = bool(kp)
    return out, kept


_CALLS: dict = {}


def _padded(p, size):
    n, d = p.notes.shape
    game = p.structure(pages_only=True)
    units = p.structure(pages_only=False)
    z = np.zeros((size, d), np.float32)
    z[:n] = p.notes
    valid = np.zeros(size, bool)
    valid[:n] = True
    links = np.zeros((size, size), bool)
    links[:n, :n] = p.links
    pad = lambda a: np.concatenate([a, np.zeros(size - n, np.int32)])
    return [z, np.asarray(p.query_emb, np.float32), valid, links, pad(game["pages"]), pad(units["pages"]),
            pad(game["doc_ids"]), pad(game["kinds"])]


def readout(rank: np.ndarray, units: np.ndarray, budget: int, k: int) -> List[int]:
    """NumPy twin of :func:`cdsjax.core.readouts.structured_readout` (``k = 0``: top-B of the ranking)."""
    order = np.argsort(rank, kind="stable")
    if k == 0:
        return [int(i) for i in order[:budget]]
    seen: Dict[int, int] = {}
    group = np.empty(len(rank), np.int64)
    for i in order:
        u = int(units[i])
        group[i] = seen.get(u, 0) // k
        seen[u] = seen.get(u, 0) + 1
    picks = sorted(range(len(rank)), key=lambda i: (group[i], rank[i]))
    return picks[:budget]


def score(problem, idx, kind):
    from cdsjax.eval.scoring import answer_hit
    from experiments.learned_cv import recall

    import types

    sel = types.SimpleNamespace(indices=np.asarray(idx + [0]), selected_valid=np.asarray([True] * len(idx) + [False]))
    return recall(problem, sel, kind), answer_hit(problem, idx)


def families(labels_of_settings) -> Dict[str, List[str]]:
    """``family -> [labels]`` of the settings, and the "any game" family over every game setting."""
    fams: Dict[str, List[str]] = {}
    for family, label, _, _ in labels_of_settings:
        fams.setdefault(family, []).append(label)
    games = [lab for f, labs in fams.items() if f not in BASELINES for lab in labs]
    if games:
        fams["any game (CV structure)"] = games
    return fams


BASELINES = ("cosine ranking", "mmr ranking", "dpp ranking")
REGIMES = {"none": (0,), "read": (1, 2), "cv": READOUTS}


def choose(values, labels, ks, budget, train_sets):
    """The ``(label, k)`` with the best mean recall@budget over ``train_sets`` (``[(values, mask)]``, one per
    benchmark: a fit on both weighs each benchmark the same); ties: the first of the grid."""
    def score(c):
        return float(np.mean([np.nanmean(v[(c[0], c[1], budget, "recall")][m]) for v, m in train_sets]))
    return max(((lab, k) for lab in labels for k in ks), key=score)


def cells(fams, budgets):
    """(family, labels, regime, read-outs k, budget) of every table row; cosine's "read" regime is k = 1 only
    (``cosine-pages``)."""
    for fam, labels in fams.items():
        for reg, ks in REGIMES.items():
            ks = (1,) if fam == "cosine ranking" and reg == "read" else ks
            for b in budgets:
                yield fam, labels, reg, ks, b


def cv_rows(values, qfold, fams, budgets, folds=5):
    """``rows[(family, regime, B)] = {metric: [q]}`` and the choices: each test fold scored with the knob and
    read-out chosen on the other folds."""
    rows, chosen = {}, {}
    for fam, labels, reg, ks, b in cells(fams, budgets):
        vals = {m: np.full(len(qfold), np.nan) for m in ("recall", "has_answer")}
        picks = []
        for f in range(folds):
            best = choose(values, labels, ks, b, [(values, qfold != f)])
            picks.append(best)
            for m in vals:
                vals[m][qfold == f] = values[(best[0], best[1], b, m)][qfold == f]
        rows[(fam, reg, b)] = vals
        chosen[f"{fam}|{reg}|{b}"] = [f"{lab} k={k}" for lab, k in picks]
    return rows, chosen


def summarize(rows, head: dict, resamples: int) -> dict:
    """Means with bootstrap intervals and paired differences against the page rule and cosine's top-B."""
    from cdsjax.eval.metrics import mean_ci, paired_difference

    ref = {"page rule": ("cosine ranking", "read"), "cosine top-B": ("cosine ranking", "none")}
    summary = {**head, "rows": []}
    for (fam, reg, b), vals in rows.items():
        entry = {"family": fam, "readout": reg, "budget": b}
        for metric, v in vals.items():
            entry[metric] = list(mean_ci(v, num_resamples=resamples))
            for rname, key in ref.items():
                entry[f"{metric} - {rname}"] = paired_difference(v, rows[(key[0], key[1], b)][metric],
                                                                 num_resamples=resamples)
        summary["rows"].append(entry)
    return summary


def load_values(path: pathlib.Path) -> tuple:
    """``(values, meta)`` of a ``values.npz``: ``(label, k, B, metric) -> [q]`` and the per-question arrays."""
    z = np.load(path, allow_pickle=False)
    values, meta = {}, {}
    for key in z.files:
        if key.startswith("meta|"):
            meta[key[5:]] = z[key]
            continue
        label, k, b, metric = key.split("|")
        values[(label, int(k), int(b), metric)] = z[key]
    return values, meta


def main(argv):
    if _MERGE.value:
        return merge(_MERGE.value, _OUT.value, _RESAMPLES.value)
    import configs.learned_cv as C
    from cdsjax.eval.folds import document_folds
    from experiments import learned_cv as L

    name = _BENCH.value
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    cfg = C.get_config()
    cfg.cache_dirs[name] = _CACHE.value
    cfg.output_dir = str(out)
    cfg.max_documents = _MAXDOCS.value
    data = L.load_data(name, cfg)
    folds = document_folds(list(data.notes), 5, seed=0)
    problems, qfold = [], []
    for f in folds:  # pools drawn inside each fold's documents: a test pool never holds a training document
        side = L._problems(data, list(f.test), _POOL.value, 0)
        problems += side
        qfold += [f.index] * len(side)
    qfold = np.asarray(qfold)
    units = [p.structure(pages_only=False)["pages"] for p in problems]
    budgets = [int(b) for b in _BUDGETS.value]
    covered = sum(p.answer_targets() is not None for p in problems)
    print(f"{name}: {len(problems)} questions with gold, {covered} covered by has-answer, {len(data.notes)} documents, "
          f"pools of {_POOL.value}", flush=True)
    grid = settings(_GRID.value)
    path = out / "values.npz"
    values, meta = load_values(path) if path.is_file() else ({}, {})
    if values and not (np.array_equal(meta.get("qfold", []), qfold) and
                       np.array_equal(meta.get("qid", []), [str(p.query.qid) for p in problems])):
        raise app.UsageError(f"{path} holds other questions (another pool size or document count): remove it")
    diag = {}
    for family, label, kind, param in grid:
        if all((label, k, b, m) in values for k in READOUTS for b in budgets for m in ("recall", "has_answer")):
            continue  # a rerun resumes after the last setting written
        t0 = time.perf_counter()
        ranks, kept = rankings(problems, kind, param)
        diag[label] = float(kept.mean())
        for k in READOUTS:
            for b in budgets:
                rows = [score(p, readout(r, u, b, k), data.kind) for p, r, u in zip(problems, ranks, units)]
                values[(label, k, b, "recall")] = np.asarray([r[0] for r in rows], float)
                values[(label, k, b, "has_answer")] = np.asarray([r[1] for r in rows], float)
        print(f"  {label}: {time.perf_counter() - t0:.0f} s; recall@10 none/k1/k2 "
              + " / ".join(f"{np.nanmean(values[(label, k, 10, 'recall')]):.3f}" for k in READOUTS)
              + ("" if kept.all() else f"; query kept in the support on {kept.mean():.0%}"), flush=True)
        meta.update({"qfold": qfold, "qid": np.asarray([str(p.query.qid) for p in problems]),
                     **{f"kept|{k}": np.asarray(v) for k, v in diag.items()}})
        np.savez_compressed(path.with_suffix(".tmp.npz"), **{"|".join(map(str, k)): v for k, v in values.items()},
                            **{f"meta|{k}": v for k, v in meta.items()})
        path.with_suffix(".tmp.npz").replace(path)
    rows, chosen = cv_rows(values, qfold, families(grid), budgets)
    head = {"benchmark": name, "task": "cv", "pool_size": _POOL.value, "questions": len(problems), "covered": covered,
            "documents": len(data.notes), "chosen": chosen,
            "query_kept": {k[5:]: float(v) for k, v in meta.items() if k.startswith("kept|")}}
    write(out, summarize(rows, head, _RESAMPLES.value))


def write(out: pathlib.Path, summary: dict) -> None:
    from cdsjax.io.provenance import provenance

    summary = {**summary, "provenance": summary.get("provenance") or provenance()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    text = tables(summary)
    (out / "tables.md").write_text(text)
    print(text)


def merge(dirs, output_dir: str, resamples: int) -> None:
    """Transfer (choose on every question of one benchmark, score the other's) and fit on both (fold i of each
    benchmark scored with the choice on the other folds of both, each benchmark weighed the same)."""
    if len(dirs) != 2:
        raise app.UsageError("--merge_runs takes two output directories")
    runs = []
    for d in dirs:
        info = json.loads((pathlib.Path(d) / "summary.json").read_text())
        runs.append((info, *load_values(pathlib.Path(d) / "values.npz")))
    labels = set.intersection(*({k[0] for k in v} for _, v, _ in runs))
    grid = [g for g in settings("bound") if g[1] in labels]
    fams = families(grid)
    budgets = sorted({k[2] for k in runs[0][1]})
    out = pathlib.Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    R = resamples
    for (src, sv, sm), (dst, dv, dm) in ((runs[0], runs[1]), (runs[1], runs[0])):
        rows = {}
        for fam, labs, reg, ks, b in cells(fams, budgets):
            best = choose(sv, labs, ks, b, [(sv, np.ones(len(sm["qfold"]), bool))])
            rows[(fam, reg, b)] = {m: dv[(best[0], best[1], b, m)] for m in ("recall", "has_answer")}
        head = {**{k: dst[k] for k in ("benchmark", "pool_size", "questions", "covered", "documents")},
                "task": f"transfer {src['benchmark']} -> {dst['benchmark']}"}
        sub = out / f"transfer-{src['benchmark']}-to-{dst['benchmark']}"
        sub.mkdir(exist_ok=True)
        write(sub, summarize(rows, head, R))
    for (info, v, m), (_, ov, om) in ((runs[0], runs[1]), (runs[1], runs[0])):
        rows = {}
        for fam, labs, reg, ks, b in cells(fams, budgets):
            vals = {x: np.full(len(m["qfold"]), np.nan) for x in ("recall", "has_answer")}
            for f in range(5):
                best = choose(v, labs, ks, b, [(v, m["qfold"] != f), (ov, om["qfold"] != f)])
                for x in vals:
                    vals[x][m["qfold"] == f] = v[(best[0], best[1], b, x)][m["qfold"] == f]
            rows[(fam, reg, b)] = vals
        head = {**{k: info[k] for k in ("benchmark", "pool_size", "questions", "covered", "documents")},
                "task": "fit on both"}
        sub = out / f"both-{info['benchmark']}"
        sub.mkdir(exist_ok=True)
        write(sub, summarize(rows, head, R))


def tables(summary) -> str:
    size = summary.get("pool_size", 1)
    lines = [f"{summary['benchmark']} ({summary.get('task', 'cv')}): {summary['questions']} questions with gold "
             f"({summary['covered']} covered by has-answer), {summary['documents']} documents, "
             f"{'single document' if size == 1 else f'pools of {size} documents'}, 5 folds by document\n"]
    for b in sorted({r["budget"] for r in summary["rows"]}):
        lines += [f"\n| B = {b} | read-out | recall@{b} | − cosine-pages | W/T/L | has-answer@{b} | − cosine-pages "
                  f"| W/T/L | recall − cosine |", "|---|---|---|---|---|---|---|---|---|"]
        for r in summary["rows"]:
            if r["budget"] != b:
                continue
            if r["family"] == "cosine ranking" and r["readout"] == "cv":
                continue
            cells = []
            for m in ("recall", "has_answer"):
                mean, lo, hi, n = r[m]
                d = r[f"{m} - page rule"]
                cells += [f"{mean:.3f} [{lo:.3f}, {hi:.3f}]",
                          f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]",
                          f"{d['better']}/{d['tie']}/{d['worse']}"]
            d = r["recall - cosine top-B"]
            cells.append(f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]")
            rule = (r["family"], r["readout"]) == ("cosine ranking", "read")
            name = "cosine ranking, 1 per page (the page rule)" if rule else r["family"]
            lines.append(f"| {name} | {r['readout']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    app.run(main)

r"""Which game beats the page rule? Structured read-outs, the page game and the sparse regime against cosine,
``cosine-pages`` and tuned MMR / k-DPP, cross-validated by document, with recall@B and has-answer@B (issue 34).

Usage (from the repository root; one benchmark per run, single documents)::

    python experiments/structured_cv.py --benchmark=mmlongbench --max_documents=20 \
        --cache_dir=CACHE_M --output_dir=runs/structured/mmlongbench
    python experiments/structured_cv.py --benchmark=qasper --max_documents=40 \
        --cache_dir=CACHE_Q --output_dir=runs/structured/qasper

Every selector is reduced to its **ranking** of all the notes of a question (computed once per setting, in JAX:
cosine; MMR and k-DPP greedy to ``GREEDY_DEPTH_FACTOR x 10`` picks, then cosine; the learned game's equilibrium,
support by weight then its fill rule; the page game's pages, best notes first; the sparse learned game's), and read
three ways: top-B (no read-out), or at most k = 1 or 2 notes per page per round (``cdsjax.core.structure``). On
QASPER a "page" is a paragraph group, as for ``cosine-pages``. A *family* is a ranking with its knob grid:

* ``cosine`` (no knob), ``mmr`` (lambda), ``dpp`` (theta), ``cds-learned`` (the fit's nine grid starts: the grid
  does the fit's work, RESULTS "The shipped fit"), ``cds-pages`` (the page game: beta, and alpha factor 1 or the
  sparse 0.5), ``cds-sparse`` (the learned game at alpha factor 0.5 or 0, three grid starts);
* ``cds (CV structure)``: every game setting of the three CDS families with every read-out, one choice.

For each test fold (5 folds by document, seed 0, as experiments/learned_cv.py) each family picks its knob and its
read-out on the other folds' questions by mean recall@B, separately for "read-out none", "read-out k in {1, 2}"
and "chosen among none, 1, 2"; the test fold's questions are scored with both metrics. Paired bootstrap
differences (10,000 resamples) against ``cosine-pages`` and ``cosine`` with win / tie / loss. Outputs:
``values.npz`` (every ranking's per-question metrics), ``summary.json``, ``tables.md``.
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

GREEDY_DEPTH = 80
READOUTS = (0, 1, 2)  # 0: top-B (no read-out); k: at most k notes per page per round


def settings():
    """``[(family, label, kind, params)]``: every ranking to compute."""
    from cdsjax.learn.fit import DEFAULT_STARTS

    out = [("cosine ranking", "cosine top-B", "rank_cosine", None)]
    out += [("mmr ranking", f"mmr lam={v:g}", "rank_mmr", v) for v in (0.3, 0.5, 0.7, 0.9)]
    out += [("dpp ranking", f"dpp theta={v:g}", "rank_dpp", v) for v in (1.0, 3.0, 10.0)]
    out += [("learned game", "learned " + ",".join(f"{k}={v:g}" for k, v in s.items()), "rank_learned", dict(s))
            for s in DEFAULT_STARTS]
    out += [("page game", f"pages beta={b:g} f={f:g}", "rank_pages", {"beta": b, "alpha_factor": f})
            for f in (1.0, 0.5) for b in (0.03, 0.1, 0.3, 1.0)]
    out += [("sparse learned game", "sparse " + ",".join(f"{k}={v:g}" for k, v in s.items()) + f" f={f:g}", "rank_sparse",
             (dict(s), f)) for f in (0.5, 0.0) for s in ({"beta": 0.03, "w_page": -1.0}, {"beta": 0.3, "w_page": -1.0},
                                                         {"beta": 0.3})]
    return out


def _rank_fn(kind: str):
    """``f(notes, query, valid, links, pages_game, units, doc_ids, kinds, param) -> (rank [n], kept [])`` (jittable;
    ``kept``: the sparse regime's equilibrium kept the query, True for every other ranking)."""
    import jax.numpy as jnp

    from cdsjax.core import structure as S
    from cdsjax.core.baselines import select_cosine, select_dpp, select_mmr
    from cdsjax.core.cds import cds
    from cdsjax.core.types import CDSProblem

    def f(*args):
        out = g(*args)
        return out if isinstance(out, tuple) else (out, jnp.asarray(True))

    def g(notes, query, valid, links, pages_game, units, doc_ids, kinds, param):
        n = notes.shape[0]
        if kind == "rank_cosine":
            return S.ranking_of(lambda b: lambda z, q, v: select_cosine(z, q, v, budget=b), notes, query, valid)[0]
        if kind == "rank_mmr":
            return S.ranking_of(lambda b: lambda z, q, v: select_mmr(z, q, v, budget=b, lam=param), notes, query,
                                valid, min(n, GREEDY_DEPTH))[0]
        if kind == "rank_dpp":
            return S.ranking_of(lambda b: lambda z, q, v: select_dpp(z, q, v, budget=b, theta=param), notes, query,
                                valid, min(n, GREEDY_DEPTH))[0]
        if kind == "rank_learned":
            def build(b):
                problem = CDSProblem.create(notes, query, valid, links=links, pages=pages_game, doc_ids=doc_ids,
                                            kinds=kinds)
                return lambda z, q, v: cds(problem, "single", param, budget=b)
            return S.ranking_of(build, notes, query, valid)[0]
        if kind == "rank_pages":
            rank, _, kept = S.page_game_ranking(notes, query, valid, units, param, doc_ids=doc_ids)
            return rank, kept
        if kind == "rank_sparse":
            theta, factor = param
            rank, _, kept = S.sparse_learned_ranking(notes, query, valid, theta, factor, links=links,
                                                     pages=pages_game, doc_ids=doc_ids, kinds=kinds)
            return rank, kept
        raise ValueError(kind)

    return f


def _param(kind, p):
    from cdsjax.core.learned import LearnedParams
    from cdsjax.core.structure import PageGameParams

    if kind == "rank_learned":
        return LearnedParams.from_dict(p)
    if kind == "rank_pages":
        return PageGameParams(**p)
    if kind == "rank_sparse":
        return (LearnedParams.from_dict(p[0]), float(p[1]))
    return p


def rankings(problems, kind, param, buckets=(64, 128, 256, 512, 1024, 2048), chunk=16):
    """``(ranks, kept)``: each problem's rank positions under one setting, and whether the query stayed in the
    support (sparse regime) (padded into buckets, jit + vmap, the knob traced where it
    is a pytree so one compilation serves a family)."""
    import jax
    import jax.numpy as jnp

    traced = kind in ("rank_learned", "rank_pages", "rank_sparse")
    f = _rank_fn(kind)
    if traced:
        call = _CALLS.setdefault(kind, jax.jit(jax.vmap(f, in_axes=(0,) * 8 + (None,))))
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
        for s in range(0, len(members), chunk):
            rows = members[s:s + chunk]
            batch = rows + [rows[0]] * (chunk - len(rows)) if len(members) > chunk else rows
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
    """NumPy twin of :func:`cdsjax.core.structure.structured_readout` (``k = 0``: top-B of the ranking)."""
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


def main(argv):
    from absl import flags as _f  # noqa: F401

    import configs.learned_cv as C
    from cdsjax.eval.folds import document_folds
    from cdsjax.eval.metrics import mean_ci, paired_difference
    from experiments import learned_cv as L

    name = _BENCH.value
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    cfg = C.get_config()
    cfg.cache_dirs[name] = _CACHE.value
    cfg.output_dir = str(out)
    cfg.max_documents = _MAXDOCS.value
    data = L.load_data(name, cfg)
    problems = L._problems(data, list(data.notes), 1, 0)
    units = [p.structure(pages_only=False)["pages"] for p in problems]
    budgets = [int(b) for b in _BUDGETS.value]
    covered = sum(p.answer_targets() is not None for p in problems)
    print(f"{name}: {len(problems)} questions with gold, {covered} covered by has-answer, {len(data.notes)} documents",
          flush=True)
    values: Dict[tuple, np.ndarray] = {}  # (label, k, B, metric) -> [q]
    diag = {}
    for family, label, kind, param in settings():
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
    np.savez_compressed(out / "values.npz", **{"|".join(map(str, k)): v for k, v in values.items()})

    folds = document_folds(list(data.notes), 5, seed=0)
    fold_of = {}
    for f in folds:
        for d in f.test:
            fold_of[d] = f.index
    qfold = np.asarray([fold_of[p.query.doc_ids[0]] for p in problems])
    fams = {}
    for family, label, kind, _ in settings():
        fams.setdefault(family, []).append(label)
    fams["any game (CV structure)"] = fams["learned game"] + fams["page game"] + fams["sparse learned game"]
    regimes = {"none": (0,), "read": (1, 2), "cv": READOUTS}
    rows, chosen = {}, {}
    for fam, labels in fams.items():
        for reg, ks in regimes.items():
            if fam == "cosine ranking" and reg == "read":
                ks = (1,)  # cosine-pages
            for b in budgets:
                rec, ans = np.full(len(problems), np.nan), np.full(len(problems), np.nan)
                picks = []
                for f in range(5):
                    train = qfold != f
                    best = max(((lab, k) for lab in labels for k in ks),
                               key=lambda c: np.nanmean(values[(c[0], c[1], b, "recall")][train]))
                    picks.append(best)
                    test = qfold == f
                    rec[test] = values[(best[0], best[1], b, "recall")][test]
                    ans[test] = values[(best[0], best[1], b, "has_answer")][test]
                rows[(fam, reg, b)] = {"recall": rec, "has_answer": ans}
                chosen[f"{fam}|{reg}|{b}"] = [f"{lab} k={k}" for lab, k in picks]
    summary = {"benchmark": name, "questions": len(problems), "covered": covered, "documents": len(data.notes),
               "chosen": chosen, "query_kept": diag, "rows": []}
    R = _RESAMPLES.value
    ref = {"page rule": ("cosine ranking", "read"), "cosine top-B": ("cosine ranking", "none")}
    for (fam, reg, b), vals in rows.items():
        entry = {"family": fam, "readout": reg, "budget": b}
        for metric, v in vals.items():
            mean, lo, hi, n = mean_ci(v, num_resamples=R)
            entry[metric] = [mean, lo, hi, n]
            for rname, key in ref.items():
                d = paired_difference(v, rows[(key[0], key[1], b)][metric], num_resamples=R)
                entry[f"{metric} - {rname}"] = d
        summary["rows"].append(entry)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    text = tables(summary)
    (out / "tables.md").write_text(text)
    print(text)


def tables(summary) -> str:
    lines = [f"{summary['benchmark']}: {summary['questions']} questions with gold ({summary['covered']} covered by "
             f"has-answer), {summary['documents']} documents, single document, 5 folds by document\n"]
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
                cells += [f"{mean:.3f} [{lo:.3f}, {hi:.3f}]", f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]",
                          f"{d['better']}/{d['tie']}/{d['worse']}"]
            d = r["recall - cosine top-B"]
            cells.append(f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]")
            name = "cosine ranking, 1 per page (the page rule)" if (r["family"], r["readout"]) == ("cosine ranking", "read") else r["family"]
            lines.append(f"| {name} | {r['readout']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    app.run(main)

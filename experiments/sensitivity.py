r"""Sensitivity of CDS retrieval to beta and tau, with implicit derivatives, and gradient tuning.

Usage (from the repository root)::

    python experiments/sensitivity.py --config configs/sensitivity.py
    python experiments/sensitivity.py --config configs/sensitivity.py --config.benchmarks=hotpotqa

For each benchmark:

1. curves: mean soft recall@B (the differentiable surrogate), gold mass and the
   measured recall@B over a beta grid and a (soft) tau grid, with the implicit
   derivatives of the surrogates at every point, and a check of the implicit
   derivative against central differences of the mean surrogate at the defaults;
2. tuning: Adam (optax) on (log beta, tau) maximising the mean surrogate on one
   half of the questions, then recall@B on the other half for the paper's defaults
   (beta = 1, hard tau = 0), the tuned values (soft tau, as trained, and the same
   values with hard tau) and cosine top-B.

Everything runs in float64 with InImDyn equilibria (converged mode). Outputs go to
``<output_dir>/<benchmark>/``; the printed tables are what RESULTS.md quotes.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import pathlib
import sys
import time
from typing import Any, Dict, List, Sequence

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# --------------------------------------------------------------------------- data
#
# A question is the package's selection problem (cdsjax.eval.problems.Problem: notes, query vector, note ids,
# pages) and its gold units over the notes (gold_units), embeddings cached by cdsjax.eval.problems.cached_encode.


def gold_units(problem) -> np.ndarray:
    """``[g, n]`` bool, one row per gold unit over the notes: a gold note (text benchmarks, notes without
    pages) or a gold page (page-chunk notes; a gold page without text is a row no note covers, a miss)."""
    if problem.pages is None:
        index = {nid: i for i, nid in enumerate(problem.note_ids)}
        gold = sorted(problem.query.gold_note_ids)
        units = np.zeros((len(gold), len(problem.note_ids)), bool)
        for u, nid in enumerate(gold):
            units[u, index[nid]] = True
        return units
    gold = sorted(problem.query.gold_pages[problem.query.doc_ids[0]])
    return np.asarray(problem.pages)[None, :] == np.asarray(gold)[:, None]


def page_chunks(pdf: pathlib.Path, chunk_size: int, chunk_overlap: int) -> tuple[list, list]:
    """Each page's text layer split into chunks: ``(texts, pages)`` (0-based pages)."""
    import pymupdf
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    splitter = RecursiveCharacterTextSplitter(chunk_size=chunk_size, chunk_overlap=chunk_overlap)
    texts, pages = [], []
    with pymupdf.open(pdf) as doc:
        for pno, page in enumerate(doc):
            for chunk in splitter.split_text(page.get_text("text")):
                if chunk.strip():
                    texts.append(chunk)
                    pages.append(pno)
    return texts, pages


def mmlongbench_study_problems(config, embedder, cache_dir: pathlib.Path, max_queries: int) -> list:
    """MMLongBench-Doc on page-text chunks (no links); one gold unit per gold page (a page without text
    is a unit no note covers)."""
    from cdsjax.eval.problems import Problem, cached_encode
    from cdsjax.io.datasets import load_mmlongbench

    opts = config.mmlongbench
    bench = load_mmlongbench(config.data_root, with_boxes=False)
    candidates = [q for q in bench.queries if q.has_gold and q.meta["num_pages"] <= opts.max_pages]
    chunks, queries, no_text = {}, [], set()
    for q in candidates:
        doc_id = q.doc_ids[0]
        if doc_id not in chunks:
            texts, pages = page_chunks(bench.documents[doc_id], opts.chunk_size, opts.chunk_overlap)
            emb = cached_encode(cache_dir, f"mmlb-{doc_id}", embedder, texts, queries=False) if texts else None
            chunks[doc_id] = (emb, np.asarray(pages))
        if chunks[doc_id][0] is None:  # no text layer (scanned pages): nothing to retrieve from
            no_text.add(doc_id)
            continue
        queries.append(q)
        if len(queries) == max_queries:
            break
    if no_text:
        print(f"mmlongbench: skipped questions on {len(no_text)} document(s) without a text layer: {sorted(no_text)}")
    query_emb = cached_encode(cache_dir, "mmlb", embedder, [q.question for q in queries], queries=True)
    problems = []
    for q, qe in zip(queries, query_emb):
        doc_id = q.doc_ids[0]
        emb, pages = chunks[doc_id]
        n = len(pages)
        problems.append(Problem(q, emb, qe, np.zeros((n, n), bool), [f"{doc_id}#{i}" for i in range(n)],
                                [doc_id] * n, pages=pages.tolist()))
    return problems


def load_study_problems(config, name: str, embedder) -> list:
    """The capped, gold-bearing questions of benchmark ``name`` as :class:`cdsjax.eval.problems.Problem`\\ s
    (text benchmarks: each question's paragraphs, no links)."""
    from cdsjax.eval.problems import text_problems
    from cdsjax.io.datasets import load_hotpotqa, load_qasper

    cache_dir = pathlib.Path(config.cache_dir or pathlib.Path(config.output_dir) / "cache")
    cap = int(config.max_queries[name])
    if name == "mmlongbench":
        return mmlongbench_study_problems(config, embedder, cache_dir, cap)
    loader = {"hotpotqa": load_hotpotqa, "qasper": load_qasper}[name]
    bench = loader(config.data_root)
    keep = [q for q in bench.queries if q.gold_note_ids][:cap]
    bench = dataclasses.replace(bench, queries=keep,
                                corpora={q.doc_ids[0]: bench.corpora[q.doc_ids[0]] for q in keep})
    return text_problems(bench, embedder, cache_dir=cache_dir, link_window=0)


# --------------------------------------------------------------------------- batches


@dataclasses.dataclass
class Batch:
    """Problems padded to one bucket size: positions into the problem list and float64 arrays."""

    positions: List[int]
    notes: np.ndarray  # [b, N, d]
    query: np.ndarray  # [b, d]
    valid: np.ndarray  # [b, N]
    units: np.ndarray  # [b, G, N]
    unit_valid: np.ndarray  # [b, G]


def make_batches(problems: Sequence, positions: Sequence[int], buckets: Sequence[int], max_batch: int) -> List[Batch]:
    """Pads the chosen problems to their bucket (:func:`cdsjax.core.batching.bucket_size`), ``max_batch`` per batch,
    in float64 (:func:`cdsjax.core.batching.make_buckets` pads notes and queries; the gold units are padded here)."""
    from cdsjax.core.batching import bucket_size, make_buckets, pad_rows

    groups: Dict[int, List[int]] = {}
    for pos in positions:
        groups.setdefault(bucket_size(problems[pos].notes.shape[0], buckets), []).append(pos)
    batches = []
    for size, members in sorted(groups.items()):
        for start in range(0, len(members), max_batch):
            chunk = members[start:start + max_batch]
            (padded,) = make_buckets([problems[p].notes for p in chunk], [problems[p].query_emb for p in chunk],
                                     buckets=(size,), pad_batch=False)
            units = [gold_units(problems[p]) for p in chunk]
            g = max(u.shape[0] for u in units)
            batches.append(Batch(
                list(chunk), padded.notes.astype(np.float64), padded.queries.astype(np.float64), padded.valid,
                np.stack([pad_rows(pad_rows(u, g).T, size).T for u in units]),
                np.stack([np.arange(g) < u.shape[0] for u in units])))
    return batches


# --------------------------------------------------------------------------- the measured functions


@dataclasses.dataclass(frozen=True)
class Options:
    """Static settings of the compiled functions: the budget, how equilibria are solved (the package's
    :class:`cdsjax.core.SolveOptions`), the soft tau gate and the surrogate's settings."""

    budget: int
    solve: Any  # cdsjax.core.SolveOptions (solver, tol, max_iter)
    tau_temperature: float
    temperature: float
    slack_weight: float


def options_of(config, name: str) -> Options:
    from cdsjax import core

    solve = core.SolveOptions(solver=core.solver_from_name(str(config.solver)), tol=float(config.tol), max_iter=int(config.max_iter)).check()
    return Options(budget=int(config.budget[name]), solve=solve, tau_temperature=float(config.tau_temperature),
                   temperature=float(config.surrogate.temperature),
                   slack_weight=float(config.surrogate.slack_weight))


def _per_query(theta, notes, query, valid, units, unit_valid, opts: Options, tau_mode: str):
    """``theta = (beta, tau)`` -> ([soft recall, gold mass], diagnostics) for one question."""
    import jax.numpy as jnp

    from cdsjax import core
    from cdsjax.core.surrogates import retrieval_surrogates

    params = core.CDSParams(beta=theta[0], tau=theta[1], tau_mode=tau_mode, tau_temperature=opts.tau_temperature)
    out = retrieval_surrogates(core.CDSProblem.create(notes, query, valid), units, params, opts.solve,
                                    budget=opts.budget, temperature=opts.temperature, slack_weight=opts.slack_weight,
                                    unit_valid=unit_valid)
    return jnp.stack([out["soft_recall"], out["gold_mass"]]), out


@functools.lru_cache(maxsize=None)
def measure_fn(opts: Options, tau_mode: str, with_jacobian: bool):
    """``jit(vmap)`` over questions of the surrogates (and their ``[2, 2]`` Jacobian in theta)."""
    import jax

    f = functools.partial(_per_query, opts=opts, tau_mode=tau_mode)
    if with_jacobian:
        f = jax.jacfwd(f, has_aux=True)
    return jax.jit(jax.vmap(f, in_axes=(None, 0, 0, 0, 0, 0)))


@functools.lru_cache(maxsize=None)
def train_fn(opts: Options):
    """``jit`` of value-and-grad of the summed soft recall over a batch in ``u = (log beta, tau)``."""
    import jax
    import jax.numpy as jnp

    def total(u, notes, query, valid, units, unit_valid):
        theta = jnp.stack([jnp.exp(u[0]), u[1]])
        vals, out = jax.vmap(functools.partial(_per_query, opts=opts, tau_mode="soft"),
                             in_axes=(None, 0, 0, 0, 0, 0))(theta, notes, query, valid, units, unit_valid)
        return jnp.sum(vals[:, 0]), (jnp.sum(out["recall"]), jnp.sum(out["converged"]))

    return jax.jit(jax.value_and_grad(total, has_aux=True))


def measure(batches: Sequence[Batch], count: int, theta, opts: Options, *, tau_mode: str = "soft",
            with_jacobian: bool = True) -> Dict[str, np.ndarray]:
    """Per-question values at ``theta``: soft recall, gold mass, recall, diagnostics, Jacobian."""
    fn = measure_fn(opts, tau_mode, with_jacobian)
    theta = np.asarray(theta, np.float64)
    cols: Dict[str, np.ndarray] = {}
    for batch in batches:
        res = fn(theta, batch.notes, batch.query, batch.valid, batch.units, batch.unit_valid)
        jac, out = res if with_jacobian else (None, res[1])
        rows = dict(out)
        if with_jacobian:
            rows["jacobian"] = jac
        for k, v in rows.items():
            v = np.asarray(v)
            if k not in cols:
                cols[k] = np.full((count,) + v.shape[1:], np.nan)
            cols[k][batch.positions] = v
    return cols


# --------------------------------------------------------------------------- study parts


def curves(batches, count, config, opts: Options, positions: Sequence[int], train: Sequence[int]) -> List[dict]:
    """Rows ``(axis, beta, tau, means and mean derivatives)`` over the beta and tau grids.

    Means are over ``positions``; ``train_soft_recall`` is the mean over ``train``
    only (what the tuning may look at). Gold mass is averaged over the questions
    with some gold note (a gold page without text has none).
    """
    rows = []
    grid = [("beta", b, config.curves.tau_for_beta) for b in config.curves.betas]
    grid += [("tau", config.curves.beta_for_tau, t) for t in config.curves.taus]
    sel = np.asarray(positions)
    for axis, beta, tau in progress_bar(grid, config, "curves (grid points)"):
        m = measure(batches, count, (beta, tau), opts)
        jac = m["jacobian"][sel]
        has_mass = np.isfinite(m["gold_mass"][sel])
        rows.append({
            "axis": axis, "beta": float(beta), "tau": float(tau),
            "soft_recall": float(np.mean(m["soft_recall"][sel])),
            "recall": float(np.mean(m["recall"][sel])),
            "gold_mass": float(np.mean(m["gold_mass"][sel][has_mass])),
            "d_soft_d_beta": float(np.mean(jac[:, 0, 0])), "d_soft_d_tau": float(np.mean(jac[:, 0, 1])),
            "d_mass_d_beta": float(np.mean(jac[has_mass, 1, 0])),
            "d_mass_d_tau": float(np.mean(jac[has_mass, 1, 1])),
            "train_soft_recall": float(np.mean(m["soft_recall"][np.asarray(train)])),
            "support_notes": float(np.mean(m["support_size"][sel])),
            "converged": float(np.mean(m["converged"][sel])),
            "implicit_ok": float(np.mean(m["implicit_ok"][sel])),
        })
    return rows


def derivative_check(batches, count, config, opts: Options, positions) -> dict:
    """Implicit derivative of the mean surrogates vs central differences at (beta, tau) = (1, 0)."""
    sel = np.asarray(positions)
    h = float(config.curves.fd_step)
    base = measure(batches, count, (1.0, 0.0), opts)
    has_mass = np.isfinite(base["gold_mass"][sel])
    # Questions whose support changes within +-h sit on a kink: the implicit derivative
    # is one-sided there and central differences average the two sides.
    smooth = np.ones(len(sel), bool)
    per_fd = np.zeros((len(sel), 2, 2))
    for j in range(2):
        step = np.eye(2)[j] * h
        hi = measure(batches, count, np.array([1.0, 0.0]) + step, opts, with_jacobian=False)
        lo = measure(batches, count, np.array([1.0, 0.0]) - step, opts, with_jacobian=False)
        smooth &= (hi["support_size"][sel] == lo["support_size"][sel]) & (hi["support_size"][sel] ==
                                                                           base["support_size"][sel])
        for i, key in enumerate(("soft_recall", "gold_mass")):
            per_fd[:, i, j] = (hi[key][sel] - lo[key][sel]) / (2 * h)
    jac = base["jacobian"][sel]

    implicit_all = np.stack([jac[:, 0].mean(0), jac[has_mass, 1].mean(0)])
    fd_all = np.stack([per_fd[:, 0].mean(0), per_fd[has_mass, 1].mean(0)])
    implicit_smooth = np.stack([jac[smooth, 0].mean(0), jac[smooth & has_mass, 1].mean(0)])
    fd_smooth = np.stack([per_fd[smooth, 0].mean(0), per_fd[smooth & has_mass, 1].mean(0)])
    return {"implicit": implicit_all.tolist(), "central_differences": fd_all.tolist(),
            "max_abs_diff": float(np.abs(implicit_all - fd_all).max()),
            "support_changes": int((~smooth).sum()),
            "max_abs_diff_without_support_changes": float(np.abs(implicit_smooth - fd_smooth).max())}


def tune(batches, count, config, opts: Options, train_size: int, init=None) -> List[dict]:
    """Adam on ``u = (log beta, tau)`` maximising the mean soft recall of the training half.

    Starts from ``init = (beta, tau)``, default ``(config.tune.init_beta, config.tune.init_tau)``.
    """
    import jax.numpy as jnp
    import optax

    fn = train_fn(opts)
    beta0, tau0 = init if init is not None else (config.tune.init_beta, config.tune.init_tau)
    u = jnp.asarray([np.log(beta0), tau0], jnp.float64)
    optimizer = optax.adam(config.tune.learning_rate)
    state = optimizer.init(u)
    trace = []
    for step in progress_bar(range(int(config.tune.steps) + 1), config, "tuning (Adam steps)"):
        value, grad, recall, converged = 0.0, jnp.zeros(2), 0.0, 0.0
        for b in batches:
            (v, (r, c)), g = fn(u, b.notes, b.query, b.valid, b.units, b.unit_valid)
            value, grad, recall, converged = value + v, grad + g, recall + r, converged + c
        trace.append({"step": step, "beta": float(jnp.exp(u[0])), "tau": float(u[1]),
                      "soft_recall": float(value) / train_size, "recall": float(recall) / train_size,
                      "converged": float(converged) / train_size})
        if step == int(config.tune.steps):
            break
        updates, state = optimizer.update(-grad / train_size, state, u)  # ascent on the surrogate
        u = optax.apply_updates(u, updates)
    return trace


def progress_bar(items, config, desc: str):
    """``items`` with a tqdm bar on stderr (as ``cdsjax eval`` shows), unless ``config.progress`` is False."""
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False, disable=not config.get("progress", True))


def cosine_recall(problems: Sequence, positions, budget: int) -> np.ndarray:
    out = []
    for pos in positions:
        p = problems[pos]
        top = np.argsort(-(p.notes @ p.query_emb), kind="stable")[:budget]
        out.append(np.mean(gold_units(p)[:, top].any(axis=1)))
    return np.asarray(out)


def held_out(batches, count, problems, positions, tuned: Dict[str, dict], opts: Options,
             num_resamples: int) -> List[dict]:
    """Recall@B on the held-out half for the defaults, each tuned point and cosine, with paired CIs.

    ``tuned`` maps a start label to the last step of its tuning trace.
    """
    from cdsjax.eval.metrics import mean_ci

    sel = np.asarray(positions)
    settings = [
        ("defaults (beta=1, tau=0, hard)", (1.0, 0.0), "hard"),
        ("defaults, soft tau", (1.0, 0.0), "soft"),
    ]
    for start, t in tuned.items():
        for mode in ("soft", "hard"):
            settings.append((f"tuned from {start} (beta={t['beta']:.3f}, tau={t['tau']:.3f}, {mode})",
                             (t["beta"], t["tau"]), mode))
    per = {}
    rows = []
    for label, theta, mode in settings:
        m = measure(batches, count, theta, opts, tau_mode=mode, with_jacobian=False)
        per[label] = (m["recall"][sel], m["soft_recall"][sel], m["converged"][sel])
    per["cosine top-B"] = (cosine_recall(problems, positions, opts.budget), np.full(len(sel), np.nan),
                           np.ones(len(sel)))
    default = per[settings[0][0]][0]
    for label, (recall, soft, conv) in per.items():
        mean, lo, hi, n = mean_ci(recall, num_resamples=num_resamples)
        dmean, dlo, dhi, _ = mean_ci(recall - default, num_resamples=num_resamples)
        rows.append({"setting": label, "recall": mean, "ci_low": lo, "ci_high": hi, "n": n,
                     "soft_recall": float(np.nanmean(soft)) if np.isfinite(soft).any() else float("nan"),
                     "diff_vs_default": dmean, "diff_ci_low": dlo, "diff_ci_high": dhi,
                     "converged": float(np.mean(conv))})
    return rows


# --------------------------------------------------------------------------- output


def plot_curves(rows: List[dict], path: pathlib.Path, title: str) -> None:
    """Metric curves over beta and tau with the implicit derivative drawn as tangents."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    fig = Figure(figsize=(11, 7.5))
    axes = fig.subplots(2, 2)
    for col, axis in enumerate(("beta", "tau")):
        pts = [r for r in rows if r["axis"] == axis]
        x = np.asarray([r[axis] for r in pts])
        ax = axes[0, col]
        for key, label, deriv in (("soft_recall", "soft recall@B", f"d_soft_d_{axis}"),
                                  ("gold_mass", "gold mass", f"d_mass_d_{axis}"),
                                  ("recall", "recall@B (measured)", None)):
            y = np.asarray([r[key] for r in pts])
            line, = ax.plot(x, y, "o-", label=label)
            if deriv is None:
                continue
            slope = np.asarray([r[deriv] for r in pts])
            # Tangents: in log-x for beta the slope is d/d(log beta) = beta * d/d beta.
            half = 0.25 if axis == "beta" else 0.03
            for xi, yi, si in zip(x, y, slope):
                if axis == "beta":
                    xs = xi * np.exp(np.array([-half, half]))
                    ys = yi + si * xi * np.array([-half, half])
                else:
                    xs = xi + np.array([-half, half])
                    ys = yi + si * np.array([-half, half])
                ax.plot(xs, ys, "-", color=line.get_color(), alpha=0.5, linewidth=2.5)
        if axis == "beta":
            ax.set_xscale("log")
        ax.set_xlabel(axis)
        ax.set_title(f"metrics vs {axis} (short segments: implicit derivative)")
        ax.legend(fontsize=8)
        ax = axes[1, col]
        for key, label in ((f"d_soft_d_{axis}", "d soft recall"), (f"d_mass_d_{axis}", "d gold mass")):
            ax.plot(x, [r[key] for r in pts], "o-", label=f"{label} / d {axis} (implicit)")
        for key, label in (("soft_recall", "soft recall"), ("gold_mass", "gold mass")):
            y = np.asarray([r[key] for r in pts])
            ax.plot(x, np.gradient(y, x), "x--", alpha=0.6, label=f"{label}: slope of the grid curve")
        if axis == "beta":
            ax.set_xscale("log")
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xlabel(axis)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_tuning(traces: Dict[str, List[dict]], path: pathlib.Path, title: str) -> None:
    """Tuning trajectories (one per start): (beta, tau) and the training-half metrics per step."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.8))
    axes = fig.subplots(1, 2)
    for k, (start, trace) in enumerate(traces.items()):
        steps = [t["step"] for t in trace]
        style = "-" if k == 0 else "--"
        axes[0].plot(steps, [t["beta"] for t in trace], style, color="C0", label=f"beta ({start})")
        axes[0].plot(steps, [t["tau"] for t in trace], style, color="C1", label=f"tau ({start})")
        axes[1].plot(steps, [t["soft_recall"] for t in trace], style, color="C2", label=f"soft recall@B ({start})")
        axes[1].plot(steps, [t["recall"] for t in trace], style, color="C3", label=f"recall@B ({start})")
    for ax in axes:
        ax.set_xlabel("Adam step")
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_csv(rows: List[dict], path: pathlib.Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _table(rows: List[dict], keys: Sequence[str], fmt: str = "{:.4g}") -> str:
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = [fmt.format(r[k]) if isinstance(r[k], float) else str(r[k]) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def split_halves(count: int, seed: int) -> tuple[list, list]:
    """A seeded random half for tuning and the other half for evaluation."""
    order = np.random.default_rng(seed).permutation(count)
    half = count // 2
    return sorted(order[:half].tolist()), sorted(order[half:].tolist())


def study_benchmark(config, name: str, embedder, log=print) -> dict:
    """Runs the curves, the derivative check and the tuning on one benchmark; writes its outputs (``summary.json``
    with the provenance of its numbers: commit, library versions, device, resolved config)."""
    from cdsjax.io.provenance import provenance

    out_dir = pathlib.Path(config.output_dir) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    timings = {}
    t0 = time.perf_counter()
    log(f"{name}: loading and embedding the questions (cached after the first run) ...")
    problems = load_study_problems(config, name, embedder)
    if len(problems) < 2:
        raise ValueError(f"{name}: need at least 2 questions with gold evidence, got {len(problems)}")
    timings["load_and_embed_s"] = time.perf_counter() - t0
    opts = options_of(config, name)
    count = len(problems)
    batches = make_batches(problems, range(count), config.buckets, int(config.max_batch))
    train, test = split_halves(count, int(config.tune.seed))
    sizes = [p.notes.shape[0] for p in problems]
    log(f"\n## {name}: {count} questions, notes per question median {int(np.median(sizes))} "
        f"(max {max(sizes)}), B = {opts.budget}; tuning on {len(train)}, evaluation on {len(test)}")

    t0 = time.perf_counter()
    curve_rows = curves(batches, count, config, opts, range(count), train)
    timings["curves_s"] = time.perf_counter() - t0
    write_csv(curve_rows, out_dir / "curves.csv")
    log(_table(curve_rows, ["axis", "beta", "tau", "soft_recall", "recall", "gold_mass", "d_soft_d_beta",
                            "d_soft_d_tau", "d_mass_d_beta", "d_mass_d_tau", "support_notes", "converged",
                            "implicit_ok", "train_soft_recall"]))
    t0 = time.perf_counter()
    check = derivative_check(batches, count, config, opts, range(count))
    timings["derivative_check_s"] = time.perf_counter() - t0
    log(f"derivative check at (beta, tau) = (1, 0), soft tau, all questions: rows (soft recall, gold mass), "
        f"columns (d/d beta, d/d tau)\n  implicit            {np.round(check['implicit'], 6).tolist()}\n"
        f"  central differences {np.round(check['central_differences'], 6).tolist()}  "
        f"(h = {config.curves.fd_step}; max |diff| {check['max_abs_diff']:.2e})\n"
        f"  {check['support_changes']} question(s) change support within +-h (kinks: one-sided implicit "
        f"derivative vs two-sided differences); without them max |diff| "
        f"{check['max_abs_diff_without_support_changes']:.2e}")

    t0 = time.perf_counter()
    train_batches = make_batches(problems, train, config.buckets, int(config.max_batch))
    # Two starts: the paper's defaults, and the grid point with the best training-half surrogate
    # (the surrogate is not concave in beta; a local gradient method can stop at a local maximum).
    best = max(curve_rows, key=lambda r: r["train_soft_recall"])
    starts = {"defaults": (config.tune.init_beta, config.tune.init_tau)}
    if (best["beta"], best["tau"]) != starts["defaults"]:
        starts["best train grid point"] = (best["beta"], best["tau"])
    else:
        log("the best training-half grid point is the defaults: one start")
    traces, tuned = {}, {}
    for start, init in starts.items():
        trace = tune(train_batches, count, config, opts, len(train), init=init)
        traces[start], tuned[start] = trace, trace[-1]
        log(f"tuning from {start} ({config.tune.steps} Adam steps, lr {config.tune.learning_rate}) on "
            f"{len(train)} questions: beta {trace[0]['beta']:.3f} -> {trace[-1]['beta']:.4f}, tau "
            f"{trace[0]['tau']:.3f} -> {trace[-1]['tau']:.4f}; train soft recall {trace[0]['soft_recall']:.4f} -> "
            f"{trace[-1]['soft_recall']:.4f}, train recall@{opts.budget} {trace[0]['recall']:.4f} -> "
            f"{trace[-1]['recall']:.4f}")
    timings["tuning_s"] = time.perf_counter() - t0
    trace_rows = [{"start": start, **row} for start, trace in traces.items() for row in trace]
    write_csv(trace_rows, out_dir / "tuning.csv")

    t0 = time.perf_counter()
    test_batches = make_batches(problems, test, config.buckets, int(config.max_batch))
    eval_rows = held_out(test_batches, count, problems, test, tuned, opts, int(config.num_resamples))
    timings["held_out_s"] = time.perf_counter() - t0
    write_csv(eval_rows, out_dir / "held_out.csv")
    log(f"held-out half ({len(test)} questions), recall@{opts.budget} with 95% bootstrap CI; "
        f"diff = paired difference to the defaults")
    log(_table(eval_rows, ["setting", "recall", "ci_low", "ci_high", "diff_vs_default", "diff_ci_low",
                           "diff_ci_high", "converged", "n"]))
    plot_curves(curve_rows, out_dir / "curves.png", f"{name}: CDS metrics vs beta and tau (B = {opts.budget})")
    plot_tuning(traces, out_dir / "tuning.png", f"{name}: Adam on (log beta, tau), {len(train)} questions")
    timings["total_s"] = sum(timings.values())
    log("time: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    summary = {"benchmark": name, "questions": count, "budget": opts.budget, "train": len(train),
               "test": len(test), "curves": curve_rows, "derivative_check": check, "tuning": traces,
               "held_out": eval_rows, "timings": timings, "provenance": provenance(config)}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def run(config, log=print) -> List[dict]:
    """The whole study for every configured benchmark (float64)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    from cdsjax.io.embed import Embedder

    names = config.benchmarks
    if isinstance(names, str):
        names = [s.strip() for s in names.split(",") if s.strip()]
    unknown = [n for n in names if n not in ("hotpotqa", "qasper", "mmlongbench")]
    if unknown:
        raise ValueError(f"config.benchmarks: unknown benchmark(s) {unknown}; known: hotpotqa, qasper, mmlongbench")
    embedder = Embedder(config)
    log(f"devices: {jax.devices()}; solver {config.solver} (tol {config.tol}), float64")
    return [study_benchmark(config, name, embedder, log=log) for name in names]


def main(argv):
    from experiments.cli import config_or_exit

    config = config_or_exit(argv, _CONFIG.value, "configs/sensitivity.py")
    start = time.perf_counter()
    run(config)
    print(f"\nwall time of the whole study: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    from absl import app
    from ml_collections import config_flags

    _CONFIG = config_flags.DEFINE_config_file("config", None, "Sensitivity config (configs/sensitivity.py).",
                                              lock_config=True)
    app.run(main)

r"""Fitting the learned game: Adam on a smooth recall@B through the implicit derivatives of the equilibrium.

**Objective.** For each training question, the converged equilibrium :math:`x^*(\theta)` of the learned
game (:func:`cdsjax.core.cds_equilibrium` with :class:`~cdsjax.core.games.learned.LearnedParams`) is extended off its support by the KKT slack, which is
exactly the order in which a :class:`~cdsjax.core.Selection` reads its ``budget`` picks (support by weight,
then the fill rule). The surrogate is :func:`cdsjax.core.surrogates.soft_recall` of those scores: a soft top-B cut
midway between the B-th and (B+1)-th score, soft coverage of each gold unit (page or paragraph), mean over
units. It is chosen over :func:`cdsjax.core.surrogates.gold_mass` because it counts what recall@B counts — distinct
gold units inside the budget — so spreading weight over several notes of one gold page earns nothing,
and it is scale-free (relative temperature), so it does not reward flattening or sharpening :math:`x^*`
for its own sake. Loss: :math:`-\text{mean soft recall} + \ell_2 \lVert\theta - \theta_0\rVert^2`.

**Read-out.** With ``readout="pages"`` the surrogate scores the game for the selector ``cds_learned_pages``
instead, whose selection reads the equilibrium's ranking one note per page: each page is scored by its best
note (:func:`cdsjax.core.surrogates.page_readout_scores`) and the soft top-B is over pages, so the fit moves the page
order that read-out produces, the structural choice made through the equilibrium.

**Search.** The surrogate is not concave in :math:`\beta`, so the fit first evaluates the training
surrogate at every point of a coarse grid (``config.starts``, each a partial :class:`LearnedParams` on top
of :math:`\theta_0`), then runs projected Adam (optax) from the ``num_starts_fitted`` best, full batch
(each question solved once per step, jitted and vmapped over padded buckets). Every ``eval_every`` steps
it scores the validation split (surrogate and hard recall@B); a run stops after ``patience`` evaluations
without a better validation surrogate, and the fit returns the parameters with the best validation
surrogate over all runs (training surrogate when there is no validation split).

**Resuming.** With ``checkpoint_dir`` the state (the grid scores, the current run's parameters and Adam
state, the best so far, the history) is saved with orbax after every step; a later call with the same
data and config continues where the last one stopped and ends at the same parameters as an uninterrupted
fit. ``stop_after`` ends a call after that many steps (time limits; the resume test).

By job: the options are :mod:`cdsjax.learn.fit_config`, the jitted surrogate :mod:`cdsjax.learn.objective`, the
state on disk :mod:`cdsjax.learn.checkpoint`; this module runs the grid and the Adam runs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from cdsjax.core.games.learned import LearnedParams
from cdsjax.learn.checkpoint import FitCheckpoint, fit_identity
from cdsjax.learn.data import Example, example_of, make_batches
from cdsjax.learn.fit_config import FitConfig
from cdsjax.learn.objective import Objectives, jax_tree_sub, penalty, penalty_grad


@dataclasses.dataclass
class FitResult:
    r"""What :func:`fit` found.

    Attributes:
      theta: the fitted :class:`LearnedParams`.
      history: one dict per evaluation (``start``, ``step``, ``train_surrogate``, ``train_recall``,
        ``val_surrogate``, ``val_recall``, ``support``, ``converged``, ``theta``), in order.
      seconds: wall time of the fit (all calls, when resumed).
      grid: one dict per grid point (``start``, ``theta``, ``train_surrogate``, ``train_recall``).
      best: the history entry of the returned parameters.
      finished: False when ``stop_after`` ended the call early.
      reference: the surrogate, recall@B, support size and convergence share of :math:`\theta_0` (the paper's
        game) on ``{"train": ..., "val": ...}``.
    """

    theta: LearnedParams
    history: List[dict]
    seconds: float
    grid: List[dict] = dataclasses.field(default_factory=list)
    best: Optional[dict] = None
    finished: bool = True
    reference: Dict[str, dict] = dataclasses.field(default_factory=dict)


def _as_examples(items: Sequence) -> List[Example]:
    out = []
    for p in items:
        e = p if isinstance(p, Example) else example_of(p)
        if e is not None:
            out.append(e)
    return out


def fit(train: Sequence, val: Sequence, config: Any = None, *, log: Callable[[str], None] = print,
        objectives: Optional[Objectives] = None) -> FitResult:
    """Fits :class:`LearnedParams` to questions with gold (see the module docstring).

    Args:
      train, val: :class:`~cdsjax.eval.problems.Problem` s (or :class:`~cdsjax.learn.data.Example` s); questions
        without gold, or with no more notes than the budget, are skipped. Split them by document.
      config: a :class:`FitConfig` or a mapping of its fields.
      objectives: the compiled objectives to take this fit's from and leave it in (:class:`Objectives`; None: its
        own): fits in one process that pass the same one compile each setting once.

    Returns:
      :class:`FitResult`.
    """
    import jax

    cfg = config if isinstance(config, FitConfig) else FitConfig.from_mapping(config)
    objectives = objectives if objectives is not None else Objectives()
    if cfg.dtype == "float64" and not jax.config.jax_enable_x64:
        with jax.enable_x64(True):
            return _fit(train, val, cfg, log, objectives)
    return _fit(train, val, cfg, log, objectives)


def _fit(train, val, cfg: FitConfig, log, objectives: Objectives) -> FitResult:
    import jax.numpy as jnp
    import optax

    t0 = time.perf_counter()
    dtype = jnp.float64 if cfg.dtype == "float64" else jnp.float32
    keep = lambda xs: [e for e in _as_examples(xs) if e.size > (e.budget or cfg.budget)]
    train_ex, val_ex = keep(train), keep(val)
    if not train_ex:
        raise ValueError("no training question has gold evidence and more notes than the budget")
    train_b = make_batches(train_ex, buckets=cfg.buckets, max_batch=cfg.max_batch)
    val_b = make_batches(val_ex, buckets=cfg.buckets, max_batch=cfg.max_batch) if val_ex else []
    objective = objectives(cfg)
    theta0 = LearnedParams.paper().astype(dtype)
    optimizer = optax.adam(cfg.learning_rate)
    ckpt = FitCheckpoint(cfg.checkpoint_dir, theta0, optimizer) if cfg.checkpoint_dir else None
    identity = fit_identity(cfg, train_ex, val_ex)
    state = ckpt.load() if ckpt else None
    if state is not None and state.get("identity") != identity:
        raise ValueError(f"the checkpoint in {cfg.checkpoint_dir} belongs to a fit of other data or settings; "
                         "remove it or choose another checkpoint_dir")
    if state is None:
        state = {"identity": identity, "grid": None, "order": None, "run": 0, "step": 0, "theta": None, "opt": None, "best": None,
                 "best_theta": None, "run_best": -math.inf, "bad": 0, "history": [], "seconds": 0.0,
                 "global_steps": 0}
    elif state.get("done"):
        log(f"fit: already finished in {cfg.checkpoint_dir}")
        return _result(state, finished=True)

    if state["grid"] is None:
        grid = []
        for i, start in cfg.free_starts():
            theta = LearnedParams.paper().replace(**start).project().astype(dtype)
            stats, _ = objective.measure(theta, train_b, with_grad=False)
            grid.append({"start": i, "theta": theta.to_dict(), "train_surrogate": stats["surrogate"],
                         "train_recall": stats["recall"]})
            log(f"fit: grid point {i} {start}: train surrogate {stats['surrogate']:.4f} recall {stats['recall']:.4f}")
        state["grid"] = grid
        state["reference"] = {name: objective.measure(theta0, b, with_grad=False)[0]
                              for name, b in (("train", train_b), ("val", val_b)) if b}
        order = sorted(range(len(grid)), key=lambda i: -grid[i]["train_surrogate"])
        state["order"] = [grid[i]["start"] for i in order[:max(1, int(cfg.num_starts_fitted))]]

    bar = _bar(cfg, len(state["order"]) * cfg.steps, state)
    ran = 0
    finished = True
    while state["run"] < len(state["order"]):
        start = state["order"][state["run"]]
        if state["theta"] is None:
            (point,) = [g for g in state["grid"] if g["start"] == start]
            theta = LearnedParams.from_dict(point["theta"]).astype(dtype)
            state.update(theta=theta, opt=optimizer.init(theta), step=0, run_best=-math.inf, bad=0)
        while state["step"] < cfg.steps and state["bad"] < cfg.patience:
            if cfg.stop_after is not None and ran >= cfg.stop_after:
                finished = False
                break
            theta = state["theta"]
            stats, grad = objective.measure(theta, train_b, with_grad=True)
            entry = {"start": start, "step": state["step"], "train_surrogate": stats["surrogate"],
                     "train_recall": stats["recall"], "support": stats["support"], "converged": stats["converged"],
                     "penalty": penalty(theta, theta0, cfg.l2), "theta": theta.to_dict()}
            if state["step"] % cfg.eval_every == 0:
                _score_val(objective, theta, val_b, entry, state)
            state["history"].append(entry)
            loss_grad = jax_tree_sub(penalty_grad(theta, theta0, cfg.l2), grad)
            if cfg.frozen:  # zero gradients: Adam's update of a frozen parameter stays exactly 0
                loss_grad = loss_grad.replace(**{n: 0.0 * getattr(loss_grad, n) for n in cfg.frozen})
            updates, opt = optimizer.update(loss_grad, state["opt"], theta)
            state["theta"] = optax.apply_updates(theta, updates).project().astype(dtype)
            state["opt"] = opt
            state["step"] += 1
            state["global_steps"] += 1
            ran += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(run=state["run"], train=f"{stats['surrogate']:.3f}",
                                val=f"{entry.get('val_surrogate', float('nan')):.3f}")
            elif "val_surrogate" in entry or not val_b and entry["step"] % cfg.eval_every == 0:
                # no bar (progress off, or not a terminal): one line per validation, so a log shows the steps
                log(f"fit: start {start} (run {state['run'] + 1} of {len(state['order'])}) step {entry['step'] + 1} "
                    f"of {cfg.steps}: train surrogate {stats['surrogate']:.4f}"
                    + (f", validation surrogate {entry['val_surrogate']:.4f}" if "val_surrogate" in entry else ""))
            if ckpt:
                ckpt.save(state, time.perf_counter() - t0)
        if not finished:
            break
        state.update(run=state["run"] + 1, theta=None, opt=None)
        if ckpt:
            ckpt.save(state, time.perf_counter() - t0)
    if bar is not None:
        bar.close()
    state["seconds"] = state.get("seconds", 0.0) + (time.perf_counter() - t0)
    if finished:
        state["done"] = True
        if ckpt:
            ckpt.save(state, 0.0, final=True)
    return _result(state, finished=finished)


def _score_val(objective, theta, val_b, entry, state) -> None:
    """Scores the validation split into ``entry`` and keeps the best parameters (early stopping)."""
    if val_b:
        stats, _ = objective.measure(theta, val_b, with_grad=False)
        entry["val_surrogate"], entry["val_recall"] = stats["surrogate"], stats["recall"]
        key = stats["surrogate"]
    else:
        key = entry["train_surrogate"]
    if key > state["run_best"] + 1e-9:
        state["run_best"], state["bad"] = key, 0
    else:
        state["bad"] += 1
    if state["best"] is None or key > state["best"]["key"] + 1e-9:
        state["best"] = {**entry, "key": key}
        state["best_theta"] = theta


def _result(state, finished: bool) -> FitResult:
    best = state.get("best")
    theta = state.get("best_theta")
    if theta is None:
        theta = LearnedParams.from_dict(best["theta"]) if best else LearnedParams.paper()
    clean = lambda t: LearnedParams.from_dict({k: float(v) for k, v in t.to_dict().items()})
    return FitResult(theta=clean(theta), history=list(state["history"]), seconds=float(state.get("seconds", 0.0)),
                     grid=list(state.get("grid") or []), best=best, finished=finished,
                     reference=dict(state.get("reference") or {}))


def _bar(cfg: FitConfig, total: int, state):
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    done = sum(1 for _ in state["history"])
    return tqdm(total=total, initial=min(done, total), desc="fit cds-learned", unit="step")

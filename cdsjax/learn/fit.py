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
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import shutil
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from cdsjax.core.batching import DEFAULT_BUCKETS
from cdsjax.core.games.learned import LearnedParams
from cdsjax.learn.data import Batch, Example, example_of, make_batches

# The coarse grid the fit starts from: beta (the surrogate is not concave in it), relevance-weighted repulsion,
# and the same-page weight at one coarse value. The structure needs grid points of its own: at beta ~ 1 a
# small page weight barely changes the selection, so its gradient at theta0 is too weak to find it.
DEFAULT_STARTS = ({"beta": 0.1}, {"beta": 0.3}, {"beta": 1.0}, {"beta": 3.0},
                  {"beta": 0.3, "rel_repulsion": 1.0}, {"beta": 1.0, "rel_repulsion": 1.0},
                  {"beta": 0.03, "w_page": -1.0}, {"beta": 0.3, "w_page": -1.0}, {"beta": 0.1, "w_page": -3.0})


# what the surrogate counts: the selection's top-B ("top", selector cds_learned), or the pages of its one-note-per-page
# read-out ("pages", selector cds_learned_pages): each page scored by its best note (cdsjax.core.surrogates.page_readout_scores)
READOUTS = ("top", "pages")


@dataclasses.dataclass
class FitConfig:
    """How :func:`fit` runs (see the module docstring); ``readout`` is the selection the surrogate scores
    (:data:`READOUTS`)."""

    budget: int = 5
    steps: int = 30
    learning_rate: float = 0.05
    l2: float = 1e-3
    temperature: float = 0.2
    slack_weight: float = 1.0
    starts: Sequence[dict] = DEFAULT_STARTS
    num_starts_fitted: int = 2
    eval_every: int = 1
    patience: int = 5
    solver: str = "active_set"  # a name (cdsjax.core.solver_from_name): the active-set Newton solver
    tol: Optional[float] = None
    max_iter: Optional[int] = None
    dtype: str = "float64"
    buckets: Sequence[int] = DEFAULT_BUCKETS
    max_batch: int = 32
    checkpoint_dir: Optional[str] = None
    stop_after: Optional[int] = None
    progress: bool = True
    seed: int = 0
    readout: str = "top"
    # parameters held at the paper game's value (their gradient zeroed; grid starts that set one are skipped),
    # e.g. ("rel_repulsion",): a note block that does not read the question, so a served corpus shares one block
    frozen: Sequence[str] = ()

    @classmethod
    def from_mapping(cls, values: Any) -> "FitConfig":
        """From a dict or ``ConfigDict``; unknown keys raise ``ValueError``."""
        if hasattr(values, "to_dict"):
            values = values.to_dict()
        values = dict(values or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown fit option(s) {unknown}; allowed: {sorted(names)}")
        values = {k: v for k, v in values.items() if v is not None or k in ("tol", "max_iter", "checkpoint_dir",
                                                                            "stop_after")}
        if "starts" in values:
            values["starts"] = tuple(dict(s) for s in values["starts"])
        if "buckets" in values:
            values["buckets"] = tuple(int(b) for b in values["buckets"])
        if "frozen" in values:  # a sequence of names, or one comma-separated string (a command-line flag)
            given = values["frozen"]
            values["frozen"] = tuple(n.strip() for n in (given.split(",") if isinstance(given, str) else given)
                                     if str(n).strip())
        cfg = cls(**values)
        if cfg.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {cfg.dtype!r}")
        if cfg.readout not in READOUTS:
            raise ValueError(f"readout must be one of {list(READOUTS)}, got {cfg.readout!r}")
        for s in cfg.starts:
            LearnedParams.from_dict(s)
        unknown = sorted(set(cfg.frozen) - set(LearnedParams.names()))
        if unknown:
            raise ValueError(f"frozen names unknown parameter(s) {unknown}; parameters: {list(LearnedParams.names())}")
        if not cfg.free_starts():
            raise ValueError(f"every grid start sets a frozen parameter {list(cfg.frozen)}")
        return cfg

    def free_starts(self) -> List[tuple]:
        """``[(index, start)]`` of the grid starts that leave every frozen parameter at its paper value."""
        return [(i, s) for i, s in enumerate(self.starts) if not set(s) & set(self.frozen)]

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["starts"] = [dict(s) for s in self.starts]
        out["buckets"] = list(self.buckets)
        out["frozen"] = list(self.frozen)
        return out


@dataclasses.dataclass
class FitResult:
    """What :func:`fit` found.

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


class _Objective:
    """Jitted per-batch surrogate (value and gradient) and hard recall of the learned game."""

    def __init__(self, cfg: FitConfig):
        import jax
        import jax.numpy as jnp

        from cdsjax.core import CONVERGED, CDSProblem, SolveOptions, cds_equilibrium, solver_from_name
        from cdsjax.core.solvers.loop import support_count
        from cdsjax.core.surrogates import equilibrium_scores, hard_recall, page_readout_scores, soft_recall

        temp = float(cfg.temperature)
        options = SolveOptions(solver=solver_from_name(cfg.solver), tol=cfg.tol, max_iter=cfg.max_iter).check()

        def one(theta, a, budget):
            problem = CDSProblem.create(a["notes"], a["query"], a["valid"], links=a["links"], pages=a["pages"],
                                        doc_ids=a["doc_ids"], kinds=a["kinds"])
            # the one differentiable solve (implicit adjoint), the learned game as its params
            result, affinity = cds_equilibrium(problem, theta, options)
            scores = equilibrium_scores(affinity, result.x, cfg.slack_weight)
            if cfg.readout == "pages":  # the read-out's pages, each by its best note
                scores = page_readout_scores(scores, a["pages"], a["doc_ids"])
            # -inf threshold: the selection's fill rule reads past the support by the same slack ranking
            soft = soft_recall(scores, a["units"], budget=budget, temperature=temp, threshold=-jnp.inf,
                               unit_valid=a["unit_valid"])
            hard = hard_recall(jax.lax.stop_gradient(scores), a["units"], budget=budget, threshold=-jnp.inf,
                               unit_valid=a["unit_valid"])
            return (soft, hard, (result.status == CONVERGED).astype(soft.dtype),
                    support_count(result.x, affinity.free).astype(soft.dtype))

        def batch_sum(theta, arrays, weight, budget):
            soft, hard, conv, supp = jax.vmap(lambda a: one(theta, a, budget))(arrays)
            w = weight.astype(soft.dtype)
            return jnp.sum(w * soft), (jnp.sum(w * hard), jnp.sum(w * conv), jnp.sum(w * supp))

        self.value_and_grad = jax.jit(jax.value_and_grad(batch_sum, has_aux=True), static_argnums=3)
        self.value = jax.jit(batch_sum, static_argnums=3)
        self.budget = int(cfg.budget)

    def measure(self, theta, batches: Sequence[Batch], with_grad: bool):
        import jax

        total, hard, conv, supp, count, grad = 0.0, 0.0, 0.0, 0.0, 0, None
        for b in batches:
            if with_grad:
                (s, aux), g = self.value_and_grad(theta, b.arrays, b.weight, b.budget or self.budget)
                grad = g if grad is None else jax.tree_util.tree_map(lambda x, y: x + y, grad, g)
            else:
                s, aux = self.value(theta, b.arrays, b.weight, b.budget or self.budget)
            total += float(s)
            hard, conv, supp = hard + float(aux[0]), conv + float(aux[1]), supp + float(aux[2])
            count += b.count if b.total is None else b.total
        c = count if count > 0 else 1.0
        stats = {"surrogate": total / c, "recall": hard / c, "converged": conv / c, "support": supp / c}
        if grad is not None:
            grad = jax.tree_util.tree_map(lambda x: x / c, grad)
        return stats, grad


class Objectives:
    """The jitted objectives of fits, one per setting of what they compile (solver, tolerance, steps,
    temperature, slack weight, budget, read-out). Fits given the same ``Objectives`` (the folds of a
    cross-validation) reuse its compiled executables instead of compiling and loading their own each time,
    which also bounds the process's code memory (many loaded executables exhaust LLVM's mappings)."""

    def __init__(self):
        self._by_key: Dict[tuple, _Objective] = {}

    def __call__(self, cfg: FitConfig) -> _Objective:
        """The objective of ``cfg``'s settings, made on first use."""
        key = (cfg.solver, cfg.tol, cfg.max_iter, float(cfg.temperature), float(cfg.slack_weight),
               int(cfg.budget), cfg.readout)
        if key not in self._by_key:
            self._by_key[key] = _Objective(cfg)
        return self._by_key[key]


def _penalty_grad(theta, theta0, l2: float):
    import jax

    return jax.tree_util.tree_map(lambda t, t0: 2.0 * l2 * (t - t0), theta, theta0)


def _penalty(theta, theta0, l2: float) -> float:
    return float(l2 * sum(float((getattr(theta, k) - getattr(theta0, k)) ** 2) for k in LearnedParams.names()))


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
    ckpt = _Checkpoint(cfg.checkpoint_dir, theta0, optimizer) if cfg.checkpoint_dir else None
    identity = _identity(cfg, train_ex, val_ex)
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
                     "penalty": _penalty(theta, theta0, cfg.l2), "theta": theta.to_dict()}
            if state["step"] % cfg.eval_every == 0:
                _score_val(objective, theta, val_b, entry, state)
            state["history"].append(entry)
            loss_grad = jax_tree_sub(_penalty_grad(theta, theta0, cfg.l2), grad)
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


def _identity(cfg: FitConfig, train: Sequence[Example], val: Sequence[Example]) -> str:
    """What a checkpoint must match to be resumed: the settings that shape the fit and the questions."""
    import hashlib

    settings = {k: v for k, v in cfg.to_dict().items() if k not in ("checkpoint_dir", "stop_after", "progress")}
    if settings.get("readout") == "top":  # the defaults: checkpoints written before the options still resume
        del settings["readout"]
    if settings.get("solver") == "active_set":  # written as "converged" before the solver had its own name
        settings["solver"] = "converged"
    if not settings.get("frozen"):
        settings.pop("frozen", None)
    tag = lambda e: e.qid if e.weight == 1.0 else f"{e.qid}*{e.weight:.9g}"
    body = json.dumps({"settings": settings, "train": [tag(e) for e in train], "val": [tag(e) for e in val]},
                      sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def jax_tree_sub(a, b):
    import jax

    return jax.tree_util.tree_map(lambda x, y: x - y, a, b)


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


class _Checkpoint:
    """The fit's state on disk: arrays (parameters, Adam state, best parameters) with orbax, the rest JSON."""

    def __init__(self, directory: str, theta0: LearnedParams, optimizer):
        self.dir = pathlib.Path(directory)
        self.theta0 = theta0
        self.optimizer = optimizer

    def save(self, state: dict, elapsed: float, final: bool = False) -> None:
        import jax
        import orbax.checkpoint as ocp

        self.dir.mkdir(parents=True, exist_ok=True)
        arrays = {}
        if state.get("theta") is not None:
            arrays["theta"] = state["theta"].to_dict()
            arrays["opt"] = {str(i): np.asarray(v) for i, v in
                             enumerate(jax.tree_util.tree_leaves(state["opt"]))}
        if state.get("best_theta") is not None:
            arrays["best_theta"] = state["best_theta"].to_dict()
        arrays = jax.tree_util.tree_map(lambda v: np.asarray(v, np.float64) if np.ndim(v) == 0 else np.asarray(v),
                                        arrays)
        tmp = self.dir / "arrays.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        if arrays:
            with ocp.StandardCheckpointer() as ck:
                ck.save(tmp.absolute(), arrays)
                ck.wait_until_finished()
        meta = {k: v for k, v in state.items() if k not in ("theta", "opt", "best_theta")}
        meta["seconds_so_far"] = state.get("seconds", 0.0) + elapsed
        meta["has"] = sorted(arrays)
        final_dir = self.dir / "arrays"
        if final_dir.exists():
            shutil.rmtree(final_dir)
        if arrays:
            tmp.rename(final_dir)
        part = self.dir / "state.json.tmp"
        part.write_text(json.dumps(meta, default=float))
        part.replace(self.dir / "state.json")

    def load(self) -> Optional[dict]:
        import jax
        import jax.numpy as jnp
        import orbax.checkpoint as ocp

        path = self.dir / "state.json"
        if not path.is_file():
            return None
        meta = json.loads(path.read_text())
        state = dict(meta)
        state["seconds"] = meta.pop("seconds_so_far", meta.get("seconds", 0.0))
        state["theta"] = state["opt"] = state["best_theta"] = None
        if meta.get("has"):
            with ocp.StandardCheckpointer() as ck:
                arrays = ck.restore((self.dir / "arrays").absolute())
            dtype = self.theta0.beta.dtype
            if "theta" in arrays:
                theta = LearnedParams.from_dict({k: float(v) for k, v in arrays["theta"].items()}).astype(dtype)
                template = self.optimizer.init(theta)
                leaves, treedef = jax.tree_util.tree_flatten(template)
                restored = [jnp.asarray(arrays["opt"][str(i)], leaf.dtype) for i, leaf in enumerate(leaves)]
                state["theta"] = theta
                state["opt"] = jax.tree_util.tree_unflatten(treedef, restored)
            if "best_theta" in arrays:
                state["best_theta"] = LearnedParams.from_dict(
                    {k: float(v) for k, v in arrays["best_theta"].items()}).astype(dtype)
        return state

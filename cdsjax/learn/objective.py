r"""The surrogate a fit of the learned game climbs, jitted: per batch of padded questions, the smooth
recall@B of the equilibrium's scores with its gradient through the implicit derivatives, the hard recall@B,
the share of converged solves and the support size (what the objective is and why: :mod:`cdsjax.learn.fit`);
and the :math:`\ell_2` pull towards the paper's game.
"""

from __future__ import annotations

from typing import Dict, Sequence

from cdsjax.core.games.learned import LearnedParams
from cdsjax.learn.data import Batch
from cdsjax.learn.fit_config import FitConfig


class Objective:
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
        self._by_key: Dict[tuple, Objective] = {}

    def __call__(self, cfg: FitConfig) -> Objective:
        """The objective of ``cfg``'s settings, made on first use."""
        key = (cfg.solver, cfg.tol, cfg.max_iter, float(cfg.temperature), float(cfg.slack_weight),
               int(cfg.budget), cfg.readout)
        if key not in self._by_key:
            self._by_key[key] = Objective(cfg)
        return self._by_key[key]


def penalty_grad(theta, theta0, l2: float):
    """The gradient of :func:`penalty` in ``theta``."""
    import jax

    return jax.tree_util.tree_map(lambda t, t0: 2.0 * l2 * (t - t0), theta, theta0)


def penalty(theta, theta0, l2: float) -> float:
    r""":math:`\ell_2 \lVert\theta - \theta_0\rVert^2`."""
    return float(l2 * sum(float((getattr(theta, k) - getattr(theta0, k)) ** 2) for k in LearnedParams.names()))


def jax_tree_sub(a, b):
    """``a - b``, leaf by leaf."""
    import jax

    return jax.tree_util.tree_map(lambda x, y: x - y, a, b)


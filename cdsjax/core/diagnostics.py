"""The solver diagnostics of a selection as plain Python values: one function for records, answers and traces.

The evaluation records (:mod:`cdsjax.eval.records`), ``ask --json`` / the server
(:meth:`cdsjax.pipeline.Pipeline.diagnostics`) and the planning agent's traces all call
:func:`diagnostics`; it reads concrete arrays (call it outside ``jit``).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from cdsjax.core.solvers.active_set import ActiveSet
from cdsjax.core.solvers.inimdyn import InImDyn
from cdsjax.core.solvers.pdas import PrimalDualActiveSet
from cdsjax.core.solvers.replicator import Replicator
from cdsjax.core.types import CONVERGED, FILL_REASONS, STATUSES

# The two modes a CDS solve runs in, by the solver's type: the paper's replicator dynamics (which stop on their
# step size) and every other solver (which stop on the equilibrium's Nash error).
PAPER_MODE, CONVERGED_MODE = "paper", "converged"
# A result records the solvers that ran by name (static strings of a jitted result): their types, to read the mode.
_SOLVER_TYPES = {cls.name: cls for cls in (Replicator, InImDyn, ActiveSet, PrimalDualActiveSet)}

# Fields of the SolverResult copied as they are, after ``num_iters`` and ``converged`` (``status == CONVERGED``);
# ``support_size`` is the selection's (notes only).
RESULT_FIELDS = ("kkt_residual", "objective", "step")


def _plain(value) -> Any:
    v = np.asarray(value)
    return bool(v) if v.dtype == bool else (int(v) if v.dtype.kind in "iu" else float(v))


def solver_mode(solver) -> str:
    """The mode of ``solver``, read from its type: :data:`PAPER_MODE` for replicator dynamics (the paper's
    algorithm), :data:`CONVERGED_MODE` for every other solver and combination. ``solver``: a solver object, or
    the name a :class:`~cdsjax.core.types.SolverResult` records of the solver that ran."""
    kind = _SOLVER_TYPES.get(solver) if isinstance(solver, str) else type(solver)
    return PAPER_MODE if kind is not None and issubclass(kind, Replicator) else CONVERGED_MODE


def ran_paper_mode(diagnostics: Dict[str, Any]) -> bool:
    """Whether the :func:`diagnostics` of a selection say its point came from paper mode (replicator dynamics)."""
    return diagnostics.get("mode") == PAPER_MODE


def diagnostics(selection: Any, *, num_notes: Optional[int] = None,
                valid: Optional[np.ndarray] = None) -> Dict[str, Any]:
    """Solver diagnostics of a CDS selection as plain numbers ({} for baselines).

    Always: ``num_iters``, ``converged``, ``kkt_residual``, ``objective``, ``step`` (of the solve),
    ``support_size`` (notes, not the query vertices, with weight above the selection's threshold),
    ``num_filled`` / ``fill_reason`` (picks from outside the support and why, :mod:`cdsjax.core.ranking`),
    ``beta`` (the note-block strength; ``cds_support`` chooses it per question) and ``status``
    (``"converged"``, ``"max_steps"``, ``"nonfinite"`` or ``"singular"``).

    First the solvers that ran, read off the result: ``solver`` (the solver the selection ran first: ``"pdas"``
    for the served solver on a corpus block, ``"active_set"`` for it on a dense payoff, the caller's solver
    otherwise), ``mode`` (:func:`solver_mode` of the solver that gave the point) and ``solver_run`` (the
    solver that gave the point: ``solver``, or its fallback where that ran).

    Args:
      selection: a :class:`~cdsjax.core.Selection` (concrete arrays).
      num_notes: the problem's real note count; adds ``whole_support`` (the support is every note).
      valid: ``[n]`` bool, the padded note mask; adds ``alpha`` and ``query_weight`` (the weight on the
        query vertices, the ``m`` entries of ``x`` before the ``n`` notes).
    """
    res = getattr(selection, "result", None)
    if res is None:
        return {}
    out: Dict[str, Any] = {}
    if getattr(res, "solvers", ()):
        out["solver"], out["mode"], out["solver_run"] = res.solvers[0], solver_mode(res.solver_run), res.solver_run
    out["num_iters"] = _plain(res.num_iters)
    out["converged"] = bool(np.asarray(res.status) == CONVERGED)
    out.update({name: _plain(getattr(res, name)) for name in RESULT_FIELDS})
    if getattr(selection, "support_size", None) is not None:
        out["support_size"] = _plain(selection.support_size)
        out["num_filled"] = _plain(selection.num_filled)
        out["fill_reason"] = FILL_REASONS[int(np.asarray(selection.fill_reason))]
        if num_notes is not None:
            out["whole_support"] = bool(out["support_size"] >= int(num_notes))
    if valid is not None:
        x = np.asarray(res.x)
        out["alpha"] = _plain(res.alpha)
        out["query_weight"] = float(x[: x.shape[0] - len(valid)].sum())
    if getattr(selection, "beta", None) is not None:
        out["beta"] = float(np.asarray(selection.beta))
    out["status"] = STATUSES[int(np.asarray(res.status))]
    return out

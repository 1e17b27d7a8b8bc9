"""Agents that call the reader several times per question (they use :mod:`cdsjax.io`, so they are not core).

:mod:`cdsjax.agents.planning` is the planning-graph agent (G²-Reader §3.3); :mod:`cdsjax.agents.plan`
reads, repairs and orders the plans its model writes.
"""

from cdsjax.agents.plan import Plan, PlanError, PlanNode, Verdict, parse_plan, parse_sufficiency, topological_order
from cdsjax.agents.agent import PlanningAgent
from cdsjax.agents.retrieval import SelectorRetriever, make_retriever, run_planning
from cdsjax.agents.trace import PlanningResult

__all__ = [
    "Plan",
    "PlanError",
    "PlanNode",
    "PlanningAgent",
    "PlanningResult",
    "SelectorRetriever",
    "Verdict",
    "make_retriever",
    "parse_plan",
    "parse_sufficiency",
    "run_planning",
    "topological_order",
]

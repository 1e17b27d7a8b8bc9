"""What a planning run records: each executed sub-question, each round, and the result with its trace."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from cdsjax.agents.plan import Plan, PlanNode, Verdict
from cdsjax.io.reading.reader import ABSTAIN
from cdsjax.io.reading.prompt import EvidenceItem
from cdsjax.io.reading.replies import strip_citations


def evidence_dict(item: EvidenceItem, *, text_chars: Optional[int] = 1500) -> dict:
    """An evidence item in the format of ``cdsjax ask --json`` (document, page 0-based, bbox, kind, ...)."""
    text = item.caption if item.is_visual and item.caption else (item.text or item.summary)
    if text_chars is not None:
        text = text[:text_chars]
    return {
        "rank": item.rank, "score": item.score, "document": item.doc_id, "page": item.page,
        "bbox": list(item.bbox) if item.bbox is not None else None, "kind": item.kind, "text": text,
        "note_id": item.note_id, "image_path": item.image_path, "summary": item.summary, "caption": item.caption,
    }


@dataclasses.dataclass
class NodeResult:
    """One executed sub-question.

    Attributes:
      node: the plan node.
      evidence: the evidence its worker saw.
      answer: the worker's answer (citation marks kept), or None when the call failed.
      cited: note ids of the evidence the answer cites.
      abstained: True when the worker found the evidence insufficient.
      reused: True when the node was carried over unchanged from an earlier round.
      error: why the worker call failed, or None.
    """

    node: PlanNode
    evidence: List[EvidenceItem]
    answer: Optional[str]
    cited: List[str]
    abstained: bool
    reused: bool = False
    error: Optional[str] = None

    @property
    def finding(self) -> str:
        """The answer without citation marks (they number this node's evidence, nobody else's)."""
        if self.answer is None:
            return f"{ABSTAIN} (the step failed: {self.error})"
        return strip_citations(self.answer).strip() or ABSTAIN

    def to_dict(self, snippet_chars: int) -> dict:
        return {
            **self.node.to_dict(), "answer": self.answer, "abstained": self.abstained, "cited": self.cited,
            "reused": self.reused, "error": self.error,
            "evidence": [evidence_dict(e, text_chars=snippet_chars) for e in self.evidence],
        }


@dataclasses.dataclass
class Round:
    """One execution of a plan and its check (round 0 runs the decomposer's plan, round k the k-th
    refinement)."""

    index: int
    plan: Plan
    source: str  # "decomposer", "refinement", "fallback" or "previous plan"
    repairs: List[str]
    plan_error: Optional[str]
    raw_plan: List[str]
    nodes: Dict[str, NodeResult] = dataclasses.field(default_factory=dict)
    joint_evidence: Optional[List[EvidenceItem]] = None
    retrieval: List[dict] = dataclasses.field(default_factory=list)
    verdict: Optional[Verdict] = None
    verdict_error: Optional[str] = None
    raw_verdict: List[str] = dataclasses.field(default_factory=list)

    def to_dict(self, snippet_chars: int) -> dict:
        out = {
            "round": self.index, "plan_source": self.source, "plan": self.plan.to_dict(),
            "plan_repairs": self.repairs, "plan_error": self.plan_error,
            "nodes": [self.nodes[i].to_dict(snippet_chars) for i in self.plan.order if i in self.nodes],
            "verdict": self.verdict.to_dict() if self.verdict is not None else None,
            "verdict_error": self.verdict_error, "retrieval": self.retrieval,
        }
        if self.joint_evidence is not None:
            out["joint_evidence"] = [evidence_dict(e, text_chars=snippet_chars) for e in self.joint_evidence]
        if self.plan_error is not None or self.repairs:
            out["raw_plan"] = self.raw_plan
        if self.verdict_error is not None:
            out["raw_verdict"] = self.raw_verdict
        return out


@dataclasses.dataclass
class PlanningResult:
    """The agent's answer with its trace.

    Attributes:
      question: the question.
      answer: the reasoner's answer, or None when it failed (``error`` says why).
      evidence: what the reasoner read (deduplicated union of the final round's evidence and the probe).
      explored: every distinct note retrieved in any round, the probe included, in first-seen order.
      probe: the probing retrieval's evidence.
      rounds: the executed rounds.
      stop_reason: why refinement stopped.
      reasoner: model, cited note ids, abstained — or None.
      combined: the retrieval mode (None: one selection per sub-question).
      llm_calls: chat requests made; usage: summed token counts; timings: seconds per stage.
      error: why no answer was produced, or None.
    """

    question: str
    answer: Optional[str]
    evidence: List[EvidenceItem]
    explored: List[EvidenceItem]
    probe: List[EvidenceItem]
    rounds: List[Round]
    stop_reason: str
    reasoner: Optional[dict]
    combined: Optional[str]
    llm_calls: int
    usage: Dict[str, int]
    timings: Dict[str, float]
    error: Optional[str] = None

    def to_dict(self, *, snippet_chars: int = 300) -> dict:
        """JSON-serialisable: ``answer``, ``evidence`` (``cdsjax ask --json`` format) and ``trace``."""
        return {
            "question": self.question,
            "answer": self.answer,
            "agent": "planning",
            "combined": self.combined,
            "evidence": [evidence_dict(e) for e in self.evidence],
            "reader": self.reasoner,
            "error": self.error,
            "trace": {
                "probe": [evidence_dict(e, text_chars=snippet_chars) for e in self.probe],
                "rounds": [r.to_dict(snippet_chars) for r in self.rounds],
                "stop_reason": self.stop_reason,
                "explored_note_ids": [e.note_id for e in self.explored],
                "llm_calls": self.llm_calls,
                "usage": self.usage,
            },
            "timings": self.timings,
        }

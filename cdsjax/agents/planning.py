r"""The planning-graph agent (G²-Reader §3.3): decompose, retrieve per sub-question, check, refine, answer.

One question runs like this:

1. **Probe.** Retrieve for the question itself; a short digest of that evidence tells the decomposer
   what the documents hold.
2. **Decompose.** The model writes a DAG of at most 6 sub-questions, dependency chains at most 3 long
   (:mod:`cdsjax.agents.plan` reads and repairs it).
3. **Execute.** Sub-questions run in a topological order (Kahn's algorithm). Each one retrieves its own
   evidence (any selector; or, in combined mode, one selection for all sub-questions at once, every
   sub-question a query vertex of one constrained dominant set), and a worker (the reader) answers it
   from that evidence plus the answers of the nodes it needs.
4. **Check.** An evidence checker reads the findings and replies ``{"sufficient": bool, "gaps": [...]}``.
5. **Refine.** While the checker finds gaps and fewer than ``tau_max`` refinements were made, the model
   revises the DAG for the gaps and steps 3-4 run again (unchanged nodes are not recomputed).
6. **Answer.** A reasoner (the reader) answers the question from the union of the evidence and the
   sub-question findings.

Every step is recorded: :meth:`PlanningResult.to_dict` holds the answer, the final evidence in the format
of ``cdsjax ask --json``, and the trace (the DAG of each round, each node's evidence and answer, the
checker's verdicts, every repair made to a model reply, raw replies that could not be used).

Model replies are never trusted to be well formed: an unreadable plan is asked for once more, then
replaced by a one-node plan (the question itself) or, in a refinement, by the previous plan; an
unreadable verdict ends refinement. The reason is recorded each time. Server failures that every later
call would hit too (unreachable, unknown model, refused key) are raised as :class:`ReaderError`.

    agent = PlanningAgent(ReaderConfig(base_url=...), retrieve)
    result = agent.run("Which of the two systems has the larger Table 3 score?")
    result.answer, result.to_dict()["trace"]["rounds"][0]["plan"]
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from cdsjax.agents.plan import (
    MAX_DEPTH,
    MAX_NODES,
    Plan,
    PlanError,
    PlanNode,
    Verdict,
    parse_plan,
    parse_sufficiency,
)
from cdsjax.io.llm import FATAL_KINDS, ReaderConfig, ReaderError
from cdsjax.io.reader import ABSTAIN, EvidenceItem, Reader, as_evidence
from cdsjax.io.replies import strip_citations, strip_thinking

COMBINED_MODES = (None, "single", "peel")

# retrieve(queries) -> one evidence list per query; in combined mode retrieve(queries, combined=mode) ->
# a one-element list holding the joint selection.
RetrieveFn = Callable[..., List[List[EvidenceItem]]]


# --------------------------------------------------------------------------- prompts

DECOMPOSER_SYSTEM = """\
You plan the research needed to answer a question about a collection of documents. You do not answer \
the question. You split it into sub-questions that can each be looked up in the documents, and say which \
sub-questions need the answers of others.

Rules:
- At most {max_nodes} sub-questions. A question that needs a single look-up gets a single sub-question.
- Each sub-question must make sense on its own as a search query: name the entities, figures, tables \
or sections it is about instead of writing "it" or "the above".
- "needs" lists the ids of the sub-questions whose answers this one uses. No cycles, and no chain of \
needs longer than {max_depth} sub-questions.
- Do not repeat the whole original question as a sub-question; it is answered at the end from your \
sub-questions.

Reply with one JSON object and nothing else, in this form:
{{"nodes": [{{"id": "q1", "question": "...", "needs": []}}, {{"id": "q2", "question": "...", "needs": ["q1"]}}]}}"""

DECOMPOSER_USER = """\
A first search for the question found this (excerpts, best match first):

{digest}

Question: {question}

Write the plan as JSON."""

REFINER_USER = """\
Question: {question}

A first search for the question found this (excerpts, best match first):

{digest}

The previous plan was:
{plan}

Its sub-questions were answered as follows:
{findings}

A check of these findings says this is still missing:
{gaps}

Revise the plan so that it closes these gaps. Keep sub-questions that worked (same id and wording, so \
they are not redone), reword or replace the ones that failed, add sub-questions for what is missing, and \
drop the ones that do not help. The same rules apply (at most {max_nodes} sub-questions, chains of needs \
at most {max_depth} long). Reply with the revised plan as one JSON object in the same form, nothing else."""

CHECKER_SYSTEM = """\
You check whether research findings are enough to answer a question about documents. You do not answer \
the question. Be strict: the findings are sufficient only if together they establish every fact, number \
and comparison the answer needs; a finding that says "Not answerable" establishes nothing.

Reply with one JSON object and nothing else:
{"sufficient": true or false, "gaps": ["...", ...]}
When the findings are not sufficient, list one to three gaps, each a specific piece of information \
that is still missing, phrased so that it can be looked up; when they are sufficient, "gaps" is []."""

CHECKER_USER = """\
Question: {question}

A first search for the question found this (excerpts, best match first):

{digest}

Findings of the sub-questions, each answered from its own evidence:
{findings}

Are the findings sufficient to answer the question? Reply with the JSON object."""

RETRY_USER = "That reply could not be used ({reason}). Reply again with the JSON object only, in the form asked for."

WORKER_CONTEXT = """\

Facts established by earlier steps (take them as given; they are not numbered evidence):
{facts}"""

REASONER_CONTEXT = """\

Findings of sub-questions that were researched for this question, each from its own evidence (use them \
together with the numbered evidence above; cite only the numbered evidence):
{findings}"""


# --------------------------------------------------------------------------- results


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


# --------------------------------------------------------------------------- the agent


@dataclasses.dataclass(eq=False)
class PlanningAgent:
    """Answers questions with a planning graph of sub-questions (see the module docstring).

    Args:
      reader: a :class:`ReaderConfig` or a :class:`Reader` (one OpenAI-compatible model plays decomposer,
        worker, checker and reasoner).
      retrieve: ``retrieve(queries) -> [evidence list per query]``; in combined mode it is called as
        ``retrieve(queries, combined=mode)`` and returns ``[joint evidence list]`` (see
        :func:`make_retriever`). When it has a ``last_diagnostics`` attribute (a list of dicts), that is
        recorded after each call.
      combined: None (each sub-question retrieves alone), "single" (one selection with every
        sub-question as a query vertex) or "peel" (the same, extracted by peeling).
      tau_max: most refinement rounds (paper: 3; 0 runs the first plan only).
      max_nodes, max_depth: plan limits (paper: 6 nodes, depth 3).
      max_final_evidence: most evidence items the reasoner reads (taken round-robin over the probe and
        the nodes, best first, without duplicates).
      digest_items, digest_chars: how much of the probe the decomposer and checker see.
      json_retries: how many times an unreadable plan or verdict is asked for again.
      plan_max_tokens: token limit of decomposer and checker replies.
      cycles: "repair" or "reject" cyclic plans (see :func:`~cdsjax.agents.plan.parse_plan`).
    """

    reader: Union[ReaderConfig, Reader]
    retrieve: RetrieveFn
    _: dataclasses.KW_ONLY
    combined: Optional[str] = None
    tau_max: int = 3
    max_nodes: int = MAX_NODES
    max_depth: int = MAX_DEPTH
    max_final_evidence: int = 20
    digest_items: int = 5
    digest_chars: int = 400
    json_retries: int = 1
    plan_max_tokens: int = 1024
    cycles: str = "repair"

    def __post_init__(self):
        if self.combined not in COMBINED_MODES:
            raise ValueError(f"combined must be one of {COMBINED_MODES}, got {self.combined!r}")
        checks = {"tau_max": self.tau_max >= 0, "max_nodes": self.max_nodes >= 1, "max_depth": self.max_depth >= 1,
                  "max_final_evidence": self.max_final_evidence >= 1, "digest_items": self.digest_items >= 0,
                  "digest_chars": self.digest_chars >= 1, "json_retries": self.json_retries >= 0,
                  "plan_max_tokens": self.plan_max_tokens >= 1}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name} is out of range: {getattr(self, name)!r}")
        if self.cycles not in ("repair", "reject"):
            raise ValueError(f"cycles must be 'repair' or 'reject', got {self.cycles!r}")
        if not callable(self.retrieve):
            raise TypeError("retrieve must be callable: retrieve(queries) -> list of evidence lists")
        if not isinstance(self.reader, Reader):
            self.reader = Reader(self.reader)

    # ------------------------------------------------------------------ run
    def run(self, question: str) -> PlanningResult:
        """Answers ``question``; raises :class:`ReaderError` only for failures every call would hit."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question must be a non-empty string")
        question = " ".join(question.split())
        state = _RunState()
        t0 = time.perf_counter()
        probe_lists, probe_diag = self._retrieve([question], combined=None)
        probe = probe_lists[0]
        digest = self._digest(probe)
        state.seen(probe)
        state.retrieved[question] = probe
        timings = {"probe": time.perf_counter() - t0}

        plan, source, repairs, error, raw = self._decompose(question, digest, state)
        rounds: List[Round] = []
        stop_reason = "tau_max reached"
        for index in range(self.tau_max + 1):
            current = Round(index, plan, source, repairs, error, raw)
            if index == 0:
                current.retrieval.append({"probe": probe_diag})
            rounds.append(current)
            self._execute(question, current, state)
            self._check(question, digest, current, state)
            if current.verdict is None:
                stop_reason = f"the checker's verdict could not be read ({current.verdict_error})"
                break
            if current.verdict.sufficient:
                stop_reason = "sufficient"
                break
            if index == self.tau_max:
                stop_reason = f"tau_max={self.tau_max} refinement rounds reached"
                break
            plan, source, repairs, error, raw = self._refine(question, digest, current, state)
            if error is not None:
                stop_reason = f"the refined plan could not be used ({error})"
                break
            if plan.signature() == current.plan.signature():
                stop_reason = "the refinement returned the same plan"
                break
        timings["plan_and_execute"] = time.perf_counter() - t0 - timings["probe"]

        final = rounds[-1]
        evidence = self._final_evidence(probe, final)
        t1 = time.perf_counter()
        answer, reasoner_info, failure = self._reason(question, evidence, final, state)
        timings["reason"] = time.perf_counter() - t1
        timings["total"] = time.perf_counter() - t0
        return PlanningResult(
            question=question, answer=answer, evidence=evidence, explored=state.explored, probe=probe,
            rounds=rounds, stop_reason=stop_reason, reasoner=reasoner_info, combined=self.combined,
            llm_calls=state.calls, usage=state.usage, timings=timings, error=failure)

    # ------------------------------------------------------------------ retrieval
    def _retrieve(self, queries: List[str], *, combined: Optional[str]) -> Tuple[List[List[EvidenceItem]], Any]:
        out = self.retrieve(queries) if combined is None else self.retrieve(queries, combined=combined)
        expected = len(queries) if combined is None else 1
        if not isinstance(out, (list, tuple)) or len(out) != expected:
            got = len(out) if isinstance(out, (list, tuple)) else type(out).__name__
            raise ValueError(f"retrieve returned {got} evidence lists for {len(queries)} queries "
                             f"(expected {expected}{' joint list' if combined else ''})")
        lists = [as_evidence(items) for items in out]
        return lists, getattr(self.retrieve, "last_diagnostics", None)

    def _digest(self, items: Sequence[EvidenceItem]) -> str:
        if not items or self.digest_items == 0:
            return "(nothing was found)"
        lines = []
        for k, item in enumerate(items[: self.digest_items], start=1):
            body = item.caption if item.is_visual and item.caption else (item.summary or item.text)
            if item.is_visual and item.summary and item.summary != body:
                body = f"{body} — {item.summary}"
            body = " ".join(body.split())
            if len(body) > self.digest_chars:
                body = body[: self.digest_chars - 1].rstrip() + "…"
            lines.append(f"[{k}] {item.kind}, {item.doc_id}, page {item.page + 1}: {body}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ model calls
    def _chat(self, messages: List[dict], state: "_RunState", *, max_tokens: Optional[int] = None) -> str:
        reply = self.reader.chat(messages, max_tokens=max_tokens or self.plan_max_tokens)
        state.count(reply.usage)
        return reply.content

    def _answer(self, prompt: str, evidence: List[EvidenceItem], state: "_RunState"):
        """The reader's answer to ``prompt`` over ``evidence``: ``(output, None)``, or
        ``(None, error)`` when the request failed in a way the run survives (a failed
        call still counts)."""
        try:
            out = self.reader.answer(prompt, evidence)
        except ReaderError as err:
            if err.kind in FATAL_KINDS:
                raise
            state.calls += 1
            return None, err
        state.count(out.usage)
        return out, None

    def _json_call(self, messages: List[dict], parse: Callable[[str], Any], state: "_RunState"
                   ) -> Tuple[Any, Optional[str], List[str]]:
        """Calls the model and parses its reply, asking again on a reply that cannot be parsed.

        Returns (parsed value or None, the last parse error or None, raw replies)."""
        raw: List[str] = []
        error = None
        messages = list(messages)
        for attempt in range(self.json_retries + 1):
            try:
                reply = self._chat(messages, state)
            except ReaderError as err:
                if err.kind in FATAL_KINDS:
                    raise
                return None, f"the request failed: {err}", raw
            raw.append(reply)
            try:
                return parse(reply), None, raw
            except PlanError as err:
                error = str(err)
            messages = messages + [{"role": "assistant", "content": reply},
                                   {"role": "user", "content": RETRY_USER.format(reason=error)}]
        return None, error, raw

    def _plan_parser(self, question: str) -> Callable[[str], Tuple[Plan, List[str]]]:
        return lambda reply: parse_plan(reply, question=question, max_nodes=self.max_nodes,
                                        max_depth=self.max_depth, cycles=self.cycles)

    def _decompose(self, question: str, digest: str, state: "_RunState"):
        system = DECOMPOSER_SYSTEM.format(max_nodes=self.max_nodes, max_depth=self.max_depth)
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": DECOMPOSER_USER.format(digest=digest, question=question)}]
        parsed, error, raw = self._json_call(messages, self._plan_parser(question), state)
        if parsed is None:
            # Without a usable plan the question itself is the one sub-question: plain retrieve-then-read
            # with a check, which refinement may still improve.
            plan = Plan.from_nodes([PlanNode("q1", question)])
            return plan, "fallback", [], error, raw
        plan, repairs = parsed
        return plan, "decomposer", repairs, None, raw

    def _refine(self, question: str, digest: str, current: Round, state: "_RunState"):
        system = DECOMPOSER_SYSTEM.format(max_nodes=self.max_nodes, max_depth=self.max_depth)
        user = REFINER_USER.format(
            question=question, digest=digest, plan=current.plan.to_json(),
            findings=self._findings(current), gaps="\n".join(f"- {g}" for g in current.verdict.gaps),
            max_nodes=self.max_nodes, max_depth=self.max_depth)
        parsed, error, raw = self._json_call(
            [{"role": "system", "content": system}, {"role": "user", "content": user}],
            self._plan_parser(question), state)
        if parsed is None:
            return current.plan, "previous plan", [], error, raw
        plan, repairs = parsed
        return plan, "refinement", repairs, None, raw

    def _check(self, question: str, digest: str, current: Round, state: "_RunState") -> None:
        user = CHECKER_USER.format(question=question, digest=digest, findings=self._findings(current))
        verdict, error, raw = self._json_call(
            [{"role": "system", "content": CHECKER_SYSTEM}, {"role": "user", "content": user}],
            parse_sufficiency, state)
        current.verdict, current.verdict_error, current.raw_verdict = verdict, error, raw

    def _findings(self, current: Round) -> str:
        lines = []
        for node_id in current.plan.order:
            result = current.nodes[node_id]
            lines.append(f"- {node_id}: {result.node.question}\n  answer: {result.finding}")
        return "\n".join(lines) if lines else "(none)"

    # ------------------------------------------------------------------ execution
    def _execute(self, question: str, current: Round, state: "_RunState") -> None:
        plan = current.plan
        questions = [plan.node(i).question for i in plan.order]
        if self.combined is None:
            todo = [q for q in dict.fromkeys(questions) if q not in state.retrieved]
            if todo:
                lists, diag = self._retrieve(todo, combined=None)
                state.retrieved.update(zip(todo, lists))
                current.retrieval.append({"queries": todo, "diagnostics": diag})
            per_node = {i: state.retrieved[plan.node(i).question] for i in plan.order}
        else:
            key = tuple(questions)
            if key not in state.joint:
                lists, diag = self._retrieve(questions, combined=self.combined)
                state.joint[key] = lists[0]
                current.retrieval.append({"queries": questions, "combined": self.combined, "diagnostics": diag})
            current.joint_evidence = state.joint[key]
            per_node = {i: current.joint_evidence for i in plan.order}
        for items in per_node.values():
            state.seen(items)

        answers: Dict[str, NodeResult] = {}
        for node_id in plan.order:
            node = plan.node(node_id)
            deps = [answers[d] for d in node.needs]
            key = (node.question, tuple((d.node.question, d.finding) for d in deps), tuple(
                e.note_id for e in per_node[node_id]))
            if key in state.node_cache:
                cached = state.node_cache[key]
                answers[node_id] = dataclasses.replace(cached, node=node, reused=True)
                continue
            result = self._work(node, per_node[node_id], deps, state)
            state.node_cache[key] = result
            answers[node_id] = result
        current.nodes = answers

    def _work(self, node: PlanNode, evidence: List[EvidenceItem], deps: List[NodeResult],
              state: "_RunState") -> NodeResult:
        prompt = node.question
        if deps:
            facts = "\n".join(f"- {d.node.question} -> {d.finding}" for d in deps)
            prompt += WORKER_CONTEXT.format(facts=facts)
        out, err = self._answer(prompt, evidence, state)
        if err is not None:
            return NodeResult(node, evidence, None, [], True, error=str(err))
        cited = [evidence[k - 1].note_id for k in out.cited]
        return NodeResult(node, evidence, out.text, cited, out.abstained)

    # ------------------------------------------------------------------ answer
    def _final_evidence(self, probe: List[EvidenceItem], final: Round) -> List[EvidenceItem]:
        if final.joint_evidence is not None:
            sources = [probe, final.joint_evidence]
        else:
            sources = [probe] + [final.nodes[i].evidence for i in final.plan.order]
        out, seen = [], set()
        depth = max((len(s) for s in sources), default=0)
        for k in range(depth):
            for items in sources:
                if k < len(items) and items[k].note_id not in seen and len(out) < self.max_final_evidence:
                    seen.add(items[k].note_id)
                    out.append(items[k])
        return [dataclasses.replace(e, rank=r) for r, e in enumerate(out, start=1)]

    def _reason(self, question: str, evidence: List[EvidenceItem], final: Round, state: "_RunState"):
        findings = "\n".join(f"- {final.nodes[i].node.question} -> {final.nodes[i].finding}"
                             for i in final.plan.order)
        prompt = question + (REASONER_CONTEXT.format(findings=findings) if findings else "")
        out, err = self._answer(prompt, evidence, state)
        if err is not None:
            return None, None, f"the reasoner failed: {err}"
        info = {"model": out.model, "cited": [evidence[k - 1].note_id for k in out.cited],
                "abstained": out.abstained, "latency_s": out.latency_s, "finish_reason": out.finish_reason}
        return strip_thinking(out.text), info, None


class _RunState:
    """Caches and counters of one run."""

    def __init__(self):
        self.retrieved: Dict[str, List[EvidenceItem]] = {}
        self.joint: Dict[tuple, List[EvidenceItem]] = {}
        self.node_cache: Dict[tuple, NodeResult] = {}
        self.explored: List[EvidenceItem] = []
        self._explored_ids: set = set()
        self.calls = 0
        self.usage: Dict[str, int] = {}

    def count(self, usage: Optional[Mapping[str, Any]]) -> None:
        self.calls += 1
        for k, v in (usage or {}).items():
            if isinstance(v, int):
                self.usage[k] = self.usage.get(k, 0) + v

    def seen(self, items: Sequence[EvidenceItem]) -> None:
        for e in items:
            if e.note_id not in self._explored_ids:
                self._explored_ids.add(e.note_id)
                self.explored.append(e)


# --------------------------------------------------------------------------- retrieval from a corpus


class SelectorRetriever:
    """``retrieve`` for :class:`PlanningAgent` over one corpus, with any registry selector.

    Separate mode: each query is encoded and selected alone (``budget`` notes each). Combined mode
    (``retrieve(queries, combined="single" | "peel")``): all queries are encoded into ``[m, d]`` and one
    selection is made with every query as a query vertex — for CDS selectors a constrained dominant set
    with m constraint vertices (``core.cds_select``; ``"peel"`` uses ``core.cds_peel``), for the
    baselines their multi-query relevance (largest cosine over the queries). The joint budget is
    ``joint_budget`` or ``budget * m``.

    Args:
      pipeline: a :class:`cdsjax.pipeline.Pipeline` (padded corpus, embedder, compiled selectors).
      selector: a registry selector name (``cds``, ``cds_converged``, ``cosine``, ``subgraph``, ...).
      budget: notes per query.
      options: selector options (``beta``, ``tau``, ``lam``, ...).
      joint_budget: notes of a combined selection; None means ``budget * m``.

    Attributes:
      last_diagnostics: per selection of the last call, the solver diagnostics ({} for baselines).
    """

    def __init__(self, pipeline, *, selector: str = "cds", budget: int = 5, options: Optional[dict] = None,
                 joint_budget: Optional[int] = None):
        from cdsjax.pipeline import canonical_selector

        if budget < 1 or (joint_budget is not None and joint_budget < 1):
            raise ValueError(f"budget and joint_budget must be >= 1, got {budget} and {joint_budget}")
        self.pipeline = pipeline
        self.selector = canonical_selector(selector)
        self.budget = int(budget)
        self.options = dict(options or {})
        self.joint_budget = joint_budget
        self.last_diagnostics: List[dict] = []

    def __call__(self, queries: Sequence[str], *, combined: Optional[str] = None) -> List[List[EvidenceItem]]:
        if combined not in COMBINED_MODES:
            raise ValueError(f"combined must be one of {COMBINED_MODES}, got {combined!r}")
        queries = list(queries)
        if not queries:
            return [] if combined is None else [[]]
        emb = self.pipeline.encode(queries)
        if combined is None:
            out, diags = [], []
            for q, e in zip(queries, emb):
                sel = self.pipeline.select(e, selector=self.selector, budget=self.budget, qid=q,
                                           options=self.options or None)
                out.append(self._items(sel))
                diags.append(self.pipeline.diagnostics(sel, self.selector))
            self.last_diagnostics = diags
            return out
        options = dict(self.options)
        if combined == "peel":
            from cdsjax.core.registry import selector_spec

            if "peel" not in selector_spec(self.selector).options:
                raise ValueError(f"combined='peel' needs a CDS selector (cds or cds_converged), got {self.selector!r}")
            options["peel"] = True
        budget = self.joint_budget or self.budget * len(queries)
        sel = self.pipeline.select(emb, selector=self.selector, budget=budget, qid=" | ".join(queries),
                                   options=options or None)
        self.last_diagnostics = [self.pipeline.diagnostics(sel, self.selector)]
        return [self._items(sel)]

    def _items(self, sel) -> List[EvidenceItem]:
        return self.pipeline.evidence_items(self.pipeline.evidence(sel))


def make_retriever(embeddings, links, notes: Sequence[Mapping[str, Any]], embedder, *, selector: str = "cds",
                   budget: int = 5, options: Optional[dict] = None, joint_budget: Optional[int] = None,
                   compiled: Optional[dict] = None) -> SelectorRetriever:
    """A :class:`SelectorRetriever` over a corpus given as arrays.

    Args:
      embeddings: ``[n, d]`` float32 L2-normalised note embeddings.
      links: ``[n, n]`` bool note-link adjacency.
      notes: n note dicts with at least note_id, doc_id, page (and kind, text, summary, caption, bbox,
        image_path when known).
      embedder: anything with ``encode_queries(list[str]) -> [m, d]`` (an :class:`~cdsjax.io.embed.Embedder`).
      compiled: a dict shared by many retrievers to hold their jitted selectors, so corpora padded to
        the same size compile each selector once (the evaluation over many questions passes one).
    """
    import numpy as np

    from cdsjax.pipeline import Corpus, Pipeline

    embeddings = np.asarray(embeddings, np.float32)
    links = np.asarray(links, bool)
    n = len(notes)
    if embeddings.ndim != 2 or embeddings.shape[0] != n:
        raise ValueError(f"embeddings must be [n={n}, d], got {embeddings.shape}")
    if links.shape != (n, n):
        raise ValueError(f"links must be [{n}, {n}], got {links.shape}")
    corpus = Corpus(embeddings=embeddings, links=links, notes=[dict(x) for x in notes], embedder={}, roots=[])
    pipe = Pipeline(corpus, embedder=embedder, compiled=compiled)
    return SelectorRetriever(pipe, selector=selector, budget=budget, options=options, joint_budget=joint_budget)


def run_planning(pipeline, question: str, *, reader: Union[ReaderConfig, Reader, None], selector: str = "cds",
                 budget: int = 5, options: Optional[dict] = None, combined: Optional[str] = None,
                 joint_budget: Optional[int] = None, tau_max: int = 3, **agent_options) -> PlanningResult:
    """Runs the planning agent on a :class:`cdsjax.pipeline.Pipeline` (what ``cdsjax ask --agent
    planning`` calls).

    Args:
      pipeline: the corpus to search.
      question: the question.
      reader: the model for every role; required (planning needs a model).
      selector, budget, options: retrieval per sub-question (paper: the subgraph readout, k = 5).
      combined: None, "single" or "peel" (see :class:`PlanningAgent`).
      joint_budget: notes of a combined selection (default ``budget`` per sub-question).
      tau_max: most refinement rounds.
      **agent_options: further :class:`PlanningAgent` options.

    Raises:
      ValueError: no reader, or a bad option.
      ReaderError: the model server is unreachable, lacks the model, or refuses the key.
    """
    if reader is None:
        raise ValueError("the planning agent needs a reader model: pass --reader-url or set CDSJAX_READER_URL")
    retrieve = SelectorRetriever(pipeline, selector=selector, budget=budget, options=options,
                                 joint_budget=joint_budget)
    agent = PlanningAgent(reader, retrieve, combined=combined, tau_max=tau_max, **agent_options)
    return agent.run(question)

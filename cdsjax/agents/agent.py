"""The planning-graph agent itself: probe, decompose, execute, check, refine, answer (see
:mod:`cdsjax.agents.planning` for the walk-through)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from cdsjax.agents.plan import MAX_DEPTH, MAX_NODES, Plan, PlanError, PlanNode, parse_plan, parse_sufficiency
from cdsjax.agents import prompts
from cdsjax.agents.trace import NodeResult, PlanningResult, Round
from cdsjax.io.reading.llm.config import ReaderConfig
from cdsjax.io.reading.llm.errors import FATAL_KINDS, ReaderError
from cdsjax.io.reading.options import ReadOptions
from cdsjax.io.reading.reader import Reader
from cdsjax.io.reading.prompt import EvidenceItem, as_evidence
from cdsjax.io.reading.replies import strip_thinking

COMBINED_MODES = (None, "single", "peel")

# retrieve(queries) -> one evidence list per query; in combined mode retrieve(queries, combined=mode) ->
# a one-element list holding the joint selection.
RetrieveFn = Callable[..., List[List[EvidenceItem]]]


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
      read_options: the worker's and reasoner's :class:`~cdsjax.io.reading.options.ReadOptions` (evidence
        budget, answer tokens, seed); None: the reader's defaults.
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
    read_options: Optional[ReadOptions] = None

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
            out = self.reader.answer(prompt, evidence, self.read_options)
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
                                   {"role": "user", "content": prompts.RETRY_USER.format(reason=error)}]
        return None, error, raw

    def _plan_parser(self, question: str) -> Callable[[str], Tuple[Plan, List[str]]]:
        return lambda reply: parse_plan(reply, question=question, max_nodes=self.max_nodes,
                                        max_depth=self.max_depth, cycles=self.cycles)

    def _decompose(self, question: str, digest: str, state: "_RunState"):
        system = prompts.DECOMPOSER_SYSTEM.format(max_nodes=self.max_nodes, max_depth=self.max_depth)
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": prompts.DECOMPOSER_USER.format(digest=digest, question=question)}]
        parsed, error, raw = self._json_call(messages, self._plan_parser(question), state)
        if parsed is None:
            # Without a usable plan the question itself is the one sub-question: plain retrieve-then-read
            # with a check, which refinement may still improve.
            plan = Plan.from_nodes([PlanNode("q1", question)])
            return plan, "fallback", [], error, raw
        plan, repairs = parsed
        return plan, "decomposer", repairs, None, raw

    def _refine(self, question: str, digest: str, current: Round, state: "_RunState"):
        system = prompts.DECOMPOSER_SYSTEM.format(max_nodes=self.max_nodes, max_depth=self.max_depth)
        user = prompts.REFINER_USER.format(
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
        user = prompts.CHECKER_USER.format(question=question, digest=digest, findings=self._findings(current))
        verdict, error, raw = self._json_call(
            [{"role": "system", "content": prompts.CHECKER_SYSTEM}, {"role": "user", "content": user}],
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
            prompt += prompts.WORKER_CONTEXT.format(facts=facts)
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
        prompt = question + (prompts.REASONER_CONTEXT.format(findings=findings) if findings else "")
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

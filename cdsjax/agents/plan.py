"""Planning graphs: reading a model's JSON plan, repairing it, and ordering it (Kahn's algorithm).

A plan is a DAG of sub-questions. Each node names the nodes whose answers it needs; a node runs after
all of them. The model writes the plan as JSON; what it writes is parsed forgivingly and repaired
where a repair is safe, and every repair is reported in words so the trace shows what was changed:

    plan, repairs = parse_plan(reply)
    plan.order        # ("q1", "q2", "q3"): an execution order with every node after the ones it needs

Accepted shapes: ``{"nodes": [{"id", "question", "needs"}, ...], "edges": [{"from", "to"}, ...]}``, a bare
list of such nodes or of plain strings, common synonyms of the keys (``sub_questions``, ``task``,
``depends_on``, ...), code fences, prose or a ``<think>`` block around the JSON, trailing commas and curly
quotes. An edge ``{"from": a, "to": b}`` means b needs a. Repairs: missing ids are invented, duplicate
ids and empty questions dropped, a root node that restates the original question dropped, unknown and
self dependencies dropped, nodes beyond ``max_nodes`` dropped, cycles broken (or rejected), nodes deeper
than ``max_depth`` dropped. A reply with no usable sub-question raises :class:`PlanError` with the reason.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from cdsjax.io.reading.replies import find_json, read_bool

MAX_NODES = 6
MAX_DEPTH = 3
MAX_GAPS = 3

_LIST_KEYS = ("nodes", "sub_questions", "subquestions", "sub-questions", "questions", "steps", "plan", "dag")
_ID_KEYS = ("id", "node_id", "name", "node", "key")
_QUESTION_KEYS = ("question", "sub_question", "subquestion", "task", "query", "text", "q", "description")
_NEEDS_KEYS = ("needs", "depends_on", "dependencies", "deps", "requires", "after", "prerequisites", "parents",
               "inputs", "uses")


class PlanError(ValueError):
    """A model reply that holds no usable plan (or verdict); the message says why."""


@dataclasses.dataclass(frozen=True)
class PlanNode:
    """One sub-question.

    Attributes:
      id: the node's id, unique in its plan.
      question: the sub-question, to be retrieved for and answered.
      needs: ids of the nodes whose answers this one uses (they run first).
    """

    id: str
    question: str
    needs: Tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"id": self.id, "question": self.question, "needs": list(self.needs)}


@dataclasses.dataclass(frozen=True)
class Plan:
    """A planning graph: sub-questions and their dependencies, with an execution order.

    Attributes:
      nodes: the nodes, in the order the model listed them.
      order: node ids in execution order (every node after the nodes it needs).
    """

    nodes: Tuple[PlanNode, ...]
    order: Tuple[str, ...]

    def __post_init__(self):
        ids = [n.id for n in self.nodes]
        if sorted(ids) != sorted(self.order) or len(set(ids)) != len(ids):
            raise ValueError(f"plan order {list(self.order)} is not a permutation of the node ids {ids}")
        position = {i: k for k, i in enumerate(self.order)}
        for n in self.nodes:
            for dep in n.needs:
                if dep not in position or position[dep] >= position[n.id]:
                    raise ValueError(f"plan order {list(self.order)} runs {n.id!r} before {dep!r}, which it needs")

    @classmethod
    def from_nodes(cls, nodes: Sequence[PlanNode]) -> "Plan":
        """A plan from acyclic nodes; raises ``ValueError`` on a cycle or an unknown dependency."""
        order, stuck = topological_order([n.id for n in nodes], {n.id: n.needs for n in nodes})
        if stuck:
            raise ValueError(f"the plan has a cycle among {stuck}")
        return cls(tuple(nodes), tuple(order))

    def node(self, node_id: str) -> PlanNode:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def depth(self) -> int:
        """The number of nodes on the longest dependency chain (0 for an empty plan)."""
        levels = _levels(self)
        return max(levels.values(), default=0)

    def signature(self) -> tuple:
        """What the plan asks, independent of ids and listing order (to spot an unchanged refinement)."""
        by_id = {n.id: n for n in self.nodes}
        return tuple(sorted((_norm(n.question), tuple(sorted(_norm(by_id[d].question) for d in n.needs)))
                            for n in self.nodes))

    def to_dict(self) -> dict:
        return {"nodes": [n.to_dict() for n in self.nodes], "order": list(self.order)}

    def to_json(self) -> str:
        """The plan in the format the model is asked to write (for refinement prompts)."""
        return json.dumps({"nodes": [n.to_dict() for n in self.nodes]}, ensure_ascii=False)


def topological_order(ids: Sequence[str], needs: Mapping[str, Sequence[str]]) -> Tuple[List[str], List[str]]:
    """Kahn's algorithm, stable: among ready nodes the one listed first runs first.

    Args:
      ids: node ids in listing order.
      needs: id -> ids it depends on (each must be in ``ids``).

    Returns:
      ``(order, stuck)``: the ids that could be ordered, and the ids left over because they sit on or
      behind a cycle (empty for a DAG).
    """
    ids = list(ids)
    known = set(ids)
    for i in ids:
        unknown = [d for d in needs.get(i, ()) if d not in known]
        if unknown:
            raise ValueError(f"node {i!r} needs unknown node(s) {unknown}")
    indegree = {i: len(set(needs.get(i, ()))) for i in ids}
    dependents: Dict[str, List[str]] = {i: [] for i in ids}
    for i in ids:
        for d in set(needs.get(i, ())):
            dependents[d].append(i)
    rank = {i: k for k, i in enumerate(ids)}
    ready = [i for i in ids if indegree[i] == 0]
    order: List[str] = []
    while ready:
        ready.sort(key=rank.__getitem__)
        current = ready.pop(0)
        order.append(current)
        for j in dependents[current]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    done = set(order)
    return order, [i for i in ids if i not in done]


# --------------------------------------------------------------------------- reading JSON


def extract_json(text: Any, *, want: Union[type, Tuple[type, ...]] = dict) -> Any:
    """The first JSON value of type ``want`` (or else any object/array) found in a model reply.

    Reads the reply with :func:`cdsjax.io.reading.replies.find_json` (code fences first, a ``<think>`` block,
    curly quotes and trailing commas tolerated).

    Raises:
      PlanError: no JSON value could be read (the message quotes the start of the reply).
    """
    if not isinstance(text, str):
        raise PlanError(f"expected a text reply, got {type(text).__name__}")
    value = find_json(text, want=want)
    if value is None:
        value = find_json(text, want=(dict, list))  # the caller names what it expected
    if value is not None:
        return value
    head = " ".join(text.split())[:120]
    raise PlanError(f"no JSON object in the reply: {head!r}" if head else "the reply is empty")


def _pick(item: Mapping[str, Any], keys: Sequence[str]) -> Any:
    lowered = {str(k).strip().lower(): v for k, v in item.items()}
    for key in keys:
        if key in lowered:
            return lowered[key]
    return None


def _norm(text: str) -> str:
    return " ".join(str(text).lower().split())


def _as_id(value: Any) -> Optional[str]:
    if value is None or isinstance(value, (dict, list, bool)):
        return None
    out = str(value).strip()
    return out or None


def _as_ids(value: Any) -> List[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        out = [_as_id(v) for v in value]
        return [v for v in out if v is not None]
    if isinstance(value, str) and "," in value:
        return [v.strip() for v in value.split(",") if v.strip()]
    single = _as_id(value)
    return [single] if single is not None else []


# --------------------------------------------------------------------------- plans


def parse_plan(text: Any, *, question: Optional[str] = None, max_nodes: int = MAX_NODES,
               max_depth: int = MAX_DEPTH, cycles: str = "repair") -> Tuple[Plan, List[str]]:
    """Reads and repairs a plan from a model reply (a string, or JSON already decoded).

    Args:
      text: the reply, or a decoded dict/list.
      question: the original question; a node that restates it (or is marked as the root) is dropped,
        since the final reasoner answers it.
      max_nodes: most nodes kept (the first ones listed).
      max_depth: longest dependency chain kept, in nodes; deeper nodes are dropped.
      cycles: "repair" (break each cycle by dropping the dependencies of its first-listed node) or
        "reject" (raise :class:`PlanError`).

    Returns:
      ``(plan, repairs)``: the plan, and one sentence per repair made.

    Raises:
      PlanError: no usable sub-question, or a cycle with ``cycles="reject"``.
    """
    if cycles not in ("repair", "reject"):
        raise ValueError(f"cycles must be 'repair' or 'reject', got {cycles!r}")
    if max_nodes < 1 or max_depth < 1:
        raise ValueError(f"max_nodes and max_depth must be >= 1, got {max_nodes} and {max_depth}")
    data = extract_json(text, want=(dict, list)) if isinstance(text, str) else text
    repairs: List[str] = []
    raw_nodes, edges = _raw_nodes(data)

    nodes: List[dict] = []
    seen_ids = set()
    for k, item in enumerate(raw_nodes):
        if isinstance(item, str):
            item = {"question": item}
        if not isinstance(item, Mapping):
            repairs.append(f"dropped entry {k + 1}: not an object or a string")
            continue
        node_id = _as_id(_pick(item, _ID_KEYS))
        q = _pick(item, _QUESTION_KEYS)
        q = " ".join(str(q).split()) if isinstance(q, (str, int, float)) and not isinstance(q, bool) else ""
        kind = str(_pick(item, ("type", "role", "kind")) or "").strip().lower()
        label = node_id or f"entry {k + 1}"
        if not q:
            repairs.append(f"dropped {label}: no question text")
            continue
        is_root = kind in ("question", "root") or node_id == "root" or (
            question is not None and _norm(q) == _norm(question))
        if is_root:
            repairs.append(f"dropped {label}: it restates the original question (the reasoner answers that)")
            seen_ids.add(node_id)
            continue
        if node_id is None:
            node_id = _fresh_id(seen_ids)
            repairs.append(f"gave entry {k + 1} the id {node_id!r}: it had none")
        elif node_id in seen_ids:
            repairs.append(f"dropped a second node with id {node_id!r}")
            continue
        seen_ids.add(node_id)
        nodes.append({"id": node_id, "question": q, "needs": _as_ids(_pick(item, _NEEDS_KEYS))})
    dropped_ids = {i for i in seen_ids if i is not None} - {n["id"] for n in nodes}

    by_id = {n["id"]: n for n in nodes}
    for edge in edges:
        if isinstance(edge, Mapping):
            a, b = _as_id(_pick(edge, ("from", "source", "src", "parent"))), _as_id(
                _pick(edge, ("to", "target", "dst", "child")))
        elif isinstance(edge, (list, tuple)) and len(edge) == 2:
            a, b = _as_id(edge[0]), _as_id(edge[1])
        else:
            repairs.append(f"ignored an unreadable edge: {edge!r}")
            continue
        if a in dropped_ids or b in dropped_ids:
            continue
        if b in by_id and a is not None and a not in by_id[b]["needs"]:
            by_id[b]["needs"].append(a)
        elif b not in by_id:
            repairs.append(f"ignored edge {a!r} -> {b!r}: unknown node {b!r}")

    if not nodes:
        raise PlanError("the plan has no usable sub-question" + (f" ({'; '.join(repairs)})" if repairs else ""))
    if len(nodes) > max_nodes:
        cut = [n["id"] for n in nodes[max_nodes:]]
        repairs.append(f"dropped node(s) {cut}: a plan has at most {max_nodes} nodes")
        nodes = nodes[:max_nodes]
        dropped_ids |= set(cut)

    ids = {n["id"] for n in nodes}
    for n in nodes:
        keep = []
        for dep in n["needs"]:
            if dep == n["id"]:
                repairs.append(f"node {n['id']!r}: dropped its dependency on itself")
            elif dep in dropped_ids:
                repairs.append(f"node {n['id']!r}: dropped its dependency on dropped node {dep!r}")
            elif dep not in ids:
                repairs.append(f"node {n['id']!r}: dropped its dependency on unknown node {dep!r}")
            elif dep not in keep:
                keep.append(dep)
        n["needs"] = keep

    order = _break_cycles(nodes, repairs, cycles)
    nodes = _cut_depth(nodes, order, max_depth, repairs)
    plan = Plan.from_nodes([PlanNode(n["id"], n["question"], tuple(n["needs"])) for n in nodes])
    return plan, repairs


def _raw_nodes(data: Any) -> Tuple[list, list]:
    if isinstance(data, list):
        return data, []
    if not isinstance(data, Mapping):
        raise PlanError(f"expected a JSON object with a 'nodes' list, got {type(data).__name__}")
    edges = _pick(data, ("edges", "links", "dependencies"))
    edges = edges if isinstance(edges, list) else []
    for key in _LIST_KEYS:
        value = _pick(data, (key,))
        if isinstance(value, list):
            return value, edges
        if isinstance(value, Mapping):  # {"plan": {"nodes": [...]}}
            return _raw_nodes(value)
    raise PlanError(f"the JSON has no list of nodes (keys: {sorted(map(str, data))})")


def _fresh_id(taken: set) -> str:
    k = 1
    while f"n{k}" in taken:
        k += 1
    return f"n{k}"


def _break_cycles(nodes: List[dict], repairs: List[str], cycles: str) -> List[str]:
    ids = [n["id"] for n in nodes]
    by_id = {n["id"]: n for n in nodes}
    while True:
        order, stuck = topological_order(ids, {i: by_id[i]["needs"] for i in ids})
        if not stuck:
            return order
        if cycles == "reject":
            raise PlanError(f"the plan has a dependency cycle among {stuck}")
        # The first-listed stuck node loses its dependencies on the other stuck nodes; Kahn then
        # proceeds past it, so each pass orders at least one more node.
        first = by_id[stuck[0]]
        lost = [d for d in first["needs"] if d in stuck]
        first["needs"] = [d for d in first["needs"] if d not in stuck]
        repairs.append(f"broke a dependency cycle among {stuck}: node {first['id']!r} no longer needs {lost}")


def _levels(plan_or_nodes) -> Dict[str, int]:
    nodes = plan_or_nodes.nodes if isinstance(plan_or_nodes, Plan) else plan_or_nodes
    order = plan_or_nodes.order if isinstance(plan_or_nodes, Plan) else None
    needs = {(n.id if isinstance(n, PlanNode) else n["id"]): (n.needs if isinstance(n, PlanNode) else n["needs"])
             for n in nodes}
    if order is None:
        order, _ = topological_order(list(needs), needs)
    levels: Dict[str, int] = {}
    for i in order:
        levels[i] = 1 + max((levels[d] for d in needs[i]), default=0)
    return levels


def _cut_depth(nodes: List[dict], order: List[str], max_depth: int, repairs: List[str]) -> List[dict]:
    levels = _levels(nodes)
    deep = [n["id"] for n in nodes if levels[n["id"]] > max_depth]
    if deep:
        repairs.append(f"dropped node(s) {deep}: dependency chains are at most {max_depth} nodes long")
    return [n for n in nodes if levels[n["id"]] <= max_depth]


# --------------------------------------------------------------------------- verdicts


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The evidence checker's verdict.

    Attributes:
      sufficient: True when the findings answer the question.
      gaps: what is missing (empty when sufficient), at most three.
    """

    sufficient: bool
    gaps: Tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"sufficient": self.sufficient, "gaps": list(self.gaps)}


# The checker's own words for yes and no, beside those every reply may use (io.reading.replies.read_bool).
SUFFICIENT_WORDS = ("sufficient", "enough")
INSUFFICIENT_WORDS = ("insufficient", "not sufficient", "not enough")


def parse_sufficiency(text: Any) -> Verdict:
    """Reads ``{"sufficient": bool, "gaps": [str, ...]}`` from a checker reply.

    ``sufficient`` may be a bool, a number or a word ("yes", "false", ...); ``gaps`` a list of strings or
    of objects with a description, or one string. Without ``sufficient``, a non-empty gap list means
    insufficient. An insufficient verdict without gaps gets one generic gap.

    Raises:
      PlanError: no verdict could be read.
    """
    data = extract_json(text) if isinstance(text, str) else text
    if not isinstance(data, Mapping):
        raise PlanError(f"expected a JSON object with 'sufficient', got {type(data).__name__}")
    raw = _pick(data, ("sufficient", "is_sufficient", "enough", "complete", "answerable"))
    gaps = _gap_list(_pick(data, ("gaps", "missing", "gap", "missing_information")))
    sufficient = read_bool(raw, yes=SUFFICIENT_WORDS, no=INSUFFICIENT_WORDS, threshold=None)
    if sufficient is None and raw is None and gaps:
        sufficient = False
    elif sufficient is None:
        raise PlanError(f"no readable 'sufficient' field in the verdict: {json.dumps(data)[:160]}")
    if sufficient:
        return Verdict(True, ())
    return Verdict(False, tuple(gaps[:MAX_GAPS]) or ("the checker found the findings insufficient but named no gap",))


def _gap_list(value: Any) -> List[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, Mapping):
            item = _pick(item, ("gap", "description", "text", "question", "missing")) or json.dumps(item)
        text = " ".join(str(item).split())
        if text:
            out.append(text)
    return out

r"""Whether the documents answer a question, judged before reading from the selection alone.

A selection whose evidence is weak (by a per-selector score compared with a fitted threshold) is *abstained*:
the reader is not asked, the reply says the documents do not answer the question, the evidence is still shown,
and ``ask --json`` carries ``"abstained": true`` with the score that decided it (:meth:`Judgement.to_dict`).

The scores a rule may use (:func:`strength_features`), all read off the selection and the relevance of every
note to the question:

* ``best_relevance``: the highest relevance among the selected notes (every selector);
* ``margin``: ``best_relevance`` less the mean relevance of every note searched: how far the best evidence stands
  out from the documents' background (every selector);
* ``top_score``: the selector's own score of its first pick (the baselines' best score);
* ``payoff``: the equilibrium's payoff :math:`x^\top M x` (CDS only);
* ``support``: the notes in the equilibrium's support (CDS only).

The rules, one per selector, live in one file, :data:`RULES_FILE`, written by
``experiments/abstain_fit.py`` (threshold and score cross-validated by document on the development data; the
file records the command, the commit and the data). A selector without its own rule uses the ``"*"`` rule.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
from typing import Any, Dict, Mapping, Optional

import numpy as np

RULES_FILE = pathlib.Path(__file__).with_name("abstain_rules.json")
# What the reply says instead of an answer when the evidence is judged too weak.
NOT_IN_DOCUMENTS = "The documents do not answer this question."
FEATURES = ("best_relevance", "margin", "top_score", "payoff", "support")


@dataclasses.dataclass(frozen=True)
class Judgement:
    """The decision on one selection: ``abstained`` when ``score`` (the rule's ``feature``) is below
    ``threshold``; ``enabled`` False when abstaining was turned off (then ``abstained`` is False)."""

    abstained: bool
    score: Optional[float]
    feature: str
    threshold: Optional[float]
    enabled: bool = True

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def strength_features(selection: Any, relevance: np.ndarray) -> Dict[str, float]:
    """The scores a rule may use (module docstring) of one concrete selection.

    Args:
      selection: a :class:`~cdsjax.core.Selection` (concrete arrays).
      relevance: ``[n]`` float, the relevance of every real note to the question (no padding).
    """
    ok = np.asarray(selection.selected_valid, bool)
    idx = np.asarray(selection.indices)[ok]
    scores = np.asarray(selection.scores, np.float64)[ok]
    rel = np.asarray(relevance, np.float64).reshape(-1)
    picked = rel[idx[idx < rel.shape[0]]]
    best = float(picked.max()) if picked.size else -1.0
    out = {"best_relevance": best, "margin": best - float(rel.mean()) if rel.size else -1.0,
           "top_score": float(scores[0]) if scores.size else -math.inf}
    result = getattr(selection, "result", None)
    if result is not None:
        out["payoff"] = float(np.asarray(result.objective))
    if getattr(selection, "support_size", None) is not None:
        out["support"] = float(np.asarray(selection.support_size))
    return {k: v if math.isfinite(v) else -1e9 for k, v in out.items()}


@functools.lru_cache(maxsize=4)
def _read_rules(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rules = data.get("rules")
    if not isinstance(rules, dict) or "*" not in rules:
        raise ValueError(f"{path}: no 'rules' object with a '*' rule")
    for name, rule in rules.items():
        if rule.get("feature") not in FEATURES or not isinstance(rule.get("threshold"), (int, float)):
            raise ValueError(f"{path}: rule {name!r} needs a feature in {FEATURES} and a numeric threshold")
    return data


def load_rules(path: Optional[str] = None) -> Dict[str, Any]:
    """The abstention rules file (default :data:`RULES_FILE`): ``{"rules": {selector: {"feature", "threshold"}},
    "provenance": {...}}``, read once per process."""
    return _read_rules(str(path or RULES_FILE))


def rule_for(selector: str, rules: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The rule of ``selector`` (registry name, ``-`` or ``_``), else the ``"*"`` rule."""
    table = (rules or load_rules())["rules"]
    return dict(table.get(str(selector).replace("-", "_"), table["*"]))


def judge(selector: str, features: Mapping[str, float], *, enabled: bool = True,
          rules: Optional[Mapping[str, Any]] = None) -> Judgement:
    """Whether ``selector``'s selection with these ``features`` (:func:`strength_features`) is abstained. A rule
    whose feature the selection lacks (a CDS rule on a baseline) falls back to the ``"*"`` rule."""
    rule = rule_for(selector, rules)
    if rule["feature"] not in features:
        rule = dict((rules or load_rules())["rules"]["*"])
    score = float(features[rule["feature"]]) if rule["feature"] in features else None
    threshold = float(rule["threshold"])
    abstained = bool(enabled and score is not None and score < threshold)
    return Judgement(abstained=abstained, score=score, feature=rule["feature"], threshold=threshold,
                     enabled=bool(enabled))


def note_relevance(notes: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``[n]`` relevance of each note to the question, as the rules were fitted on: the cosine of the
    L2-normalised embeddings ``notes`` ``[n, d]`` and ``query`` ``[d]`` (or ``[m, d]``: its best row)."""
    q = np.asarray(query, np.float32).reshape(-1, np.asarray(notes).shape[-1])
    return (np.asarray(notes, np.float32) @ q.T).max(axis=1)

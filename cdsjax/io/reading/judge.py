"""An LLM judge of answer correctness, through an OpenAI-compatible chat API (GPT-4o-mini in the paper).

    judge = Judge(base_url="https://api.openai.com/v1", model="gpt-4o-mini")
    verdict = judge.judge("Which year?", gold_answer="2019", predicted="It was 2019 [2].")
    verdict.correct, verdict.score, verdict.rationale

Configuration is a :class:`~cdsjax.io.reading.llm.config.ReaderConfig`; unset fields fall back to ``CDSJAX_JUDGE_URL``,
``CDSJAX_JUDGE_MODEL`` and ``CDSJAX_JUDGE_API_KEY`` (then ``OPENAI_API_KEY``). Failures are
:class:`~cdsjax.io.reading.llm.errors.ReaderError`, with the same retries as the reader; a reply with no readable
verdict is one of kind ``bad_response`` (its message says when the verdict was cut at the token limit).
The same server and model as the reader's may judge; the evaluation labels its records so.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from cdsjax.io.reading.llm.client import ChatClient
from cdsjax.io.reading.llm.errors import ReaderError
from cdsjax.io.reading.reader import ABSTAIN
from cdsjax.io.reading.replies import find_field, find_json, leading_word, read_bool, read_float, strip_thinking
from cdsjax.io.util import one_line

JUDGE_PROMPT = f"""\
You grade answers to questions about documents. You get a question, the reference answer and a candidate \
answer, and decide whether the candidate gives the same answer as the reference.

- Judge meaning, not wording; ignore citation markers such as [2] and extra explanation.
- Numbers must agree up to rounding and with compatible units; a wrong or contradicting key fact makes \
the candidate incorrect, even beside correct ones.
- When the reference is a list, the candidate must give all of its items.
- When the reference says the question cannot be answered ("{ABSTAIN}"), only a candidate that declines \
to answer is correct; when the reference gives an answer, a candidate that declines is incorrect.

Reply with one JSON object and nothing else:
{{"rationale": "<one or two sentences>", "correct": true or false, "score": <0 to 1, how fully correct>}}"""


# The same rules, the verdict alone: a reply of ~15 tokens instead of ~80, for a judge on a CPU (a 1.5B model's
# rationale adds little, and at a few tokens a second it is most of the judging time).
VERDICT_ONLY_PROMPT = JUDGE_PROMPT.rpartition("Reply with")[0] + """\
Reply with one JSON object and nothing else:
{"correct": true or false, "score": <0 to 1, how fully correct>}"""


@dataclasses.dataclass(frozen=True)
class JudgeVerdict:
    """The judge's decision.

    Attributes:
      correct: whether the prediction answers the question as the gold answer does.
      score: graded correctness in [0, 1] (1.0 / 0.0 from ``correct`` when the judge gives none).
      rationale: the judge's reason, in its words.
      raw: the judge's full reply ("" when no request was needed).
      model: the judging model ("" when no request was needed).
      latency_s: wall time of the call, retries included.
    """

    correct: bool
    score: float
    rationale: str
    raw: str = ""
    model: str = ""
    latency_s: float = 0.0


class Judge(ChatClient):
    """Grades predicted answers against gold answers with an LLM.

    ``Judge(config)`` or ``Judge(base_url=..., model=...)`` (keyword overrides of ReaderConfig).
    """

    env_prefix = "CDSJAX_JUDGE"
    key_fallbacks = ("OPENAI_API_KEY",)
    role = "judge"

    def __init__(self, config=None, *, rationale: bool = True, **overrides):
        """``rationale=False`` asks for the verdict alone (:data:`VERDICT_ONLY_PROMPT`)."""
        super().__init__(config, **overrides)
        self.prompt = JUDGE_PROMPT if rationale else VERDICT_ONLY_PROMPT

    def judge(self, question: str, gold_answer: str, predicted: Optional[str]) -> JudgeVerdict:
        """Judges one prediction; an empty prediction is incorrect without asking the model.

        Raises:
          ValueError: an empty question or gold answer.
          ReaderError: the server gave no answer, or one without a readable verdict.
        """
        for name, value in (("question", question), ("gold_answer", gold_answer)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be a non-empty string")
        if predicted is None or not str(predicted).strip():
            return JudgeVerdict(correct=False, score=0.0, rationale="empty prediction")
        messages = [
            {"role": "system", "content": self.prompt},
            {"role": "user", "content": f"Question: {question.strip()}\n\nReference answer: {gold_answer.strip()}"
                                        f"\n\nCandidate answer: {str(predicted).strip()}"},
        ]
        reply = self.chat(messages)
        try:
            correct, score, rationale = parse_verdict(reply.content)
        except ValueError as err:
            if reply.finish_reason == "length":
                raise ReaderError(f"the judge at {self.url} sent a verdict cut at its token limit (max_tokens="
                                  f"{self.config.max_tokens}; raise it): {one_line(reply.content, 200)!r}",
                                  kind="bad_response", url=self.url) from None
            raise ReaderError(f"the judge at {self.url} {err}", kind="bad_response", url=self.url) from None
        return JudgeVerdict(correct=correct, score=score, rationale=rationale, raw=reply.content,
                            model=reply.model, latency_s=reply.latency_s)


# The judge's own words for a verdict, beside the yes/no words every reply may use (io.reading.replies).
CORRECT_WORDS = ("correct",)
INCORRECT_WORDS = ("incorrect", "wrong")
# Words a reply without JSON or fields may start with to give its verdict.
VERDICT_WORDS = ("correct", "incorrect", "yes", "no", "true", "false", "wrong")


def parse_verdict(text: str) -> tuple:
    """Reads ``(correct, score, rationale)`` from a judge reply.

    Accepts a JSON object anywhere in the reply (code fences, prose around it and a ``<think>`` block are
    fine), then ``correct: yes``-style fields, then a reply that starts with a verdict word. ``score`` is
    clipped to [0, 1]; when only one of ``correct`` / ``score`` is given the other follows from it
    (correct iff score >= 0.5).

    Raises:
      ValueError: no verdict can be read.
    """
    body = strip_thinking(text)
    fields = find_json(body, accept=lambda v: any(str(k).lower() in ("correct", "score") for k in v))
    if fields is not None:
        fields = {str(k).lower(): v for k, v in fields.items()}
    else:
        fields = {name: value for name in ("correct", "score", "rationale")
                  if (value := find_field(body, name, free_text=name == "rationale")) is not None}
        if "correct" not in fields and "score" not in fields:
            lead = leading_word(body, VERDICT_WORDS)
            if lead is not None:
                fields = {"correct": lead[0], "rationale": lead[1].strip(" .:-\n")}
    correct = read_bool(fields.get("correct"), yes=CORRECT_WORDS, no=INCORRECT_WORDS)
    score = read_float(fields.get("score"))
    if correct is None and score is None:
        raise ValueError(f"sent no readable verdict: {one_line(text, 200)!r}")
    if score is None:
        score = 1.0 if correct else 0.0
    score = min(1.0, max(0.0, score))
    if correct is None:
        correct = score >= 0.5
    rationale = fields.get("rationale")
    return correct, score, one_line(rationale, 1000) if rationale else ""

r"""Retrieval metrics (and, with a judge, accuracy) of the planning agent's evidence on a benchmark.

Usage (from the repository root)::

    # a real OpenAI-compatible model (vLLM) plays decomposer, worker, checker and reasoner
    python experiments/eval_planning.py --config configs/hotpotqa.py --budget 2 \
        --variants cosine,subgraph,cds,cds+single,cds+peel --reader_url http://localhost:8000/v1 --judge

    # no model: a rule-based stand-in answers through a local OpenAI-compatible server
    python experiments/eval_planning.py --config configs/hotpotqa.py --budget 2 --config.max_queries=100

Variants are ``selector[+single|+peel]``: the selector every sub-question retrieves with, or one
combined CDS selection with all sub-questions as query vertices. For each variant the script prints
the mean (95% bootstrap interval) of the harness's retrieval metrics for four views of the evidence
(see :mod:`cdsjax.agents.evaluate`): ``final`` (what the reasoner read), ``explored`` (everything
retrieved), ``probe`` (the selector alone on the question) and ``cosine_matched`` (cosine top-k with
as many notes as ``final``).

Without ``--reader_url`` the model is :class:`RuleBasedModel`, a deterministic stand-in served on a loopback
OpenAI-compatible endpoint (:func:`serve_chat`): it reads the entities named in the probe's top excerpts
and asks one sub-question per entity ("What is known about X?"), answers a sub-question extractively
when its evidence names the entity, calls the findings sufficient when no sub-question came back
"Not answerable", and replaces failed sub-questions by entities of later excerpts. Its figures measure
the retrieval machinery under a simple, fixed planner, not a language model's plans; the answers it
gives are not worth judging.
"""

import contextlib
import json
import pathlib
import re
import sys
import threading

from absl import app, flags
from ml_collections import config_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_STOP = {"The", "A", "An", "In", "On", "At", "It", "He", "She", "They", "This", "That", "These", "Those", "His",
         "Her", "Its", "Their", "After", "Before", "During", "As", "For", "From", "With", "By", "Of", "And",
         "But", "Or", "When", "While", "Which", "Who", "What", "Where", "There", "Here", "Also", "However"}
_ENTITY = re.compile(r"\b[A-Z][\w'\u2019\-]*(?:[ \t]+(?:(?:of|the|and|de|von|van|la|le|du)[ \t]+)?[A-Z][\w'\u2019\-]*)*")
_EXCERPT = re.compile(r"^\[(\d+)\] [^:\n]*: (.*)$", re.MULTILINE)


def _define_flags():
    """Flags of the command line (defined only when run as a script, so run_eval.py can import this)."""
    global _CONFIG, _VARIANTS, _BUDGET, _TAU_MAX, _MAX_FINAL, _READER_URL, _READER_MODEL, _JUDGE, _OUTPUT, _PROGRESS
    _CONFIG = config_flags.DEFINE_config_file("config", None, "Benchmark config (configs/*.py).", lock_config=True)
    _VARIANTS = flags.DEFINE_string("variants", "cosine,subgraph,cds,cds+single,cds+peel",
                                    "Comma-separated selector[+single|+peel] variants.")
    _BUDGET = flags.DEFINE_integer("budget", 2, "Notes per sub-question (and for the probe).")
    _TAU_MAX = flags.DEFINE_integer("tau_max", 3, "Most refinement rounds.")
    _MAX_FINAL = flags.DEFINE_integer("max_final_evidence", 20, "Most notes the reasoner reads.")
    _READER_URL = flags.DEFINE_string("reader_url", None, "OpenAI-compatible base URL; unset: the rule-based model.")
    _READER_MODEL = flags.DEFINE_string("reader_model", None, "Model name (default: the server's only model).")
    _JUDGE = flags.DEFINE_bool("judge", False, "Grade answers with the judge (CDSJAX_JUDGE_URL / _MODEL).")
    _OUTPUT = flags.DEFINE_string("output_dir", None, "Output directory (default: <config.output_dir>/planning).")
    _PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar on stderr.")


class RuleBasedModel:
    """A deterministic stand-in for the agent's model (see the module docstring); ``__call__`` takes an
    OpenAI chat request body and returns the reply text."""

    def __init__(self, per_excerpt=(2, 1), max_nodes=4):
        self.per_excerpt = per_excerpt
        self.max_nodes = max_nodes

    def __call__(self, req):
        from cdsjax.agents import prompts as planning

        system = req["messages"][0]["content"]
        text = "\n".join(m["content"] if isinstance(m.get("content"), str) else
                         "\n".join(p.get("text", "") for p in m.get("content") or [] if p.get("type") == "text")
                         for m in req.get("messages", []))
        if system.startswith(planning.DECOMPOSER_SYSTEM[:40]):
            return self.refine(text) if "The previous plan was:" in text else self.decompose(text)
        if system == planning.CHECKER_SYSTEM:
            return self.check(text)
        return self.answer(text)

    @staticmethod
    def entities(body, question, used=()):
        qwords = set(re.findall(r"\w+", question.lower()))
        out = []
        for m in _ENTITY.finditer(body):
            name = m.group(0).strip(" .-")
            words = re.findall(r"\w+", name.lower())
            if len(name) < 3 or name in _STOP or not words or set(words) <= qwords:
                continue
            if name.lower() not in {u.lower() for u in list(used) + out}:
                out.append(name)
        return out

    def _question(self, text):
        return text.split("Question: ", 1)[1].split("\n", 1)[0].strip()

    def decompose(self, text):
        question = self._question(text)
        excerpts = [body for _, body in _EXCERPT.findall(text.split("Question: ", 1)[0])]
        names = []
        for body, take in zip(excerpts, self.per_excerpt):
            names += self.entities(body, question, names)[:take]
        nodes = [{"id": f"e{k}", "question": f"What is known about {n}?", "needs": []}
                 for k, n in enumerate(names[: self.max_nodes], start=1)]
        return json.dumps({"nodes": nodes or [{"id": "e1", "question": f"Key facts for: {question}", "needs": []}]})

    def refine(self, text):
        question = text.split("Question: ", 1)[1].split("\n", 1)[0].strip()
        plan = json.loads(text.split("The previous plan was:\n", 1)[1].split("\n", 1)[0])
        findings = text.split("Its sub-questions were answered as follows:\n", 1)[1]
        failed = set(re.findall(r"^- (\S+): .*\n  answer: Not answerable", findings, re.MULTILINE))
        kept = [n for n in plan["nodes"] if n["id"] not in failed]
        used = [n["question"][len("What is known about "):-1] for n in plan["nodes"]]
        excerpts = [body for _, body in _EXCERPT.findall(text.split("The previous plan was:", 1)[0])]
        fresh = []
        for body in excerpts[len(self.per_excerpt):]:
            fresh += self.entities(body, question, used + fresh)
        room = max(0, self.max_nodes - len(kept))
        nodes = kept + [{"id": f"r{len(used) + k}", "question": f"What is known about {n}?", "needs": []}
                        for k, n in enumerate(fresh[: max(len(failed), 1)][:room], start=1)]
        return json.dumps({"nodes": nodes or plan["nodes"]})

    @staticmethod
    def check(text):
        findings = text.split("Findings of the sub-questions, each answered from its own evidence:\n", 1)[1]
        gaps = re.findall(r"^- \S+: (.*)\n  answer: Not answerable", findings, re.MULTILINE)
        return json.dumps({"sufficient": not gaps, "gaps": gaps[:3]})

    @staticmethod
    def answer(text):
        start = text.find("Evidence (")
        text = text[start:] if start >= 0 else text  # the numbered evidence, not the system prompt
        question = text.split("Question: ")[-1]
        blocks = re.findall(r"\[(\d+)\] [^\n]*\n(.*?)(?=\n\n\[\d+\] |\n\nQuestion: )", text, re.DOTALL)
        target = re.match(r"What is known about (.*)\?", question)
        for k, body in blocks:
            if target is None or target.group(1).lower() in body.lower():
                first = re.split(r"(?<=[.!?])\s", " ".join(body.split()), maxsplit=1)[0]
                return f"{first} [{k}]"
        return "Not answerable"


def run(config, *, variants="cosine,subgraph,cds,cds+single,cds+peel", budget=2, tau_max=3,
        max_final_evidence=20, reader_url=None, reader_model=None, judge=False, output_dir=None, progress=True,
        connection=None):
    """Evaluates the planning agent; the model is ``reader_url`` or, when None, :class:`RuleBasedModel`;
    ``connection``: how to reach a local server the run started (:class:`cdsjax.eval.reader_setup.Connection`)."""
    import logging

    from cdsjax.agents.evaluate import evaluate_planning, parse_variants
    from cdsjax.io.reading.llm.config import ReaderConfig

    logging.getLogger("httpx").setLevel(logging.WARNING)
    variants = parse_variants(variants)
    output = output_dir or str(pathlib.Path(config.output_dir) / "planning")
    grader = None
    if judge:
        from cdsjax.io.reading.judge import Judge

        grader = Judge()
    kwargs = dict(budget=budget, tau_max=tau_max, max_final_evidence=max_final_evidence, judge=grader,
                  output_dir=output, progress=progress)
    if reader_url:
        return evaluate_planning(config, ReaderConfig(base_url=reader_url, model=reader_model,
                                                         api_key=connection.api_key if connection else None,
                                                         socket=connection.socket if connection else None),
                                 variants, **kwargs)
    print("model: the rule-based stand-in (no reader URL); see experiments/eval_planning.py", file=sys.stderr)
    with serve_chat(RuleBasedModel()) as base_url:
        reader = ReaderConfig(base_url=base_url, model="rule-based", max_retries=0)
        return evaluate_planning(config, reader, variants, **kwargs)


@contextlib.contextmanager
def serve_chat(model):
    """``model`` (request body -> reply text) behind an OpenAI-compatible chat endpoint on 127.0.0.1, for the
    length of the block; yields its base URL. Only what the agent calls: chat completions and the model list."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def send(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/").endswith("/models"):
                self.send(200, {"object": "list", "data": [{"id": "rule-based", "object": "model"}]})
            else:
                self.send(404, {"error": {"message": f"no {self.path}"}})

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            message = {"role": "assistant", "content": model(req)}
            self.send(200, {"id": "rule-based", "object": "chat.completion", "created": 0, "model": "rule-based",
                            "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def main(argv):
    from experiments.cli import config_or_exit

    config = config_or_exit(argv, _CONFIG.value, "configs/hotpotqa.py")
    run(config, variants=_VARIANTS.value, budget=_BUDGET.value, tau_max=_TAU_MAX.value,
        max_final_evidence=_MAX_FINAL.value, reader_url=_READER_URL.value, reader_model=_READER_MODEL.value,
        judge=_JUDGE.value, output_dir=_OUTPUT.value, progress=_PROGRESS.value)


if __name__ == "__main__":
    _define_flags()
    app.run(main)

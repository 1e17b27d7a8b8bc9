"""The reader stage of the batch evaluation: the selected evidence of every (question, selector, budget, seed)
goes to a vision-language reader, and its answer is scored against the gold answer.

* Requests are built as ``cdsjax ask`` builds them (:func:`cdsjax.io.reader.build_messages`: text notes as
  text, figures/tables/charts with an image crop as ``image_url`` parts with their caption and summary) and
  sent through :class:`cdsjax.io.llm.ChatClient` (retries, per-request timeout), ``config.reader.concurrency``
  at a time from a thread pool, with a progress bar.
* Every reply goes through the reader's :class:`~cdsjax.io.reply_cache.ReplyCache` under ``<output_dir>/replies``,
  keyed by the model, the full request (instructions, question, evidence text, images) and the generation
  settings (max_tokens, temperature, seed): a rerun, a resumed run, or another selector whose evidence makes the
  same request sends nothing.
* Images (``config.reader.images``): ``auto`` sends visual notes as images until the server refuses one, then
  as caption, summary and text (one refusal per run, see :meth:`cdsjax.io.llm.ChatClient.send_with_images`);
  ``on`` / ``off`` always / never. A request the server finds too long is sent again without its last notes
  (:func:`cdsjax.io.reader.send_evidence`). The record's ``image_mode`` and ``dropped`` say what was sent.
* Scoring (:mod:`cdsjax.eval.answer_scoring`): MMLongBench-Doc by answer extraction (a second cached call) and
  its format rules; other benchmarks by the LLM judge (:mod:`cdsjax.io.judge`, ``config.judge.*``, cached;
  ``config.judge.enabled = False`` runs none), plus the scores that need no judge, computed whatever the judge
  does: token F1 on QASPER's extractive answers (``answer_f1``) and exact match where a gold answer is yes, no
  or unanswerable (``exact_match``). ``markers_only`` marks an answer that gives citation markers in place of
  its content (:func:`cdsjax.io.replies.markers_only`).
* Controls, run as selectors of the same harness: ``none`` (the question alone) and ``full`` (every note of the
  question's own documents, :func:`full_document_ids`, where its estimated length fits
  ``config.reader.max_context`` and its images ``config.reader.max_images``).

A failed request is recorded on its answer record as ``error`` (kind and message); its metrics are None (left
out of every mean) and ``reader_error`` is 1, summarised on its own. A failed judgement (no readable verdict, a
verdict cut at the token limit, a judge that cannot be reached) is recorded apart, as ``judge_error`` (kind and
message) with metric ``judge_error`` 1: the reply and its rule-based scores are kept, only ``accuracy`` is None.
Judged records name the judge (``judge_model``) and say whether it is the reader itself (``judge_is_reader``).
Answer records are written to ``<output_dir>/answers.jsonl`` (one per question, selector, budget and seed):
``qid``, ``selector``, ``evidence`` (the selected note ids, best first) and ``sent`` (those the token budget
kept, in prompt order), ``evidence_tokens`` and ``prompt_tokens``, ``answer`` (the answer taken; "" when the
reader gave none), ``reply`` (the last reply as written), ``retried`` / ``no_answer`` (why a reply was no
answer: :data:`cdsjax.io.replies.NO_ANSWER`), ``extracted`` (MMLongBench-Doc) and ``metrics``.

Reading goes through :meth:`cdsjax.io.reader.Reader.answer`, the path ``ask`` and ``serve`` use: the evidence
fitted to the reader's token budget (``config.reader.evidence_tokens``; the local reader's default, or the
server's window), the note that does not fit cut to its sentences nearest the question under the benchmark's
embedder, and a reply that is no answer asked again once; such an answer scores 0 where a judge is configured.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import pathlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable, Dict, List, Optional, Sequence

import ml_collections
import numpy as np

from cdsjax.eval import answer_scoring as S
from cdsjax.io.reply_cache import ReplyCache, content_hash, reply_key

CONTROLS = ("none", "full")
ANSWERS_FILE = "answers.jsonl"
JUDGE_PROMPT_VERSION = "judge-1"
ANSWER_METRICS = ("accuracy", "answer_f1", "exact_match", "markers_only", "no_answer", "cites_gold", "reader_error",
                  "judge_error")


def reader_settings() -> ml_collections.ConfigDict:
    """The ``config.reader`` block of an evaluation config (url "" = no reader stage)."""
    return ml_collections.ConfigDict({
        "url": "",  # the OpenAI-compatible server, e.g. http://localhost:8000/v1; the key: $CDSJAX_READER_API_KEY
        "model": "",
        "concurrency": 8,
        "max_tokens": 1024,
        "temperature": 0.0,
        "timeout": 300.0,
        "max_retries": 3,
        "max_text_chars": 1500,
        "seeds": (0,),
        "max_context": 32768,  # tokens; the "full" control runs where the whole document fits
        "max_images": 0,  # images one request may carry (vLLM's --limit-mm-per-prompt); 0: no limit
        # the local reader (cdsjax.io.local_reader), started for the run when url is "": a preset ("default"),
        # a .gguf path or hf:OWNER/REPO/FILE.gguf; "" = none. Its slots are the requests in flight.
        "local": "",
        "local_threads": 0,  # 0: every core
        "local_ctx": 8192,  # context tokens per slot
        "local_slots": 2,
        # seconds the local reader stays up after the run, for the next run or `ask` to reuse (`cdsjax reader
        # stop` stops it); None: $CDSJAX_READER_KEEP_ALIVE, else 300; 0: stopped with the run
        "local_keep_alive": ml_collections.config_dict.placeholder(float),
        "images": "auto",  # auto: images until the server refuses one, then text; on / off: always / never
        # the evidence's token budget (cdsjax.io.evidence_fit): -1 the reader's own (the local reader's default,
        # else derived from the server's window); 0 every note whole; N that many estimated tokens
        "evidence_tokens": -1,
    })


def judge_settings() -> ml_collections.ConfigDict:
    """The ``config.judge`` block (url "" = the reader's server and model judge; key: $CDSJAX_JUDGE_API_KEY;
    enabled False = no judge: the rule-based scores alone)."""
    # rationale False: the verdict alone (cdsjax.io.judge.VERDICT_ONLY_PROMPT), for a slow local judge
    return ml_collections.ConfigDict({"enabled": True, "url": "", "model": "", "max_tokens": 1024,
                                      "timeout": 120.0, "max_retries": 3, "rationale": True})


def control_labels(config) -> List[str]:
    """The control selectors (``none``, ``full``) among ``config.selectors``."""
    labels = config.selectors
    if isinstance(labels, str):
        labels = [s.strip() for s in labels.split(",") if s.strip()]
    return [s for s in labels if s in CONTROLS]


def enabled(config) -> bool:
    """Whether the config asks for the reader stage (``config.reader.url`` set).

    Raises:
      ValueError: a control selector is asked for without a reader, or no model is named.
    """
    reader = config.get("reader", None)
    url = str(reader.get("url", "") or "") if reader is not None else ""
    if not url and reader is not None and str(reader.get("local", "") or ""):
        return True  # the local server names its own model
    if not url:
        if control_labels(config):
            raise ValueError(f"selectors {control_labels(config)} need a reader: set --config.reader.url")
        return False
    from cdsjax.io.llm import IMAGE_MODES

    images = str(reader.get("images", "auto"))
    if images not in IMAGE_MODES:
        raise ValueError(f"config.reader.images must be one of {', '.join(IMAGE_MODES)}, got {images!r}")
    if not str(reader.get("model", "") or os.environ.get("CDSJAX_READER_MODEL", "")):
        raise ValueError("config.reader.model is empty: name the served model (it is part of every reply's "
                         "cache key)")
    return True


LOCAL_TIMEOUT_S = 1800.0  # the least reader and judge timeout with a local server


@contextlib.contextmanager
def local_reader(config, log: Callable[[str], None] = print):
    """Yields ``config`` unchanged, or — when ``config.reader.url`` is empty and ``config.reader.local`` names a
    model — a copy whose reader URL and model are those of a local llama.cpp server
    (:class:`cdsjax.io.local_reader.LocalReader`: this user's running one for the same model and settings, else
    one started now; released on leaving, it stays up ``config.reader.local_keep_alive`` seconds), with at most
    its slots in flight. Its API key is ``$CDSJAX_READER_API_KEY`` while inside (keys never enter a config).
    The judge, unless ``config.judge.url`` names another server, is the same local model."""
    r = config.reader
    name = str(r.get("local", "") or "")
    if str(r.get("url", "") or "") or not name:
        yield config
        return
    from cdsjax.io.local_reader import LocalReader, LocalReaderConfig, keep_alive_setting

    settings = LocalReaderConfig(model=name, threads=int(r.get("local_threads", 0)),
                                 ctx_per_slot=int(r.get("local_ctx", 8192)), slots=int(r.get("local_slots", 2)),
                                 keep_alive=keep_alive_setting(r.get("local_keep_alive", None)))
    key_variable = "CDSJAX_READER_API_KEY"
    with LocalReader(settings) as local, _environ(key_variable, local.api_key):
        d = local.describe()
        how = "reused, already running" if local.reused else f"started in {local.startup_s:.1f}s"
        log(f"local reader: {d['model']} on {d['runtime']}, {d['threads']} threads, {d['slots']} slots of "
            f"{d['ctx_per_slot']} tokens, {how} (log: {local.log_path})")
        config = copy.deepcopy(config)
        with config.unlocked():
            config.reader.url = local.base_url
            config.reader.model = local.model_name
            config.reader.concurrency = min(int(r.concurrency), settings.slots)
            config.reader.started_local = True  # the evidence budget defaults to the local reader's
            # a CPU answers in 10-20 s alone, and several times slower beside other work: room for that
            config.reader.timeout = max(float(r.timeout), LOCAL_TIMEOUT_S)
            if "judge" in config and not str(config.judge.get("url", "") or ""):
                config.judge.timeout = max(float(config.judge.get("timeout", 120.0)), LOCAL_TIMEOUT_S)
        yield config


@contextlib.contextmanager
def _environ(name: str, value: Optional[str]):
    """``os.environ[name] = value`` while inside (as it was afterwards)."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def evidence_tokens(config) -> Optional[int]:
    """The run's evidence token budget: ``config.reader.evidence_tokens`` (0: every note whole, as before
    token budgets; -1, the default: the local reader's :data:`cdsjax.defaults.LOCAL_EVIDENCE_TOKENS` with
    ``config.reader.local``, else derived from the server's window)."""
    from cdsjax.pipeline.defaults import LOCAL_EVIDENCE_TOKENS

    r = config.reader
    value = int(r.get("evidence_tokens", -1))
    if value >= 0:
        return value
    return LOCAL_EVIDENCE_TOKENS if bool(r.get("started_local", False)) else None


def _clients(config, cache: Optional[ReplyCache] = None):
    from cdsjax.io.judge import Judge
    from cdsjax.io.reader import Reader, ReaderConfig

    r = config.reader
    rc = ReaderConfig(base_url=str(r.url), model=str(r.model) or None, timeout=float(r.timeout),
                      max_retries=int(r.max_retries), max_tokens=int(r.max_tokens),
                      temperature=float(r.temperature), max_text_chars=int(r.max_text_chars),
                      concurrency=int(r.concurrency), backoff=float(r.get("backoff", 1.0)),
                      images=str(r.get("images", "auto")), evidence_tokens=evidence_tokens(config))
    reader = Reader(rc, cache=cache)
    j = config.get("judge", None) or judge_settings()
    if not bool(j.get("enabled", True)):
        return reader, None
    jc = dataclasses.replace(rc, base_url=str(j.get("url", "") or r.url), model=str(j.get("model", "") or r.model),
                             max_tokens=int(j.get("max_tokens", 1024)), timeout=float(j.get("timeout", 120.0)),
                             max_retries=int(j.get("max_retries", 3)), temperature=0.0)
    rationale = bool(j.get("rationale", True))
    judge = Judge(jc, rationale=rationale) if j.get("url", "") else \
        Judge(dataclasses.replace(jc, api_key=reader.config.api_key), rationale=rationale)
    return reader, judge


def _item_from_index_note(note: dict, note_id: str, rank: int):
    from cdsjax.io.reader import KINDS, EvidenceItem

    kind = note.get("kind", "text")
    if kind not in KINDS:
        kind = "figure" if note.get("image_path") else "text"
    bbox = note.get("bbox")
    return EvidenceItem(note_id=note_id, doc_id=str(note.get("doc_id") or note_id.split("#")[0]),
                        page=int(note.get("page", 0)), kind=kind, text=note.get("text") or "",
                        summary=note.get("summary") or "", caption=note.get("caption") or "",
                        bbox=tuple(float(v) for v in bbox) if bbox is not None else None,
                        image_path=note.get("image_path"), rank=rank, ocr_text=note.get("ocr_text") or "")


class EvidenceSource:
    """The reader's view of each note of the problems (:class:`~cdsjax.io.reader.EvidenceItem` by note id): a
    text benchmark's paragraphs, or a PDF's index notes with their image crops."""

    def __init__(self, problems, *, kind: str, indexes: Optional[Dict[str, Any]] = None):
        self.kind = kind
        self.notes: Dict[str, dict] = {}
        if indexes is not None:
            for doc_id, idx in indexes.items():
                for note in idx.notes:
                    self.notes[f"{doc_id}#{note['reading_order']}"] = dict(note, doc_id=doc_id)
        else:
            for p in problems:
                for nid, doc, text in zip(p.note_ids, p.docs, p.texts or [""] * len(p.note_ids)):
                    self.notes.setdefault(nid, {"doc_id": doc, "page": 0, "kind": "text", "text": text})

    def items(self, note_ids: Sequence[str]) -> list:
        return [_item_from_index_note(self.notes[n], n, r) for r, n in enumerate(note_ids, 1)]


def _estimated_tokens(items, max_text_chars: int) -> int:
    from cdsjax.io.evidence_fit import TOKENS_PER_IMAGE, estimate_tokens
    from cdsjax.io.reader import PROMPT_RESERVE_TOKENS, note_text

    images = sum(1 for i in items if i.is_visual and i.image_path)
    return sum(estimate_tokens(note_text(i, max_text_chars)) for i in items) + TOKENS_PER_IMAGE * images \
        + PROMPT_RESERVE_TOKENS


def fits_reader(items, *, max_context: int, max_images: int, max_tokens: int, max_text_chars: int) -> bool:
    """Whether a request with evidence ``items`` fits the reader: its estimated prompt (3 characters a token,
    a fixed cost per image and for the prompt) plus ``max_tokens`` within ``max_context`` tokens, and at most
    ``max_images`` images (0: any number)."""
    images = sum(1 for i in items if i.is_visual and i.image_path)
    if max_images and images > max_images:
        return False
    return _estimated_tokens(items, max_text_chars) + max_tokens <= max_context


def full_document_ids(problem) -> List[str]:
    """The notes the ``full`` control sends: every note of the question's own documents in the problem's order
    (a pool's distractor documents left out), or every note of the problem where it names no own documents."""
    own = set(problem.gold_docs or ())
    if not own:
        return list(problem.note_ids)
    return [n for n, d in zip(problem.note_ids, problem.docs) if d in own]


def _judge_call(judge, cache: ReplyCache, question: str, gold: str, predicted: str) -> float:
    from cdsjax.io.judge import parse_verdict
    from cdsjax.io.llm import ReaderError

    key = reply_key(kind="judge", model=judge.config.model, prompt=JUDGE_PROMPT_VERSION,
                    prompt_hash=content_hash(judge.prompt), question=question, gold=gold, predicted=predicted)

    def fetch():
        verdict = judge.judge(question, gold, predicted)
        return {"correct": bool(verdict.correct), "score": float(verdict.score), "raw": verdict.raw}

    hit, _ = cache.get_or_fetch(key, fetch)
    try:
        parse_verdict(hit["raw"]) if hit.get("raw") else None
    except ValueError as err:  # a cached reply the current parser cannot read
        raise ReaderError(f"judge reply unreadable: {err}", kind="bad_response") from None
    return float(hit["correct"])


def cites_gold(query, evidence: Sequence[Any], text: str) -> Optional[float]:
    """1.0 when the answer cites (``[n]``) a gold note — a gold paragraph on text benchmarks, a note on a gold
    page on PDF benchmarks — 0.0 when it cites none (or nothing), None without evidence or without gold."""
    from cdsjax.io.replies import parse_citations

    if not evidence or not (query.gold_note_ids or query.gold_pages):
        return None

    def gold(item) -> bool:
        if item.note_id in query.gold_note_ids:
            return True
        return item.page in query.gold_pages.get(item.doc_id, ())

    cited = parse_citations(text, len(evidence))
    return float(any(gold(evidence[n - 1]) for n in cited))


def _gold_answers(query) -> List[str]:
    from cdsjax.io.reader import ABSTAIN

    meta = query.meta or {}
    answers = list(meta.get("answers") or ([query.answer] if query.answer is not None else []))
    out = [ABSTAIN if a.strip().lower() in ("unanswerable", "not answerable") else a for a in answers if a]
    return list(dict.fromkeys(out))


def sentence_similarity(embedder):
    """``similarity(question, sentences)`` under ``embedder`` (cosine): what trimming a note to the reader's token
    budget keeps, as ``ask`` does with the index's embedder."""
    def similarity(question: str, sentences) -> list:
        vectors = np.asarray(embedder.encode_queries([question, *sentences]), dtype=np.float64)
        return (vectors[1:] @ vectors[0]).tolist()

    return similarity


def read_answers(config, bench, kind: str, problems, records: Sequence[dict], out_dir: pathlib.Path, *,
                 embedder=None, cache_dir: Optional[pathlib.Path] = None, progress: bool = True,
                 log: Callable[[str], None] = print) -> List[dict]:
    """Answers and scores every (question, selector, budget, seed) of ``records`` and the controls (module
    docstring); writes ``answers.jsonl`` and returns its records."""
    from cdsjax.io.llm import ReaderError
    from cdsjax.io.replies import markers_only
    from cdsjax.eval.settings import budgets_of

    r = config.reader
    seeds = [int(s) for s in (r.seeds if not isinstance(r.seeds, (int, str)) else str(r.seeds).split(","))]
    max_tokens, max_chars = int(r.max_tokens), int(r.max_text_chars)
    max_images = int(r.get("max_images", 0) or 0)
    by_qid = {p.query.qid: p for p in problems}
    indexes = None
    if kind != "text":
        from cdsjax.eval.problems import pdf_indexes

        docs = list(dict.fromkeys(d for p in problems for d in p.docs))
        indexes = pdf_indexes(bench, docs, config, embedder, cache_dir=cache_dir)
    source = EvidenceSource(problems, kind=kind, indexes=indexes)

    tasks = []
    for rec in records:
        if rec["qid"] in by_qid:
            tasks.append((rec["selector"], int(rec["budget"]), rec["qid"], list(rec["selected"])))
    controls = control_labels(config)
    skipped_full = 0
    for label in controls:
        for b in budgets_of(config):
            for p in problems:
                if label == "none":
                    tasks.append((label, b, p.query.qid, []))
                    continue
                ids = full_document_ids(p)
                if not fits_reader(source.items(ids), max_context=int(r.max_context), max_images=max_images,
                                   max_tokens=max_tokens, max_text_chars=max_chars):
                    skipped_full += 1
                    continue
                tasks.append((label, b, p.query.qid, ids))
    if "full" in controls:
        n_full = len(problems) * len(budgets_of(config))
        log(f"full-document control: {n_full - skipped_full} of {n_full} (question, budget) pairs fit "
            f"config.reader.max_context={int(r.max_context)} tokens"
            + (f" and config.reader.max_images={max_images}" if max_images else ""))
    cache = ReplyCache(out_dir / "replies")
    reader, judge = _clients(config, cache)
    similarity = sentence_similarity(embedder) if embedder is not None else None

    model = str(r.model) or reader.model
    mmlb = bench.name.startswith("mmlongbench")
    judge_label = {}
    if judge is not None and not mmlb:
        judge_label = {"judge_model": judge.config.model,
                       "judge_is_reader": judge.url == reader.url and judge.config.model == model}

    def one(task, seed):
        label, b, qid, ids = task
        p = by_qid[qid]
        q = p.query
        rec = {"benchmark": bench.name, "selector": label, "budget": b, "qid": qid, "seed": seed, "evidence": ids,
               "metrics": {"accuracy": None, "answer_f1": None, "exact_match": None, "markers_only": None,
                           "no_answer": None, "cites_gold": None, "reader_error": 0.0, "judge_error": None}}
        try:
            # the one reading path (ask, serve and the pipeline read through it too): token budget, reply cache,
            # a reply that is no answer asked again once
            out = reader.answer(q.question, source.items(ids), max_tokens=max_tokens, seed=seed,
                                whole=label == "full", on_token=lambda _: None, similarity=similarity)
            text = out.text
            rec.update(answer=text, reply=out.raw, cached=out.cached, images=out.images, image_mode=out.image_mode, dropped=out.dropped,
                       sent=[i.note_id for i in out.evidence], evidence_tokens=out.evidence_tokens,
                       trimmed=out.trimmed, prompt_tokens=(out.usage or {}).get("prompt_tokens"),
                       no_answer=out.no_answer, retried=out.retried)
            if out.warnings:
                rec["warnings"] = list(out.warnings)
            rec["metrics"]["markers_only"] = float(markers_only(out.raw, q.question))
            rec["metrics"]["no_answer"] = float(out.no_answer is not None)
            rec["metrics"]["cites_gold"] = cites_gold(q, list(out.evidence), text)
            if mmlb:
                xm = S.extraction_messages(q.question, text or "Not answerable")
                extracted = S.parse_extracted(reader.reply(xm, max_tokens=128)[0].content)
                fmt = (q.meta or {}).get("answer_format")
                rec["extracted"] = extracted
                rec["metrics"]["accuracy"] = S.score_mmlongbench(extracted, str(q.answer or ""), fmt)
                rec["answerable"] = bool((q.meta or {}).get("answerable", True)) and str(fmt) != "None"
                rec["declined"] = S.declines_mmlongbench(extracted)
        except ReaderError as err:
            return _failed(rec, {"kind": err.kind, "message": str(err)})
        except (OSError, ValueError) as err:  # an evidence image that cannot be read, a bad entry
            return _failed(rec, {"kind": "evidence", "message": str(err)})
        if mmlb:
            return rec
        golds = _gold_answers(q)
        if "extractive_spans" in (q.meta or {}):
            rec["metrics"]["answer_f1"] = S.qasper_answer_f1(text, q.meta["extractive_spans"])
        rec["metrics"]["exact_match"] = S.exact_match(text, golds)
        if out.no_answer is not None and golds and judge is not None:  # no answer (asked twice): wrong, unjudged
            rec["metrics"]["accuracy"] = 0.0
        elif judge is not None and golds:
            rec.update(judge_label)
            try:
                # correct against any gold answer; the judge is asked gold by gold until one agrees
                rec["metrics"]["accuracy"] = float(any(_judge_call(judge, cache, q.question, g, text) for g in golds))
                rec["metrics"]["judge_error"] = 0.0
            except ReaderError as err:  # the answer and its rule-based scores stand; only the verdict is missing
                rec["judge_error"] = {"kind": err.kind, "message": str(err)}
                rec["metrics"]["judge_error"] = 1.0
        return rec

    # question by question (every selector of a question, then the next question), so that a run stopped midway
    # leaves complete, paired comparisons on the questions it finished
    order = {qid: i for i, qid in enumerate(by_qid)}
    tasks.sort(key=lambda t: (order[t[2]], t[1]))
    jobs = [(t, s) for t in tasks for s in seeds]
    out: List[Optional[dict]] = [None] * len(jobs)
    from tqdm.auto import tqdm

    with ThreadPoolExecutor(max_workers=max(1, int(r.concurrency)), thread_name_prefix="cdsjax-eval-reader") as pool, \
            tqdm(total=len(jobs), desc=f"read {bench.name}", unit="answer", disable=not progress) as bar:
        futures = {pool.submit(one, t, s): i for i, (t, s) in enumerate(jobs)}
        for fut in as_completed(futures):
            out[futures[fut]] = fut.result()
            bar.update()
    cache.close()
    reader.close()
    if judge is not None:
        judge.close()
    tmp = out_dir / (ANSWERS_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in out:
            f.write(json.dumps(rec, default=str) + "\n")
    tmp.replace(out_dir / ANSWERS_FILE)
    errors = sum(1 for rec in out if "error" in rec)
    cached = sum(1 for rec in out if rec.get("cached"))
    judge_errors = sum(1 for rec in out if "judge_error" in rec)
    as_text = sum(1 for rec in out if rec.get("image_mode") == "text")
    dropped = sum(1 for rec in out if rec.get("dropped"))
    log(f"reader: {len(out)} answers ({cached} from the reply cache), {errors} failed (reader_error)"
        + (f", {judge_errors} not judged (judge_error)" if judge_errors else "")
        + (f"; {as_text} sent their visual notes as text" if as_text else "")
        + (f"; {dropped} left their last notes out (beyond the evidence token budget, or too long for the "
           f"reader's context)" if dropped else ""))
    return out


def _failed(rec: dict, error: dict) -> dict:
    """``rec`` as a failed read: its error, every metric None but ``reader_error`` 1."""
    rec["error"] = error
    rec["metrics"] = {m: None for m in ANSWER_METRICS}
    rec["metrics"]["reader_error"] = 1.0
    return rec


def merged_answer_records(answers: Sequence[dict]) -> List[dict]:
    """One pseudo-record per (benchmark, selector, budget, question) whose ``metrics`` are the answer metrics
    averaged over seeds (failed seeds left out; ``reader_error`` the share that failed)."""
    groups: Dict[tuple, list] = {}
    for a in answers:
        groups.setdefault((a["benchmark"], a["selector"], a["budget"], a["qid"]), []).append(a)
    out = []
    for (bench, sel, b, qid), recs in groups.items():
        metrics = {}
        for m in ANSWER_METRICS:
            vals = [x["metrics"][m] for x in recs if x["metrics"].get(m) is not None]
            metrics[m] = float(np.mean(vals)) if vals else None
        out.append({"benchmark": bench, "selector": sel, "budget": b, "qid": qid, "metrics": metrics})
    return out


def with_answer_metrics(records: Sequence[dict], answers: Sequence[dict]) -> List[dict]:
    """``records`` with each one's answer metrics added to its ``metrics``, and a record per control question."""
    merged = {(m["benchmark"], m["selector"], m["budget"], m["qid"]): m for m in merged_answer_records(answers)}
    out = []
    for r in records:
        m = merged.pop((r["benchmark"], r["selector"], int(r["budget"]), r["qid"]), None)
        out.append(dict(r, metrics={**r["metrics"], **(m["metrics"] if m else {})}))
    return out + list(merged.values())


def answer_first(rows: Sequence[dict]) -> List[dict]:
    """``summary.csv`` rows with, within each budget, the answer metrics (accuracy, F1, their differences and
    spreads, reader errors) before the retrieval metrics; the order is otherwise kept."""
    answer = ("accuracy", "answer_f1", "generalized_f1", "exact_match", "markers_only", "cites_gold", "reader_error",
              "judge_error")
    budgets = list(dict.fromkeys(r["metric"].rpartition("@")[2] for r in rows))
    return sorted(rows, key=lambda r: (budgets.index(r["metric"].rpartition("@")[2]),
                                       0 if r["metric"].startswith(answer) else 1))


def answer_rows(answers: Sequence[dict], *, num_resamples: int = 10_000) -> List[dict]:
    """Extra ``summary.csv`` rows: paired accuracy and token-F1 differences to ``cosine`` and to ``none``
    (``accuracy_vs_cosine@B``, ``answer_f1_vs_none@B``; mean difference over the questions both have a value
    for, with a 95% bootstrap interval), MMLongBench-Doc's generalized F1 (``generalized_f1@B``, bootstrap
    over questions), and the mean and std over seeds of the per-seed mean accuracies (``accuracy_seed_mean@B``,
    ``accuracy_seed_std@B``; n = seeds, no interval)."""
    import cdsjax.eval.metrics as M
    from cdsjax.pipeline.catalog import REFERENCE_SELECTOR

    rows = []
    merged = merged_answer_records(answers)
    values = {(m["benchmark"], m["selector"], m["budget"], m["qid"]): m["metrics"] for m in merged}
    groups = list(dict.fromkeys((m["benchmark"], m["selector"], m["budget"]) for m in merged))
    rng = np.random.default_rng(0)
    for bench, sel, b in groups:
        qids = [k[3] for k in values if k[:3] == (bench, sel, b)]
        for metric in ("accuracy", "answer_f1"):
            for ref in (REFERENCE_SELECTOR, "none"):
                if ref == sel or (bench, ref, b) not in groups:
                    continue
                ours = [values[(bench, sel, b, q)].get(metric) for q in qids]
                theirs = [(values.get((bench, ref, b, q)) or {}).get(metric) for q in qids]
                if not any(x is not None and y is not None for x, y in zip(ours, theirs)):
                    continue  # no token F1 on this benchmark, no judge, or no question both answered
                d = M.paired_difference(ours, theirs, num_resamples=num_resamples)
                rows.append({"benchmark": bench, "selector": sel, "metric": f"{metric}_vs_{ref}@{b}",
                             "mean": d["mean"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n": d["n"]})
        sub = [a for a in answers if (a["benchmark"], a["selector"], a["budget"]) == (bench, sel, b)
               and a["metrics"]["accuracy"] is not None]
        if sub and "answerable" in sub[0]:
            scores = np.asarray([a["metrics"]["accuracy"] for a in sub])
            ans = np.asarray([a["answerable"] for a in sub])
            dec = np.asarray([a["declined"] for a in sub])
            f1 = S.generalized_f1(scores, ans, dec)
            boot = []
            for _ in range(min(num_resamples, 2000)):
                i = rng.integers(0, len(sub), len(sub))
                boot.append(S.generalized_f1(scores[i], ans[i], dec[i]))
            boot = np.asarray([v for v in boot if np.isfinite(v)])
            lo, hi = (np.percentile(boot, [2.5, 97.5]) if boot.size else (float("nan"), float("nan")))
            rows.append({"benchmark": bench, "selector": sel, "metric": f"generalized_f1@{b}", "mean": f1,
                         "ci_low": float(lo), "ci_high": float(hi), "n": len(sub)})
        per_seed: Dict[int, list] = {}
        for a in sub:
            per_seed.setdefault(a["seed"], []).append(a["metrics"]["accuracy"])
        means = [float(np.mean(v)) for v in per_seed.values()]
        if means:
            nan = float("nan")
            std = float(np.std(means, ddof=1)) if len(means) > 1 else 0.0
            for name, value in (("accuracy_seed_mean", float(np.mean(means))), ("accuracy_seed_std", std)):
                rows.append({"benchmark": bench, "selector": sel, "metric": f"{name}@{b}", "mean": value,
                             "ci_low": nan, "ci_high": nan, "n": len(means)})
    return rows

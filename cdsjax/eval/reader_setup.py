"""The reader stage's settings and clients: the ``config.reader`` and ``config.judge`` blocks of an evaluation
config, whether a run reads at all, the local llama.cpp reader started for a run, the evidence token budget,
and the reader and judge clients of a run (:mod:`cdsjax.eval.reading` runs the stage)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from typing import Callable, List, Optional

import ml_collections

from cdsjax.io.reading.llm.config import ReaderConfig
from cdsjax.io.reading.local.reader import LocalReaderConfig
from cdsjax.io.reading.reply_cache import ReplyCache

CONTROLS = ("none", "full")


def reader_settings() -> ml_collections.ConfigDict:
    """The ``config.reader`` block of an evaluation config (url "" = no reader stage); the client's and the local
    server's settings take their defaults from :class:`~cdsjax.io.reading.llm.config.ReaderConfig` and
    :class:`~cdsjax.io.reading.local.reader.LocalReaderConfig`, where the commands' flags take theirs."""
    return ml_collections.ConfigDict({
        "url": "",  # the OpenAI-compatible server, e.g. http://localhost:8000/v1; the key: $CDSJAX_READER_API_KEY
        "model": "",
        "concurrency": ReaderConfig.concurrency,
        "max_tokens": ReaderConfig.max_tokens,
        "temperature": ReaderConfig.temperature,
        "timeout": ReaderConfig.timeout,
        "max_retries": ReaderConfig.max_retries,
        "max_text_chars": ReaderConfig.max_text_chars,
        "seeds": (0,),
        "max_context": 32768,  # tokens; the "full" control runs where the whole document fits
        "max_images": 0,  # images one request may carry (vLLM's --limit-mm-per-prompt); 0: no limit
        # the local reader (cdsjax.io.reading.local.reader), started for the run when url is "": a preset ("default"),
        # a .gguf path or hf:OWNER/REPO/FILE.gguf; "" = none. Its slots are the requests in flight.
        "local": "",
        "local_threads": LocalReaderConfig.threads,  # 0: every core
        "local_ctx": LocalReaderConfig.ctx_per_slot,  # context tokens per slot
        "local_slots": 2,
        "images": ReaderConfig.images,  # auto: images until the server refuses one, then text; on / off: always / never
        # the evidence's token budget (cdsjax.io.reading.evidence_fit), for any reader: None the reader's own (the
        # local reader's default, else derived from the server's window); 0 every note whole; N that many tokens
        "evidence_tokens": ml_collections.config_dict.placeholder(int),
        # True: a selection judged too weak before reading (its record's ``abstained``, cdsjax.pipeline.abstain)
        # is not read; its answer is "Not answerable". False: every selection is read (ask --no-abstain)
        "abstain": True,
    })


def judge_settings() -> ml_collections.ConfigDict:
    """The ``config.judge`` block (url "" = the reader's server and model judge; key: $CDSJAX_JUDGE_API_KEY;
    enabled False = no judge: the rule-based scores alone)."""
    # rationale False: the verdict alone (cdsjax.io.reading.judge.VERDICT_ONLY_PROMPT), for a slow local judge
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
    from cdsjax.io.reading.llm.config import IMAGE_MODES

    images = str(reader.get("images", "auto"))
    if images not in IMAGE_MODES:
        raise ValueError(f"config.reader.images must be one of {', '.join(IMAGE_MODES)}, got {images!r}")
    if not str(reader.get("model", "") or os.environ.get("CDSJAX_READER_MODEL", "")):
        raise ValueError("config.reader.model is empty: name the served model (it is part of every reply's "
                         "cache key)")
    return True


LOCAL_TIMEOUT_S = 1800.0  # the least reader and judge timeout with a local server


@dataclasses.dataclass(frozen=True)
class Connection:
    """How a run reaches the local server it started, kept out of the config (which is written to run.json):
    the server's API key and its Unix socket."""

    api_key: str
    socket: Optional[str] = None


@contextlib.contextmanager
def local_reader(config, log: Callable[[str], None] = print):
    """Yields ``(config, None)`` unchanged, or — when ``config.reader.url`` is empty and ``config.reader.local``
    names a model — ``(copy, connection)``: a copy of ``config`` whose reader URL and model are those of a local
    llama.cpp server (:func:`cdsjax.io.reading.local.reader.start_local_reader`, the start ``ask`` uses too;
    the run's own, stopped on leaving), with at most its slots in flight, and the :class:`Connection` to pass on
    as an argument (:func:`clients`; keys and sockets never enter a config nor the environment). The judge,
    unless ``config.judge.url`` names another server, is the same local model."""
    r = config.reader
    name = str(r.get("local", "") or "")
    if str(r.get("url", "") or "") or not name:
        yield config, None
        return
    from cdsjax.io.reading.local.reader import start_local_reader

    slots = int(r.get("local_slots", 2))
    local = start_local_reader(name, threads=int(r.get("local_threads", 0)), ctx_per_slot=int(r.get("local_ctx", LocalReaderConfig.ctx_per_slot)),
                               slots=slots)
    with local:
        d = local.describe()
        log(f"local reader: {d['model']} on {d['runtime']}, {d['threads']} threads, {d['slots']} slots of "
            f"{d['ctx_per_slot']} tokens, started in {local.startup_s:.1f}s (log: {local.log_path})")
        config = copy.deepcopy(config)
        with config.unlocked():
            config.reader.url = local.base_url
            config.reader.model = local.model_name
            config.reader.concurrency = min(int(r.concurrency), slots)
            config.reader.started_local = True  # the evidence budget defaults to the local reader's
            # a CPU answers in 10-20 s alone, and several times slower beside other work: room for that
            config.reader.timeout = max(float(r.timeout), LOCAL_TIMEOUT_S)
            if "judge" in config and not str(config.judge.get("url", "") or ""):
                config.judge.timeout = max(float(config.judge.get("timeout", 120.0)), LOCAL_TIMEOUT_S)
        yield config, Connection(api_key=local.api_key, socket=str(local.socket))


def evidence_tokens(config) -> Optional[int]:
    """The run's evidence token budget: ``config.reader.evidence_tokens`` (0: every note whole, as before
    token budgets; None, the default: the local reader's :data:`cdsjax.defaults.LOCAL_EVIDENCE_TOKENS`
    with ``config.reader.local``, else None, derived from the server's window)."""
    from cdsjax.defaults import LOCAL_EVIDENCE_TOKENS

    r = config.reader
    value = r.get("evidence_tokens", None)
    if value is not None:
        if int(value) < 0:
            raise ValueError(f"config.reader.evidence_tokens must be >= 0 (or None: the reader's own), got {value}")
        return int(value)
    return LOCAL_EVIDENCE_TOKENS if bool(r.get("started_local", False)) else None


def clients(config, cache: Optional[ReplyCache] = None, connection: Optional[Connection] = None):
    """The run's reader and judge (None when ``config.judge.enabled`` is False). ``connection``: how to reach the
    local server the run started (:func:`local_reader`); None: ``config.reader.url``, its key read from
    ``$CDSJAX_READER_API_KEY``."""
    from cdsjax.io.reading.judge import Judge
    from cdsjax.io.reading.llm.config import ReaderConfig
    from cdsjax.io.reading.reader import Reader

    r = config.reader
    rc = ReaderConfig(base_url=str(r.url), model=str(r.model) or None,
                      api_key=connection.api_key if connection else None,
                      socket=connection.socket if connection else None, timeout=float(r.timeout),
                      max_retries=int(r.max_retries), max_tokens=int(r.max_tokens),
                      temperature=float(r.temperature), max_text_chars=int(r.max_text_chars),
                      concurrency=int(r.concurrency), backoff=float(r.get("backoff", 1.0)),
                      images=str(r.get("images", "auto")))
    reader = Reader(rc, cache=cache)
    j = config.get("judge", None) or judge_settings()
    if not bool(j.get("enabled", True)):
        return reader, None
    jc = dataclasses.replace(rc, base_url=str(j.get("url", "") or r.url), model=str(j.get("model", "") or r.model),
                             socket=None if j.get("url", "") else rc.socket,
                             max_tokens=int(j.get("max_tokens", 1024)), timeout=float(j.get("timeout", 120.0)),
                             max_retries=int(j.get("max_retries", 3)), temperature=0.0)
    rationale = bool(j.get("rationale", True))
    judge = Judge(jc, rationale=rationale) if j.get("url", "") else \
        Judge(dataclasses.replace(jc, api_key=reader.config.api_key), rationale=rationale)
    return reader, judge

"""The application ``cdsjax serve`` runs: a typed :class:`ServerState`, one module function per endpoint.

:func:`create_app` puts the FastAPI routes behind :class:`cdsjax.commands.guard.Guard`; every handler reads
the one :class:`ServerState` (``request.app.state.server``), which is built once from a loaded pipeline and
whose only changing parts are its lanes and the guard's :class:`cdsjax.commands.guard.Traffic` counters.
The endpoints and what they answer are listed in :mod:`cdsjax.commands.serve`; the rules on request values
live in :mod:`cdsjax.commands.policy`.
"""

# no `from __future__ import annotations`: FastAPI reads the request model from real annotations
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from cdsjax.commands import page as web
from cdsjax.commands import policy
from cdsjax.commands.guard import Busy, Guard, Lane, Limits, Traffic
from cdsjax.io.reading.options import ReadOptions
from cdsjax.io.util import one_line
from cdsjax.defaults import DEFAULT_BUDGET

FILE_READS = 2  # PDFs and crops read and hashed at once (each off the event loop); more wait their turn
PDF_RESPONSES = 4  # PDFs held in memory at once, from reading to the last byte sent; more get 503


class HeldResponse(Response):
    """A response that gives back its slot (``release``) once sent, or once its client has gone."""

    def __init__(self, content: bytes, release: Callable[[], None], **kwargs):
        super().__init__(content, **kwargs)
        self.release = release

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


class Question(BaseModel):
    """The body of ``POST /ask`` and ``POST /select``: strict types (no string or bool read as a number)."""

    model_config = ConfigDict(extra="forbid")
    question: StrictStr = Field(min_length=1, max_length=policy.MAX_QUESTION_CHARS)
    selector: Optional[StrictStr] = Field(default=None, max_length=100)
    budget: Optional[StrictInt] = Field(default=None, ge=1, le=policy.MAX_BUDGET)
    # /ask: the evidence the reader reads, in estimated tokens (0: every note whole); None: the server's default
    evidence_tokens: Optional[StrictInt] = Field(default=None, ge=0, le=policy.MAX_EVIDENCE_TOKENS)
    options: Dict[str, Any] = Field(default_factory=dict)
    near_duplicates: Optional[StrictFloat] = Field(default=None, ge=-1.0, le=1.0, allow_inf_nan=False)
    stream: StrictBool = False  # /ask: JSON lines as the answer is written (stream_answer)
    abstain: StrictBool = True  # false: read even evidence judged too weak (cdsjax.pipeline.abstain)

    @field_validator("question", "selector")
    @classmethod
    def unicode(cls, value):
        if value is not None and not policy.is_text(value):
            raise ValueError("not valid Unicode (a lone surrogate)")
        return value


@dataclasses.dataclass
class ServerState:
    """Everything the handlers read: the pipeline, the server's defaults and limits, what was read from the
    indexes at start-up (documents, crops, PDFs, the page), the lanes work runs on and the guard's counters."""

    pipe: Any
    limits: Limits
    default_selector: str
    default_budget: int
    documents: List[dict]
    crops: Dict[str, tuple]
    pdfs: policy.PdfFiles
    page_html: str
    compute: Lane
    compiling: Lane
    reading: Lane
    traffic: Traffic = dataclasses.field(default_factory=Traffic)
    started: float = dataclasses.field(default_factory=time.time)
    file_reads: Optional[asyncio.Semaphore] = None
    pdfs_held: int = 0
    read_options: ReadOptions = dataclasses.field(default_factory=ReadOptions)

    @classmethod
    def load(cls, pipe, *, limits: Optional[Limits] = None, default_selector: Optional[str] = None,
             default_budget: int = DEFAULT_BUDGET, read_workers: int = 4,
             max_pdf_bytes: int = policy.DEFAULT_MAX_PDF_MB << 20,
             read_options: Optional[ReadOptions] = None) -> "ServerState":
        """The state around a loaded :class:`cdsjax.pipeline.Pipeline`.

        Args:
          pipe: the pipeline (its ``reader`` answers /ask when set).
          limits: what the guard enforces (default: loopback names only, no token, 64 KiB bodies, 30 s).
          default_selector, default_budget: used when a request leaves them out (selector: None for the
            catalog's default).
          read_workers: reader calls in flight at once.
          max_pdf_bytes: largest source PDF ``/pdf`` serves.
          read_options: the reads' defaults (the command's flags), which a request's ``evidence_tokens``
            overrides.
        """
        from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, display
        from cdsjax.core.registry import SPECS

        limits = limits or Limits()
        if limits.queue < 1 or limits.uploads < 1:
            raise ValueError(f"queue and uploads must be >= 1, got {limits.queue} and {limits.uploads}")
        default_selector = default_selector or display(DEFAULT_SELECTOR)
        notes = pipe.corpus.notes
        pdfs = policy.PdfFiles(pipe.corpus.roots, max_pdf_bytes)
        # a note id is looked up, never used as a path; the path and its hash were checked when the index loaded
        # (ids are unique across the loaded indexes: Corpus.merge refuses a collision)
        crops = {str(n.get("note_id")): (n["image_path"], n.get("image_sha256"), pdfs.index_of.get(str(n.get("doc_id"))))
                 for n in notes if n.get("image_path")}
        page_html = web.render(default_selector=default_selector, default_budget=default_budget,
                               selector_displays=[display(name) for name in SPECS])
        # selections whose selector is compiled run on one lane; those that compile one (seconds, and a new
        # option value always does) on another, so a client asking for new compilations cannot hold up the rest
        return cls(pipe=pipe, limits=limits, default_selector=default_selector, default_budget=default_budget,
                   documents=document_rows(notes, pdfs.index_of), crops=crops, pdfs=pdfs,
                   page_html=page_html, compute=Lane("select", concurrency=1, max_abandoned=2),
                   compiling=Lane("compile", concurrency=1, max_abandoned=2),
                   reading=Lane("read", concurrency=max(1, read_workers), max_abandoned=max(1, read_workers)),
                   read_options=read_options or ReadOptions())

    @property
    def roots(self) -> list:
        return list(self.pipe.corpus.roots)

    def lanes_running(self) -> int:
        """Jobs still running on any lane (abandoned ones included)."""
        return sum(lane.running() for lane in (self.compute, self.compiling, self.reading))

    def error(self, status: int, message: str, **extra) -> JSONResponse:
        return JSONResponse({"error": one_line(policy.scrub(message, self.roots), 600), **extra}, status_code=status)

    async def read_file(self, fn: Callable, *args):
        """``fn(*args)`` (a file read and hashed) on a worker thread, at most :data:`FILE_READS` at once."""
        if self.file_reads is None:
            self.file_reads = asyncio.Semaphore(FILE_READS)
        async with self.file_reads:
            return await asyncio.to_thread(fn, *args)


def document_rows(notes, index_of: Optional[Dict[str, str]] = None) -> List[dict]:
    """One row per document of the notes: its id, the index that holds it, pages, notes and notes by kind."""
    rows: Dict[str, dict] = {}
    for note in notes:
        doc = str(note.get("doc_id"))
        row = rows.setdefault(doc, dict(document=doc, index=(index_of or {}).get(doc), pages=0, notes=0, kinds={}))
        row["notes"] += 1
        row["pages"] = max(row["pages"], int(note.get("page", 0)) + 1)
        kind = note.get("kind", "text")
        row["kinds"][kind] = row["kinds"].get(kind, 0) + 1
    return list(rows.values())


def state_of(request: Request) -> ServerState:
    return request.app.state.server


# ------------------------------------------------------------------ errors


async def invalid(request: Request, exc: RequestValidationError):
    parts = []
    for e in exc.errors():
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{where}: {e.get('msg')}")
    return state_of(request).error(422, "bad request: " + "; ".join(parts))


async def http_error(request: Request, exc: StarletteHTTPException):
    return state_of(request).error(exc.status_code, str(exc.detail))


async def internal(request: Request, exc: Exception):
    import traceback

    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)  # the server's log only
    return state_of(request).error(500, f"internal error ({type(exc).__name__}); the server's log has the details")


# ------------------------------------------------------------------ GET endpoints


async def health(request: Request):
    """Never waits: counters and sizes only."""
    state = state_of(request)
    pipe, reader = state.pipe, state.pipe.reader
    lanes = (state.compute, state.compiling)
    return dict(status="ok", documents=len(state.documents), notes=len(pipe.corpus),
                default_selector=state.default_selector, default_budget=state.default_budget,
                reader=getattr(getattr(reader, "config", None), "model", None) if reader else None,
                queue=dict(in_flight=state.traffic.in_flight, limit=state.limits.queue),
                uploads=dict(in_progress=state.traffic.uploading, limit=state.limits.uploads),
                compute=dict(running=sum(lane.running() for lane in lanes),
                             abandoned=sum(lane.abandoned for lane in lanes),
                             compiled=len(pipe.compiled), compiled_limit=getattr(pipe.compiled, "maxsize", None)),
                refused=dict(state.traffic.refused), uptime_s=round(time.time() - state.started, 3))


async def page(request: Request):
    return HTMLResponse(state_of(request).page_html)


async def list_documents(request: Request):
    state = state_of(request)
    return {"documents": state.documents, "indexes": [os.path.basename(str(r).rstrip(os.sep)) for r in state.roots]}


async def pdf(request: Request, document: str, index: Optional[str] = None):
    """The source PDF of a loaded document, by id, checked on every request (:class:`policy.PdfFiles`: the
    file recorded at indexing with its symlinks resolved, opened without following a link, same sha256); the
    bytes sent are the bytes checked. ``index`` (optional) names the index that must hold the document."""
    state = state_of(request)
    if document not in state.pdfs or (index is not None and state.pdfs.index_of.get(document) != index):
        return state.error(404, f"no PDF for document {policy.echo(document)}: it is not in the loaded indexes")
    if state.pdfs_held >= PDF_RESPONSES:
        state.traffic.count("busy")
        return JSONResponse({"error": f"server busy: {PDF_RESPONSES} PDFs being sent; retry later"},
                            status_code=503, headers={"Retry-After": "1"})
    state.pdfs_held += 1
    try:
        data = await state.read_file(state.pdfs.read, document)
    except BaseException:
        state.pdfs_held -= 1
        raise
    if data is None:
        state.pdfs_held -= 1
        return state.error(404, f"no PDF for document {policy.echo(document)}: it is missing, changed since "
                           f"indexing, not a regular file, or over {state.pdfs.max_bytes >> 20} MB")

    def release():
        state.pdfs_held -= 1

    return HeldResponse(data, release, media_type="application/pdf", headers={"X-Content-Type-Options": "nosniff"})


async def crop(request: Request, note: str, index: Optional[str] = None):
    """The crop of a visual note, by id; ``index`` (optional) names the index that must hold the note."""
    state = state_of(request)
    found = state.crops.get(note)
    if found is not None and index is not None and found[2] != index:
        found = None
    data = await state.read_file(policy.read_crop, found[0], state.roots, found[1]) if found is not None else None
    if data is None:
        return state.error(404, f"no crop for note {policy.echo(note)}")
    return Response(data, media_type="image/png", headers={"X-Content-Type-Options": "nosniff"})


# ------------------------------------------------------------------ questions


def public(state: ServerState, result, body: Question) -> dict:
    """The answer as the client sees it: crops relative to their index, no server path in errors."""
    out = result.to_dict()
    roots = state.roots
    if body.near_duplicates is not None:  # for the web page: pairs within the list, no embeddings sent
        out["near_duplicates"] = web.near_duplicates(state.pipe, out["evidence"], body.near_duplicates)
    for e in out.get("evidence", []):
        e["image_path"] = policy.public_path(e.get("image_path"), roots)
    if out.get("error"):
        out["error"] = {k: policy.scrub(v, roots) if isinstance(v, str) else v for k, v in out["error"].items()}
    return policy.finite(out)


async def answer(state: ServerState, body: Question, read: bool):
    from cdsjax.pipeline import PipelineError
    from cdsjax.pipeline.catalog import resolve

    pipe = state.pipe
    if not body.question.strip():
        return state.error(400, "the question is empty")
    try:
        spec = resolve(body.selector or state.default_selector)  # the name resolved once; its spec goes down
        options = policy.check_http_options(spec, body.options)
    except PipelineError as err:
        return state.error(400, str(err))
    except ValueError as err:  # an option off the selector's HTTP allow-list, or of the wrong type or range
        return state.error(400, f"bad request: {err}")
    t0 = time.perf_counter()
    budget = body.budget or state.default_budget
    lane = state.compute if pipe.is_compiled(spec, budget, options) else state.compiling

    def retrieve():
        waited = time.perf_counter() - t0
        result = pipe.retrieve(body.question, selector=spec, budget=budget, options=options or None,
                               abstain=body.abstain)
        result.timings["queue"] = waited
        return result

    try:
        result = await lane.run(retrieve)
    except Busy as err:
        state.traffic.count("busy")
        return JSONResponse({"error": f"server busy: {err}; retry later"}, status_code=503,
                            headers={"Retry-After": "5"})
    except PipelineError as err:
        return state.error(400, str(err))
    except (ValueError, TypeError, OverflowError) as err:
        return state.error(400, f"bad request: {err}")
    read_options = state.read_options.updated(evidence_tokens=body.evidence_tokens)
    if read and pipe.reader is not None and body.stream:
        return StreamingResponse(stream_answer(state, result, body, read_options), media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    if read and pipe.reader is not None:
        try:
            await state.reading.run(pipe.read, result, read_options)
        except Busy as err:
            return state.error(503, f"server busy: {err}; retry later", result=public(state, result, body))
        if result.error is not None:  # the evidence is kept; Pipeline.read recorded why reading failed
            return state.error(502, f"reader: {result.error['message']}", error_kind=result.error["kind"],
                               result=public(state, result, body))
    return public(state, result, body)


class ReadCancelled(Exception):
    """The client of a streamed answer left: the reader's request is closed (the server stops generating)."""


def json_line(obj: dict) -> bytes:
    return (json.dumps(obj, default=float) + "\n").encode("utf-8")


async def stream_answer(state: ServerState, result, body: Question, read_options: ReadOptions):
    """``POST /ask`` with ``"stream": true``: JSON lines, one per piece, as the answer is written.

    ``{"event": "evidence", "result": ...}`` first (the ``ask --json`` object, without the answer yet), then
    ``{"event": "token", "text": ...}`` per piece of the answer, ``{"event": "retry", "reason": ...}`` when a
    reply was no answer and is asked again (drop the text shown so far), and last ``{"event": "done",
    "result": ...}`` (the whole object) or ``{"event": "error", "status": ..., "error": ..., "result": ...}``.
    A client that leaves closes the reader's request."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    left = threading.Event()

    def put(event: dict) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, event)

    def token(piece: str) -> None:
        if left.is_set():
            raise ReadCancelled()
        put({"event": "token", "text": piece})

    def read():
        return state.pipe.read(result, read_options, on_token=token,
                               on_retry=lambda reason: put({"event": "retry", "reason": reason}))

    yield json_line({"event": "evidence", "result": public(state, result, body)})
    task = asyncio.ensure_future(state.reading.run(read))
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                yield json_line(getter.result())
                continue
            getter.cancel()
            while not queue.empty():
                yield json_line(queue.get_nowait())
            break
        try:
            task.result()
        except Busy as err:
            yield json_line({"event": "error", "status": 503, "error": f"server busy: {err}; retry later",
                             "result": public(state, result, body)})
            return
        final = public(state, result, body)
        if result.error is not None:
            yield json_line({"event": "error", "status": 502, "error": f"reader: {final['error']['message']}",
                             "result": final})
        else:
            yield json_line({"event": "done", "result": final})
    finally:
        left.set()  # a client that left: the next piece closes the reader's request
        if not task.done():
            task.cancel()


async def ask(request: Request, body: Question):
    return await answer(state_of(request), body, read=True)


async def select(request: Request, body: Question):
    return await answer(state_of(request), body, read=False)


def create_app(state: ServerState, on_ready: Optional[Callable[[], None]] = None) -> Guard:
    """The ASGI application: the routes above, behind the guard; ``on_ready`` is called at start-up (before
    the socket accepts connections)."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if on_ready is not None:
            on_ready()
        yield

    # no /docs, /redoc or /openapi.json: the Swagger page would load third-party scripts into this origin
    app = FastAPI(title="cdsjax", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal)
    for path, handler, method in (("/health", health, "GET"), ("/", page, "GET"), ("/pdf", pdf, "GET"),
                                  ("/crop", crop, "GET"), ("/documents", list_documents, "GET"),
                                  ("/ask", ask, "POST"), ("/select", select, "POST")):
        app.add_api_route(path, handler, methods=[method])
    return Guard(app, state.limits, state.traffic)

"""``cdsjax serve INDEX... [--host 127.0.0.1] [--port 8765]``: a local HTTP JSON API that stays warm.

One process loads the indexes, the question encoder and the compiled selectors once, then answers
questions in milliseconds instead of paying start-up, model loading and compilation per command.

Endpoints (JSON in and out):

    GET  /health     -> 200 {"status": "ok", "documents", "notes", "default_selector", "reader",
                             "queue": {"in_flight", "limit"}, "uptime_s"}
    GET  /documents  -> 200 {"documents": [{"document", "pages", "notes", "kinds": {kind: count}}],
                             "indexes": [dir, ...]}
    POST /ask        {"question": str, "selector"?: str, "budget"?: int, "options"?: {..}}
                     -> 200 the `cdsjax ask --json` object (read by the reader when one is configured)
    POST /select     same body -> the same object without reading ("answer": null)
                     (either: "near_duplicates": t adds {"near_duplicates": {"threshold": t, "pairs":
                     [[rank_i, rank_j, cosine], ...]}}, the pairs of evidence notes with cosine >= t)
    GET  /           the web page (cdsjax/commands/page.py): one question, two selectors side by side
                     (default cosine and the server's default), notes both chose on one row, notes only one
                     chose and near-duplicates within a list marked, each note linked to its PDF page;
                     /?q=...&a=...&b=...&budget=...&threshold=... asks on load (selector= is b)
    GET  /crop?note=NOTE_ID  -> the PNG crop of a visual note of the index
    GET  /pdf?document=DOC_ID  -> the source PDF of a document of the loaded indexes (by id, never by path;
                     404 for any other id, or when the file is gone or changed since indexing)

Bad requests get a 4xx with {"error": message}; a reader failure a 502 with the selected evidence and
{"error": message, "error_kind": kind}. At most ``--queue`` requests are admitted at once (running or
waiting); beyond that the server answers 503 {"error": ...} with a Retry-After header at once rather
than letting clients pile up. Selection runs on one worker thread (JAX already uses the cores);
reading runs on a small pool, so slow reader calls do not hold up selection.

It binds to 127.0.0.1 unless ``--host`` says otherwise. ``cdsjax ask --server URL "question"`` is the
command-line client.
"""

# no `from __future__ import annotations`: FastAPI reads the request model from real annotations
import os
import sys
import time
from typing import Optional

from cdsjax.commands import CLIError

MAX_BUDGET = 512
MAX_QUESTION_CHARS = 4000


def add_arguments(p) -> None:
    p.add_argument("indexes", nargs="+", metavar="INDEX", help="index directories or PDF files")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0 picks a free one)")
    p.add_argument("--queue", type=int, default=32,
                   help="most requests admitted at once, running or waiting; more get 503 (default: 32)")
    p.add_argument("--selector", default="cds-converged",
                   help="selector when a request names none (default: cds-converged)")
    p.add_argument("--budget", type=int, default=10, help="budget when a request gives none (default: 10)")
    p.add_argument("--reader-url", default=None, help="OpenAI-compatible base URL (env CDSJAX_READER_URL)")
    p.add_argument("--reader-model", default=None, help="reader model name (env CDSJAX_READER_MODEL)")
    p.add_argument("--timeout", type=float, default=300.0, help="reader timeout per request, seconds")
    p.add_argument("--retries", type=int, default=3, help="reader retries on transient errors (default: 3)")
    p.add_argument("--read-workers", type=int, default=4, help="reader calls in flight at once (default: 4)")
    p.set_defaults(no_read=False)


def create_app(pipe, *, queue: int = 32, default_selector: str = "cds-converged", default_budget: int = 10,
               read_workers: int = 4, on_ready=None):
    """The FastAPI application around a loaded :class:`cdsjax.pipeline.Pipeline`.

    Args:
      pipe: the pipeline (its ``reader`` answers /ask when set).
      queue: most requests admitted at once (running or waiting); more get 503.
      default_selector, default_budget: used when a request leaves them out.
      read_workers: reader calls in flight at once.
      on_ready: called at application start-up (before the socket accepts connections).
    """
    import asyncio
    import contextlib
    from concurrent.futures import ThreadPoolExecutor
    from typing import Any, Dict

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
    from pydantic import BaseModel, ConfigDict, Field
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from cdsjax.pipeline import PipelineError, canonical_selector

    if queue < 1:
        raise ValueError(f"queue must be >= 1, got {queue}")
    compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdsjax-select")
    reading = ThreadPoolExecutor(max_workers=max(1, read_workers), thread_name_prefix="cdsjax-read")
    state = dict(in_flight=0, started=time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if on_ready is not None:
            on_ready()
        yield
        compute.shutdown(wait=False, cancel_futures=True)
        reading.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="cdsjax", lifespan=lifespan)

    class Question(BaseModel):
        model_config = ConfigDict(extra="forbid")
        question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
        selector: Optional[str] = None
        budget: Optional[int] = Field(default=None, ge=1, le=MAX_BUDGET)
        options: Dict[str, Any] = Field(default_factory=dict)
        near_duplicates: Optional[float] = Field(default=None, ge=-1.0, le=1.0)

    def error(status: int, message: str, **extra) -> JSONResponse:
        return JSONResponse({"error": message, **extra}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        parts = []
        for e in exc.errors():
            where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
            parts.append(f"{where}: {e.get('msg')}")
        return error(422, "bad request: " + "; ".join(parts))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        return error(500, f"internal error: {type(exc).__name__}: {exc}")

    def documents():
        rows: Dict[str, dict] = {}
        for note in pipe.corpus.notes:
            doc = str(note.get("doc_id"))
            row = rows.setdefault(doc, dict(document=doc, pages=0, notes=0, kinds={}))
            row["notes"] += 1
            row["pages"] = max(row["pages"], int(note.get("page", 0)) + 1)
            kind = note.get("kind", "text")
            row["kinds"][kind] = row["kinds"].get(kind, 0) + 1
        return list(rows.values())

    document_rows = documents()

    @app.get("/health")
    async def health():
        reader = pipe.reader
        return dict(status="ok", documents=len(document_rows), notes=len(pipe.corpus),
                    default_selector=default_selector, default_budget=default_budget,
                    reader=getattr(getattr(reader, "config", None), "model", None) if reader else None,
                    queue=dict(in_flight=state["in_flight"], limit=queue),
                    uptime_s=round(time.time() - state["started"], 3))

    crops = {str(n.get("note_id")): n["image_path"] for n in pipe.corpus.notes if n.get("image_path")}
    from cdsjax.commands import page as web
    from cdsjax.core.registry import SPECS

    page_html = web.render(default_selector=default_selector, default_budget=default_budget,
                           selector_displays=[s.display for s in SPECS.values()])
    pdfs = web.PdfFiles(pipe.corpus.roots)

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return HTMLResponse(page_html)

    @app.get("/pdf")
    async def pdf(document: str):
        # only the PDFs the loaded indexes list, by document id: never a path from the request
        path = pdfs.path(document)
        if path is None:
            why = "is not in the loaded indexes" if document not in pdfs else "is missing or changed on disk"
            return error(404, f"no PDF for document {document!r}: it {why}")
        return FileResponse(path, media_type="application/pdf")

    @app.get("/crop")
    async def crop(note: str):
        # only files the index lists: a note id is looked up, never used as a path
        path = crops.get(note)
        if path is None:
            return error(404, f"no crop for note {note!r}")
        if not os.path.isfile(path):
            return error(404, f"the crop of note {note!r} is missing from the index ({path})")
        return FileResponse(path, media_type="image/png")

    @app.get("/documents")
    async def list_documents():
        return {"documents": document_rows, "indexes": list(pipe.corpus.roots)}

    def reply(result, body: Question) -> dict:
        out = result.to_dict()
        if body.near_duplicates is not None:  # for the web page: pairs within the list, no embeddings sent
            out["near_duplicates"] = web.near_duplicates(pipe, out["evidence"], body.near_duplicates)
        return out

    async def answer(body: Question, read: bool):
        if not body.question.strip():
            return error(400, "the question is empty")
        try:
            selector = canonical_selector(body.selector or default_selector)
        except PipelineError as err:
            return error(400, str(err))
        if state["in_flight"] >= queue:
            return JSONResponse({"error": f"server busy: {state['in_flight']} requests in flight (limit {queue}); "
                                          "retry later"}, status_code=503, headers={"Retry-After": "1"})
        state["in_flight"] += 1
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            def retrieve():
                waited = time.perf_counter() - t0
                result = pipe.retrieve(body.question, selector=selector, budget=body.budget or default_budget,
                                       options=body.options or None)
                result.timings["queue"] = waited
                return result

            try:
                result = await loop.run_in_executor(compute, retrieve)
            except PipelineError as err:
                return error(400, str(err))
            except (ValueError, TypeError) as err:
                return error(400, f"bad request: {err}")
            if read and pipe.reader is not None:
                await loop.run_in_executor(reading, pipe.read, result)
                if result.error is not None:  # the evidence is kept; Pipeline.read recorded why reading failed
                    return error(502, f"reader: {result.error['message']}", error_kind=result.error["kind"],
                                 result=reply(result, body))
            return reply(result, body)
        finally:
            state["in_flight"] -= 1

    @app.post("/ask")
    async def ask(body: Question):
        return await answer(body, read=True)

    @app.post("/select")
    async def select(body: Question):
        return await answer(body, read=False)

    return app


def run(args) -> int:
    import socket

    from cdsjax.commands.ask import make_reader
    from cdsjax.pipeline import Pipeline, PipelineError, canonical_selector, enable_compilation_cache

    if args.queue < 1:
        raise CLIError(f"--queue must be >= 1, got {args.queue}")
    if not 1 <= args.budget <= MAX_BUDGET:
        raise CLIError(f"--budget must be in 1..{MAX_BUDGET}, got {args.budget}")
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as err:
        raise CLIError(f"serving needs fastapi and uvicorn (pip install 'cdsjax[io]'): {err}", 1) from None
    try:
        canonical_selector(args.selector)
    except PipelineError as err:
        raise CLIError(str(err), 2) from None
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as err:
        sock.close()
        raise CLIError(f"cannot listen on {args.host}:{args.port} ({err.strerror or err})", 1) from None
    enable_compilation_cache()
    t0 = time.perf_counter()
    try:
        pipe = Pipeline.from_paths(args.indexes, reader=make_reader(args), progress=sys.stderr.isatty())
        warm_s = pipe.warm([args.selector], budget=args.budget)
    except PipelineError as err:
        sock.close()
        raise CLIError(str(err), 1) from None
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def ready():
        print(f"cdsjax serve: listening on {url} — {len(pipe.corpus)} notes from {len(pipe.corpus.roots)} "
              f"index(es), ready in {time.perf_counter() - t0:.1f}s (warm-up {warm_s:.1f}s); Ctrl-C stops",
              flush=True)
        if host not in ("127.0.0.1", "::1", "localhost"):
            print(f"cdsjax serve: warning: bound to {host}, reachable from other machines; there is no "
                  "authentication", file=sys.stderr, flush=True)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started:  # listening now: tell the user (and scripts waiting for this line)
                ready()

    app = create_app(pipe, queue=args.queue, default_selector=args.selector, default_budget=args.budget,
                     read_workers=args.read_workers)
    Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])
    return 0

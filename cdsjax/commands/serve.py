"""``cdsjax serve INDEX... [--host 127.0.0.1] [--port 8765]``: a local HTTP JSON API that stays warm.

One process loads the indexes, the question encoder and the compiled selectors once, then answers
questions in milliseconds instead of paying start-up, model loading and compilation per command.

Endpoints (JSON in and out):

    GET  /health     -> 200 {"status": "ok", "documents", "notes", "default_selector", "reader",
                             "queue": {"in_flight", "limit"}, "compute": {"running", "abandoned", "compiled",
                             "compiled_limit"}, "refused": {kind: count}, "uptime_s"}
    GET  /documents  -> 200 {"documents": [{"document", "pages", "notes", "kinds": {kind: count}}],
                             "indexes": [index directory name, ...]}
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
{"error": message, "error_kind": kind}. Answers and errors carry no server path (an evidence item's
``image_path`` is relative to its index).

What keeps it safe to expose (:mod:`cdsjax.commands.guard`; README, "Security"): a Host-header check and an
optional bearer token (``--token`` / CDSJAX_TOKEN, required beyond loopback unless ``--no-auth``); at most
``--queue`` question requests admitted at once from their first byte (503 with Retry-After beyond); bodies
over ``--max-body`` refused with 413 before they are read; options on a per-selector allow-list with
bounds (:data:`HTTP_OPTIONS`); a deadline (``--request-timeout``) after which the client gets 504 and its
slot back, the computation being abandoned on its daemon thread; at most ``--max-compiled`` compiled
selectors. Selection runs on a worker thread (JAX already uses the cores), selections that compile a new
selector on a second one; reading runs on a small pool, so slow reader calls do not hold up selection.

It binds to 127.0.0.1 unless ``--host`` says otherwise. ``cdsjax ask --server URL "question"`` is the
command-line client.
"""

# no `from __future__ import annotations`: FastAPI reads the request model from real annotations
import math
import os
import sys
import time
from typing import Optional

from cdsjax.commands import CLIError, add_selector_argument

MAX_BUDGET = 512
MAX_QUESTION_CHARS = 4000
DEFAULT_MAX_BODY = 64 * 1024
DEFAULT_REQUEST_TIMEOUT = 30.0

# The options an HTTP request may set, by name, with their types and, for those that set how much work a
# request costs, the HTTP policy's bounds (tighter than SolveOptions' own hard limits, which every caller
# gets: a request's solve stays within seconds on a few thousand notes). A selector accepts those of them
# its registry spec declares (SelectorSpec.options); everything else (solver, warm_start, params, the
# affinity's shape fields, ...) is refused with 400.
HTTP_MAX_ITER = 20_000  # twice paper mode's 10,000 steps
HTTP_MIN_TOL = 1e-12
HTTP_MAX_SUPPORT_STEPS = 40  # twice cds-support's default bisection
HTTP_OPTIONS = dict(
    beta=(float,), tau=(float,), threshold=(float,), init=(str,), prior_temperature=(float,), fill=(bool,),
    peel=(bool,), lam=(float,), theta=(float,), quality=(str,), damping=(float,), temperature=(float,),
    tol=(float, HTTP_MIN_TOL, 1.0), max_iter=(int, 1, HTTP_MAX_ITER), num_steps=(int, 1, HTTP_MAX_SUPPORT_STEPS),
)


def check_http_options(selector: str, options: dict) -> dict:
    """The request's options if every one is on the selector's allow-list with the right type.

    Args:
      selector: a registry name (``cds_converged``).
      options: the request's ``options`` object.

    Raises:
      ValueError: one line naming the option.
    """
    from cdsjax.core.registry import selector_spec

    allowed = {name: HTTP_OPTIONS[name] for name in selector_spec(selector).options if name in HTTP_OPTIONS}
    for name, value in options.items():
        if name not in allowed:
            raise ValueError(f"option {name!r} is not accepted for selector {selector!r} over HTTP; "
                             f"accepted: {sorted(allowed) or 'none'}")
        kind, *bounds = allowed[name]
        ok = (isinstance(value, bool) if kind is bool else isinstance(value, str) and len(value) <= 40
              if kind is str else isinstance(value, int) and not isinstance(value, bool) if kind is int else
              isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))
        if not ok:
            raise ValueError(f"option {name!r} must be a {'finite number' if kind is float else kind.__name__}, "
                             f"got {value!r}"[:200])
        if bounds and not bounds[0] <= value <= bounds[1]:
            raise ValueError(f"option {name!r} must be in [{bounds[0]:g}, {bounds[1]:g}] over HTTP, got {value!r}")
    return dict(options)


def add_arguments(p) -> None:
    p.add_argument("indexes", nargs="+", metavar="INDEX", help="index directories or PDF files")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: 127.0.0.1, this machine only); any other address needs "
                   "--token (or --no-auth) and, for a wildcard such as 0.0.0.0, --allowed-host")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0 picks a free one)")
    p.add_argument("--queue", type=int, default=32,
                   help="most question requests admitted at once, uploading, waiting or running; more get 503 "
                   "(default: 32)")
    p.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT, metavar="SECONDS",
                   help="a question request that has not answered after this long gets 504 and frees its slot; "
                   "/ask adds the reader's --timeout (default: 30)")
    p.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY, metavar="BYTES",
                   help="largest request body; larger ones get 413 before they are read (default: 65536)")
    p.add_argument("--max-compiled", type=int, default=16, metavar="N",
                   help="compiled selectors kept (one per selector, budget and options; least recently used "
                   "dropped first, default: 16)")
    p.add_argument("--token", default=None,
                   help="bearer token every request must carry (env CDSJAX_TOKEN); required with a --host "
                   "beyond loopback unless --no-auth")
    p.add_argument("--no-auth", action="store_true",
                   help="serve beyond loopback without a token (anyone who reaches the port reads the index)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name clients use to reach the server (repeatable; '*' accepts any); "
                   "loopback names are always accepted")
    p.add_argument("--embedder", action="append", default=[], metavar="MODEL",
                   help="accept indexes embedded with MODEL (a hub id or a local directory) besides the shipped "
                   "MiniLM and the documented presets; repeatable")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let the embedding model run its own Python code (needed by nomic-embed); never taken "
                   "from an index")
    add_selector_argument(p, "selector when a request names none")
    p.add_argument("--budget", type=int, default=10, help="budget when a request gives none (default: 10)")
    p.add_argument("--params", default=None, metavar="FILE",
                   help="parameters of the learned CDS selector (cdsjax tune; default: the shipped file)")
    p.add_argument("--reader-url", default=None, help="OpenAI-compatible base URL (env CDSJAX_READER_URL)")
    p.add_argument("--reader-model", default=None, help="reader model name (env CDSJAX_READER_MODEL)")
    p.add_argument("--timeout", type=float, default=300.0, help="reader timeout per request, seconds")
    p.add_argument("--retries", type=int, default=3, help="reader retries on transient errors (default: 3)")
    p.add_argument("--read-workers", type=int, default=4, help="reader calls in flight at once (default: 4)")
    p.set_defaults(no_read=False)


def public_path(path: Optional[str], roots) -> Optional[str]:
    """``path`` relative to the index root that holds it (``crops/...``), so no server path leaves the server."""
    if not path:
        return path
    for root in roots:
        prefix = str(root).rstrip(os.sep) + os.sep
        if str(path).startswith(prefix):
            return str(path)[len(prefix):]
    return os.path.basename(str(path))


def scrub(message: str, roots) -> str:
    """``message`` with the server's index directories and home directory replaced by short names."""
    for root in sorted((str(r) for r in roots), key=len, reverse=True):
        message = message.replace(root, f"<index {os.path.basename(root.rstrip(os.sep))}>")
    home = os.path.expanduser("~")
    return message.replace(home, "~") if home not in ("", "/") else message


def read_crop(path: str, roots, expected_sha: Optional[str]) -> Optional[bytes]:
    """The bytes of a crop if it is still a regular file inside one of ``roots`` with its recorded sha256.

    Opened without following a final symlink, then checked by its real path, so a crop swapped for a link
    after loading is refused; None for anything else.
    """
    import hashlib

    real = os.path.realpath(path)
    if not any(os.path.commonpath([real, os.path.realpath(r)]) == os.path.realpath(r) for r in roots):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb") as f:
            fd = None
            data = f.read()
    finally:
        if fd is not None:
            os.close(fd)
    if expected_sha is None or hashlib.sha256(data).hexdigest() != expected_sha:
        return None
    return data


def create_app(pipe, *, queue: int = 32, default_selector: Optional[str] = None, default_budget: int = 10,
               read_workers: int = 4, on_ready=None, limits=None):
    """The ASGI application around a loaded :class:`cdsjax.pipeline.Pipeline`: FastAPI behind the guard.

    Args:
      pipe: the pipeline (its ``reader`` answers /ask when set).
      queue: most question requests admitted at once; more get 503 (``limits.queue`` when limits are given).
      default_selector, default_budget: used when a request leaves them out (selector: None for the
        registry's default).
      read_workers: reader calls in flight at once.
      on_ready: called at application start-up (before the socket accepts connections).
      limits: a :class:`cdsjax.commands.guard.Limits` (host names, token, body size, deadline); default:
        loopback names only, no token, 64 KiB bodies, 30 s.
    """
    import contextlib
    from typing import Any, Dict

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
    from pydantic import BaseModel, ConfigDict, Field
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from cdsjax.commands.guard import Busy, Guard, Lane, Limits
    from cdsjax.pipeline import DEFAULT_SELECTOR, PipelineError, canonical_selector, prune_compilation_cache

    default_selector = default_selector or DEFAULT_SELECTOR
    if limits is None:
        limits = Limits(queue=queue)
    if limits.queue < 1:
        raise ValueError(f"queue must be >= 1, got {limits.queue}")
    # selections whose selector is compiled run on one lane; those that compile one (seconds, and a new
    # option value always does) on another, so a client asking for new compilations cannot hold up the rest
    compute = Lane("select", concurrency=1, max_abandoned=2)
    compiling = Lane("compile", concurrency=1, max_abandoned=2)
    reading = Lane("read", concurrency=max(1, read_workers), max_abandoned=max(1, read_workers))
    state: Dict[str, Any] = dict(in_flight=0, started=time.time(), refused={})
    roots = list(pipe.corpus.roots)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if on_ready is not None:
            on_ready()
        yield

    # no /docs, /redoc or /openapi.json: the Swagger page would load third-party scripts into this origin
    app = FastAPI(title="cdsjax", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    class Question(BaseModel):
        model_config = ConfigDict(extra="forbid")
        question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
        selector: Optional[str] = None
        budget: Optional[int] = Field(default=None, ge=1, le=MAX_BUDGET)
        options: Dict[str, Any] = Field(default_factory=dict)
        near_duplicates: Optional[float] = Field(default=None, ge=-1.0, le=1.0)

    def error(status: int, message: str, **extra) -> JSONResponse:
        return JSONResponse({"error": scrub(message, roots), **extra}, status_code=status)

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
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)  # the server's log only
        return error(500, f"internal error ({type(exc).__name__}); the server's log has the details")

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
                    queue=dict(in_flight=state["in_flight"], limit=limits.queue),
                    compute=dict(running=compute.running() + compiling.running(),
                                 abandoned=compute.abandoned + compiling.abandoned,
                                 compiled=len(pipe.compiled), compiled_limit=getattr(pipe.compiled, "maxsize", None)),
                    refused=dict(state["refused"]),
                    uptime_s=round(time.time() - state["started"], 3))

    # a note id is looked up, never used as a path; the path and its hash were checked when the index loaded
    crops = {str(n.get("note_id")): (n["image_path"], n.get("image_sha256"))
             for n in pipe.corpus.notes if n.get("image_path")}
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
        found = crops.get(note)
        data = read_crop(found[0], roots, found[1]) if found is not None else None
        if data is None:
            return error(404, f"no crop for note {note[:200]!r}")
        return Response(data, media_type="image/png")

    @app.get("/documents")
    async def list_documents():
        return {"documents": document_rows, "indexes": [os.path.basename(str(r).rstrip(os.sep)) for r in roots]}

    def public(result, body: Question) -> dict:
        out = result.to_dict()
        if body.near_duplicates is not None:  # for the web page: pairs within the list, no embeddings sent
            out["near_duplicates"] = web.near_duplicates(pipe, out["evidence"], body.near_duplicates)
        for e in out.get("evidence", []):
            e["image_path"] = public_path(e.get("image_path"), roots)
        if out.get("error"):
            out["error"] = {k: scrub(v, roots) if isinstance(v, str) else v for k, v in out["error"].items()}
        return out

    async def answer(body: Question, read: bool):
        if not body.question.strip():
            return error(400, "the question is empty")
        try:
            selector = canonical_selector(body.selector or default_selector)
            options = check_http_options(selector, body.options)
        except PipelineError as err:
            return error(400, str(err))
        except ValueError as err:  # an option the selector's HTTP policy refuses (cds-learned's params are the server's)
            return error(400, f"bad request: {err}")
        t0 = time.perf_counter()
        budget = body.budget or default_budget
        lane = compute if pipe.is_compiled(selector, budget, options) else compiling

        def retrieve():
            waited = time.perf_counter() - t0
            result = pipe.retrieve(body.question, selector=selector, budget=budget, options=options or None)
            result.timings["queue"] = waited
            if lane is compiling:  # a new executable may have gone to the compilation cache: keep it capped
                prune_compilation_cache()
            return result

        try:
            result = await lane.run(retrieve)
        except Busy as err:
            state["refused"]["busy"] = state["refused"].get("busy", 0) + 1
            return JSONResponse({"error": f"server busy: {err}; retry later"}, status_code=503,
                                headers={"Retry-After": "5"})
        except PipelineError as err:
            return error(400, str(err))
        except (ValueError, TypeError) as err:
            return error(400, f"bad request: {err}")
        if read and pipe.reader is not None:
            try:
                await reading.run(pipe.read, result)
            except Busy as err:
                return error(503, f"server busy: {err}; retry later", result=public(result, body))
            if result.error is not None:  # the evidence is kept; Pipeline.read recorded why reading failed
                return error(502, f"reader: {result.error['message']}", error_kind=result.error["kind"],
                             result=public(result, body))
        return public(result, body)

    @app.post("/ask")
    async def ask(body: Question):
        return await answer(body, read=True)

    @app.post("/select")
    async def select(body: Question):
        return await answer(body, read=False)

    guarded = Guard(app, limits, state)
    guarded.lanes = (compute, compiling, reading)
    return guarded


def host_limits(args) -> tuple:
    """``(allowed host names or None for any, token or None)`` from the flags, or a CLIError saying what is
    missing: a bind beyond loopback needs a token (or --no-auth), a wildcard bind needs --allowed-host."""
    from cdsjax.commands.guard import LOOPBACK_NAMES, is_loopback

    token = args.token or os.environ.get("CDSJAX_TOKEN") or None
    loopback = is_loopback(args.host)
    if not loopback and token is None and not args.no_auth:
        raise CLIError(f"--host {args.host} is reachable from other machines: give --token (or set CDSJAX_TOKEN), "
                       "or --no-auth to serve without one", 2)
    names = {h.strip().lower() for h in args.allowed_host if h.strip()}
    if "*" in names:
        return None, token
    bound = args.host.lower()
    if not loopback and bound not in ("0.0.0.0", "::", ""):
        names.add(f"[{bound}]" if ":" in bound else bound)
    elif not loopback and not names:
        raise CLIError(f"--host {args.host} listens on every address: name the host clients use with "
                       "--allowed-host NAME (or --allowed-host '*' to accept any)", 2)
    return frozenset(LOOPBACK_NAMES | names), token


def run(args) -> int:
    import socket

    from cdsjax.commands.ask import make_reader
    from cdsjax.commands.guard import Limits
    from cdsjax.io.embed import EmbedderError
    from cdsjax.pipeline import DEFAULT_SELECTOR, Pipeline, PipelineError, canonical_selector, enable_compilation_cache
    args.selector = args.selector or DEFAULT_SELECTOR
    if args.queue < 1:
        raise CLIError(f"--queue must be >= 1, got {args.queue}")
    if not 1 <= args.budget <= MAX_BUDGET:
        raise CLIError(f"--budget must be in 1..{MAX_BUDGET}, got {args.budget}")
    if not args.request_timeout > 0:
        raise CLIError(f"--request-timeout must be > 0, got {args.request_timeout}")
    if args.max_body < 1024:
        raise CLIError(f"--max-body must be >= 1024 bytes, got {args.max_body}")
    if args.max_compiled < 1:
        raise CLIError(f"--max-compiled must be >= 1, got {args.max_compiled}")
    allowed_hosts, token = host_limits(args)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as err:
        raise CLIError(f"serving needs fastapi and uvicorn (pip install 'cdsjax[io]'): {err}", 1) from None
    try:
        canonical_selector(args.selector)
    except PipelineError as err:
        raise CLIError(str(err), 2) from None
    params = None
    if getattr(args, "params", None) is not None:  # read once, here; the pipeline gets the value
        from cdsjax.learn.params_io import resolve_params

        try:
            params = resolve_params(args.params)
        except ValueError as err:
            raise CLIError(str(err), 1) from None
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as err:
        sock.close()
        raise CLIError(f"cannot listen on {args.host}:{args.port} ({err.strerror or err})", 1) from None
    enable_compilation_cache()
    t0 = time.perf_counter()
    reader = make_reader(args)
    try:
        pipe = Pipeline.from_paths(args.indexes, reader=reader, progress=sys.stderr.isatty(),
                                   embedders=args.embedder, trust_remote_code=args.trust_remote_code,
                                   max_compiled=args.max_compiled, params=params)
        warm_s = pipe.warm([args.selector], budget=args.budget)
    except (PipelineError, EmbedderError) as err:
        sock.close()
        raise CLIError(str(err), 1) from None
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def ready():
        print(f"cdsjax serve: listening on {url} — {len(pipe.corpus)} notes from {len(pipe.corpus.roots)} "
              f"index(es), ready in {time.perf_counter() - t0:.1f}s (warm-up {warm_s:.1f}s); Ctrl-C stops",
              flush=True)
        if allowed_hosts is None or host not in ("127.0.0.1", "::1", "localhost"):
            auth = "a token is required" if token else "there is NO authentication (--no-auth)"
            print(f"cdsjax serve: warning: bound to {host}, reachable from other machines; {auth}",
                  file=sys.stderr, flush=True)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started:  # listening now: tell the user (and scripts waiting for this line)
                ready()

    read_timeout = args.timeout if reader is not None else 0.0
    limits = Limits(queue=args.queue, max_body=args.max_body, request_timeout=args.request_timeout,
                    read_timeout=read_timeout, allowed_hosts=allowed_hosts, token=token)
    app = create_app(pipe, default_selector=args.selector, default_budget=args.budget,
                     read_workers=args.read_workers, limits=limits)
    # SIGTERM / Ctrl-C: requests still running after 2 s are cancelled (their jobs abandoned, see guard.Lane)
    Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                          h11_max_incomplete_event_size=16 * 1024)).run(sockets=[sock])
    if any(lane.running() for lane in app.lanes):
        # a job still computing holds a daemon thread inside JAX: leave without finalising the interpreter
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0

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
    GET  /           a small web page: ask a question, see the answer and the evidence (crops, scores,
                     document, page); /?q=...&selector=...&budget=... asks on load
    GET  /crop?note=NOTE_ID  -> the PNG crop of a visual note of the index

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

from cdsjax.commands import CLIError, add_selector_argument

MAX_BUDGET = 512
MAX_QUESTION_CHARS = 4000


def add_arguments(p) -> None:
    p.add_argument("indexes", nargs="+", metavar="INDEX", help="index directories or PDF files")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0 picks a free one)")
    p.add_argument("--queue", type=int, default=32,
                   help="most requests admitted at once, running or waiting; more get 503 (default: 32)")
    add_selector_argument(p, "selector when a request names none")
    p.add_argument("--budget", type=int, default=10, help="budget when a request gives none (default: 10)")
    p.add_argument("--reader-url", default=None, help="OpenAI-compatible base URL (env CDSJAX_READER_URL)")
    p.add_argument("--reader-model", default=None, help="reader model name (env CDSJAX_READER_MODEL)")
    p.add_argument("--timeout", type=float, default=300.0, help="reader timeout per request, seconds")
    p.add_argument("--retries", type=int, default=3, help="reader retries on transient errors (default: 3)")
    p.add_argument("--read-workers", type=int, default=4, help="reader calls in flight at once (default: 4)")
    p.set_defaults(no_read=False)


def create_app(pipe, *, queue: int = 32, default_selector: Optional[str] = None, default_budget: int = 10,
               read_workers: int = 4, on_ready=None):
    """The FastAPI application around a loaded :class:`cdsjax.pipeline.Pipeline`.

    Args:
      pipe: the pipeline (its ``reader`` answers /ask when set).
      queue: most requests admitted at once (running or waiting); more get 503.
      default_selector, default_budget: used when a request leaves them out (selector: None for the
        registry's default).
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

    from cdsjax.pipeline import DEFAULT_SELECTOR, PipelineError, canonical_selector

    default_selector = default_selector or DEFAULT_SELECTOR
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
    from cdsjax.core.registry import SPECS

    selector_options = "".join(f'<option value="{s.display}">{s.display}</option>' for s in SPECS.values())

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return HTMLResponse(PAGE.replace("__DEFAULT_SELECTOR__", default_selector)
                            .replace("__SELECTOR_OPTIONS__", selector_options)
                            .replace("__DEFAULT_BUDGET__", str(default_budget)))

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
                                 result=result.to_dict())
            return result.to_dict()
        finally:
            state["in_flight"] -= 1

    @app.post("/ask")
    async def ask(body: Question):
        return await answer(body, read=True)

    @app.post("/select")
    async def select(body: Question):
        return await answer(body, read=False)

    return app


PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cdsjax</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 60rem; padding: 0 1rem; color: #222; }
 form { display: flex; gap: .5rem; flex-wrap: wrap; } input[name=q] { flex: 1 1 24rem; padding: .45rem; }
 select, input, button { font: inherit; padding: .4rem; } .muted { color: #666; font-size: 13px; }
 .warn { color: #8a4b00; } .err { color: #a00; } #answer { margin: 1rem 0; white-space: pre-wrap; }
 table { border-collapse: collapse; width: 100%; margin-top: .5rem; } td, th { border-top: 1px solid #ddd;
 padding: .4rem; vertical-align: top; text-align: left; } td.n { text-align: right; white-space: nowrap; }
 img { max-width: 22rem; max-height: 14rem; display: block; margin-top: .3rem; border: 1px solid #ccc; }
</style></head><body>
<h1>cdsjax</h1>
<form id="ask"><input name="q" placeholder="Ask a question of the indexed documents" required>
 <select name="selector">__SELECTOR_OPTIONS__</select>
 <input name="budget" type="number" min="1" max="512" value="__DEFAULT_BUDGET__" title="evidence budget">
 <button>Ask</button></form>
<p id="status" class="muted"></p><div id="answer"></div><div id="warnings" class="warn"></div>
<table id="evidence" hidden><thead><tr><th>#</th><th>score</th><th>document</th><th>page</th><th>kind</th>
<th>evidence</th></tr></thead><tbody></tbody></table>
<script>
const form = document.getElementById("ask"), status = document.getElementById("status");
form.selector.value = "__DEFAULT_SELECTOR__";
function cell(row, text, cls) { const td = row.insertCell(); td.textContent = text; if (cls) td.className = cls; return td; }
async function ask(q, selector, budget) {
  status.className = "muted"; status.textContent = "asking...";
  document.getElementById("answer").textContent = ""; document.getElementById("warnings").textContent = "";
  let reply, body;
  try {
    reply = await fetch("/ask", {method: "POST", headers: {"Content-Type": "application/json"},
                                 body: JSON.stringify({question: q, selector: selector, budget: budget})});
    body = await reply.json();
  } catch (e) { status.className = "err"; status.textContent = "cannot reach the server: " + e; return; }
  if (!reply.ok) { status.className = "err"; status.textContent = "error " + reply.status + ": " + body.error;
                   if (!body.result) return; body = Object.assign(body.result, {answer: null}); }
  const d = body.diagnostics || {};
  status.textContent = body.selector + (d.mode ? " (" + d.mode + " mode, " + (d.converged ? "converged" :
    "NOT converged") + ", KKT residual " + Number(d.kkt_residual).toExponential(1) + ", support " +
    d.support_size + " notes)" : "") + " · " + (1000 * body.timings.total).toFixed(0) + " ms";
  document.getElementById("answer").textContent = body.answer === null ? "" : "Answer: " + body.answer;
  document.getElementById("warnings").textContent = (body.warnings || []).join(" ");
  const table = document.getElementById("evidence"), tbody = table.tBodies[0];
  tbody.replaceChildren();
  for (const e of body.evidence) {
    const row = tbody.insertRow(); row.className = "evidence";
    cell(row, e.rank, "n"); cell(row, e.score.toFixed(4), "n"); cell(row, e.document);
    cell(row, e.page + 1, "n"); cell(row, e.kind);
    const td = cell(row, e.text.replace(/\s+/g, " ").slice(0, 400));
    if (e.image_path) { const img = document.createElement("img");
      img.src = "/crop?note=" + encodeURIComponent(e.note_id); img.alt = e.caption || e.kind; td.appendChild(img); }
  }
  table.hidden = false;
}
form.addEventListener("submit", ev => { ev.preventDefault();
  ask(form.q.value, form.selector.value, parseInt(form.budget.value, 10)); });
const params = new URLSearchParams(location.search);
if (params.get("q")) {
  form.q.value = params.get("q");
  if (params.get("selector")) form.selector.value = params.get("selector");
  if (params.get("budget")) form.budget.value = params.get("budget");
  ask(form.q.value, form.selector.value, parseInt(form.budget.value, 10));
}
</script></body></html>
"""


def run(args) -> int:
    import socket

    from cdsjax.commands.ask import make_reader
    from cdsjax.pipeline import DEFAULT_SELECTOR, Pipeline, PipelineError, canonical_selector, enable_compilation_cache

    args.selector = args.selector or DEFAULT_SELECTOR
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

"""``cdsjax serve INDEX... [--host 127.0.0.1] [--port 8765]``: a local HTTP JSON API that stays warm.

One process loads the indexes, the question encoder and the compiled selectors once, then answers
questions in milliseconds instead of paying start-up, model loading and compilation per command.

Endpoints (JSON in and out):

    GET  /health     -> 200 {"status": "ok", "documents", "notes", "default_selector", "reader",
                             "queue": {"in_flight", "limit"}, "uploads": {"in_progress", "limit"},
                             "compute": {"running", "abandoned", "compiled", "compiled_limit"},
                             "refused": {kind: count}, "uptime_s"}; it never waits
    GET  /documents  -> 200 {"documents": [{"document", "pages", "notes", "kinds": {kind: count}}],
                             "indexes": [index directory name, ...]}
    POST /ask        {"question": str, "selector"?: str, "budget"?: int, "options"?: {..},
                      "evidence_tokens"?: int (0..131072; the evidence the reader reads, 0: every note whole;
                      default: the server's --evidence-tokens)}
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
                     re-checked on every request; 404 for any other id, or when the file is gone, changed
                     since indexing, a link, or over ``--max-pdf-mb``)

Bad requests get a 4xx with a one-line {"error": message}; a reader failure a 502 with the selected evidence
and {"error": message, "error_kind": kind}. Answers and errors carry no server path (an evidence item's
``image_path`` is relative to its index).

What keeps it safe to expose (README, "Security"): :mod:`cdsjax.commands.guard` checks the whole Host header
and an optional bearer token (``--token`` / CDSJAX_TOKEN, required beyond loopback unless ``--no-auth``),
gives a request body ``--body-timeout`` seconds to arrive on one of ``--max-uploads`` upload slots (408
beyond; a new upload takes the slot of the oldest slow one), admits at most ``--queue`` question requests
whose body has arrived (503 with Retry-After beyond), refuses bodies over ``--max-body`` with 413 before they
are read, and answers 504 past the deadline (``--request-timeout``), the computation being abandoned on its
daemon thread; :mod:`cdsjax.commands.policy` holds the rules on request values (options on a per-selector
allow-list with strict types and bounds, host names, tokens, which files may be served). At most
``--max-compiled`` compiled selectors are kept. Selection runs on a worker thread (JAX already uses the
cores), selections that compile a new selector on a second one; reading runs on a small pool, so slow reader
calls do not hold up selection; PDFs and crops are read and hashed on worker threads too.
:mod:`cdsjax.commands.server` is the application itself.

It binds to 127.0.0.1 unless ``--host`` says otherwise; without a token every local user of the machine can
reach it, which it says at start (docs/serving.md). ``cdsjax ask --server URL "question"`` is the
command-line client.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from cdsjax.commands import CLIError, add_reader_arguments, add_relevance_argument, add_selector_argument
from cdsjax.commands.policy import DEFAULT_MAX_PDF_MB, LOOPBACK_NAMES, MAX_BUDGET, is_loopback, is_text
from cdsjax.defaults import DEFAULT_BUDGET

DEFAULT_MAX_BODY = 64 * 1024
DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_BODY_TIMEOUT = 5.0


def add_arguments(p) -> None:
    p.add_argument("indexes", nargs="+", metavar="INDEX", help="index directories or PDF files")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: 127.0.0.1, this machine only); any other address needs "
                   "--token (or --no-auth) and, for a wildcard such as 0.0.0.0, --allowed-host")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0 picks a free one)")
    p.add_argument("--queue", type=int, default=32,
                   help="most question requests admitted at once once their body has arrived, waiting or "
                   "running; more get 503 (default: 32)")
    p.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT, metavar="SECONDS",
                   help="a question request that has not answered after this long gets 504 and frees its slot; "
                   "/ask adds the reader's --timeout (default: 30)")
    p.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT, metavar="SECONDS",
                   help="a request body that has not fully arrived after this long gets 408 and frees its upload "
                   f"slot (default: {DEFAULT_BODY_TIMEOUT:g})")
    p.add_argument("--max-uploads", type=int, default=64, metavar="N",
                   help="most requests whose body is still arriving, apart from --queue; when all are taken a "
                   "new upload takes the slot of the oldest one slower than 1 s (default: 64)")
    p.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY, metavar="BYTES",
                   help="largest request body; larger ones get 413 before they are read (default: 65536)")
    p.add_argument("--max-pdf-mb", type=int, default=DEFAULT_MAX_PDF_MB, metavar="MB",
                   help="largest source PDF /pdf serves (each request reads and hashes it whole; "
                   f"default: {DEFAULT_MAX_PDF_MB})")
    p.add_argument("--max-compiled", type=int, default=16, metavar="N",
                   help="compiled selectors kept (one per selector, budget and options; least recently used "
                   "dropped first, default: 16)")
    p.add_argument("--token", default=None,
                   help="bearer token every request must carry; required with a --host beyond loopback unless "
                   "--no-auth. Prefer the environment variable CDSJAX_TOKEN: a --token value is visible to "
                   "every user of the machine in `ps`")
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
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET,
                   help=f"budget when a request gives none (default: {DEFAULT_BUDGET})")
    p.add_argument("--params", default=None, metavar="FILE",
                   help="parameters of the learned selectors (cdsjax tune; default: the shipped fit of each "
                   "selector's read-out)")
    add_relevance_argument(p)
    add_reader_arguments(p, slots=2)
    p.add_argument("--read-workers", type=int, default=4, help="reader calls in flight at once (default: 4)")
    p.set_defaults(no_read=False)


def host_limits(args) -> tuple:
    """``(allowed host names or None for any, token or None)`` from the flags, or a CLIError saying what is
    missing: a bind beyond loopback needs a token (or --no-auth), a wildcard bind needs --allowed-host."""
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


def check_flags(args) -> None:
    """A CLIError for the first flag out of range."""
    for flag, value, ok, rule in (
            ("--queue", args.queue, args.queue >= 1, ">= 1"),
            ("--budget", args.budget, 1 <= args.budget <= MAX_BUDGET, f"in 1..{MAX_BUDGET}"),
            ("--request-timeout", args.request_timeout, args.request_timeout > 0, "> 0"),
            ("--body-timeout", args.body_timeout, args.body_timeout > 0, "> 0"),
            ("--max-uploads", args.max_uploads, args.max_uploads >= 1, ">= 1"),
            ("--max-body", args.max_body, args.max_body >= 1024, ">= 1024 bytes"),
            ("--max-pdf-mb", args.max_pdf_mb, args.max_pdf_mb >= 1, ">= 1"),
            ("--max-compiled", args.max_compiled, args.max_compiled >= 1, ">= 1")):
        if not ok:
            raise CLIError(f"{flag} must be {rule}, got {value}")


def run(args) -> int:
    import socket

    from cdsjax.commands.reader_setup import make_reader
    from cdsjax.io.embed import EmbedderError
    from cdsjax.io.compilation_cache import enable_compilation_cache
    from cdsjax.pipeline import Pipeline, PipelineError
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, display, resolve

    args.selector = args.selector or display(DEFAULT_SELECTOR)
    check_flags(args)
    allowed_hosts, token = host_limits(args)
    if token is not None and not is_text(token):
        raise CLIError("the token (--token or CDSJAX_TOKEN) is not valid text in this locale", 2)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as err:
        raise CLIError(f"serving needs fastapi and uvicorn (pip install 'cdsjax[io]'): {err}", 1) from None
    from cdsjax.commands.guard import Limits
    from cdsjax.commands.reader_setup import read_options
    from cdsjax.commands.server import ServerState, create_app

    try:
        resolve(args.selector)
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
    compile_cache = enable_compilation_cache()
    t0 = time.perf_counter()
    # the local reader, held for the server's life (a shared one then stays up for its keep-alive)
    stack = contextlib.ExitStack()
    try:
        reader = make_reader(args, stack)
    except BaseException:
        sock.close()
        raise
    with stack:
        return _serve(args, sock, reader, params, compile_cache, t0, allowed_hosts, token)


def _serve(args, sock, reader, params, compile_cache, t0, allowed_hosts, token) -> int:
    import uvicorn

    from cdsjax.commands.guard import Limits
    from cdsjax.commands.reader_setup import read_options
    from cdsjax.commands.server import ServerState, create_app
    from cdsjax.io.embed import EmbedderError
    from cdsjax.pipeline import Pipeline, PipelineError

    try:
        options = read_options(args, reader)  # the reads' defaults; a request's evidence_tokens overrides them
    except CLIError:
        sock.close()
        raise
    try:
        pipe = Pipeline.from_paths(args.indexes, reader=reader, progress=sys.stderr.isatty(),
                                   embedders=args.embedder, trust_remote_code=args.trust_remote_code,
                                   max_compiled=args.max_compiled, params=params, compile_cache=compile_cache,
                                   relevance=args.relevance)
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
        elif token is None:  # loopback is not private: every account on this machine can connect to it
            reads = " and use its reader (/ask)" if reader is not None else ""
            print("cdsjax serve: warning: no token: every local user of this machine can read the loaded "
                  f"documents' text (/select, /documents){reads}; set CDSJAX_TOKEN to require one",
                  file=sys.stderr, flush=True)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started:  # listening now: tell the user (and scripts waiting for this line)
                ready()

    limits = Limits(queue=args.queue, max_body=args.max_body, request_timeout=args.request_timeout,
                    read_timeout=args.timeout if reader is not None else 0.0, allowed_hosts=allowed_hosts,
                    token=token, body_timeout=args.body_timeout, uploads=args.max_uploads)
    state = ServerState.load(pipe, limits=limits, default_selector=args.selector, default_budget=args.budget,
                             read_workers=args.read_workers, max_pdf_bytes=args.max_pdf_mb << 20,
                             read_options=options)
    # SIGTERM / Ctrl-C: requests still running after 2 s are cancelled (their jobs abandoned, see guard.Lane)
    Server(uvicorn.Config(create_app(state), log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                          h11_max_incomplete_event_size=16 * 1024)).run(sockets=[sock])
    if state.lanes_running():
        # a job still computing holds a daemon thread inside JAX: leave without finalising the interpreter (the
        # local reader is stopped or released first: os._exit runs no exit handler)
        from cdsjax.io.reading.local.held import stop_all

        stop_all()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0

"""``cdsjax ask DIR_OR_PDF... "question"``: select evidence (and answer, with a reader).

The default selector is :data:`cdsjax.catalog.DEFAULT_SELECTOR`: learned CDS read per page (``cds-learned-pages``,
the constrained dominant set of the fitted game, found by the serving solver ``pdas`` on the corpus block, its
ranking read one note per printed page per round).
``--selector cds-converged`` is the paper's game at its equilibrium; ``--selector cds-paper`` (also spelled
``cds``) is the paper's
replicator dynamics with its 10,000-step cap: it reproduces the paper, but on real indexes it often stops
far from equilibrium, and then ``ask`` says so in one line (residual and the way out).

By default the question goes to this user's warm server (:mod:`cdsjax.commands.warm`, started when none runs):
one process that keeps the indexes, the encoder, the compiled selectors and the local reader loaded for
``--keep-alive`` seconds after the last command (a later command only lengthens that), so the next question's
evidence shows in under a second. ``--in-process`` (or CDSJAX_IN_PROCESS=1, or ``--keep-alive 0``) loads and reads
in this process instead and keeps nothing; ``--agent planning`` always does.

``--server URL`` sends the question to a running ``cdsjax serve`` instead of loading the index here.

``--json`` prints one object:

    {"question": str, "answer": str | null, "selector": str (e.g. "cds-converged"), "budget": int,
     "evidence": [{"rank": int (1-based), "score": float, "document": str,
                   "index": str (the name of the index directory that holds the document),
                   "page": int (0-based), "bbox": [x0, y0, x1, y1] | null (PDF points, top-left origin),
                   "kind": "text" | "figure" | "table" | "chart", "text": str,
                   "note_id": str, "image_path": str | null (absolute locally; relative to its index
                   with --server), "summary": str, "caption": str,
                   "read"?: "whole" | "part" | "left out" (with a reader: what it got of the note; "part": cut
                            to its sentences nearest the question for the token budget)}, ...],
     "diagnostics": {"solver": "pdas" | "active_set" | "replicator" | "inimdyn", "mode": "converged" | "paper",
                     "solver_run" (the solver that gave the point: "active_set" where pdas fell back, or on a
                     dense payoff), "num_iters", "converged", "status" ("converged" | "max_steps" | "nonfinite" |
                     "singular": how the solve ended), "kkt_residual", "objective",
                     "support_size" (notes with weight > 1e-6, the query excluded), "alpha",
                     "query_weight", "num_filled", "fill_reason" ("none" | "short_support" |
                     "no_query_edge"), "beta"}  ({} for baselines),
     "timings": {"encode", "select", "read"?, "load"? (local), "queue"? (serve), "roundtrip"? (--server)
                 (stage durations), "evidence", "first_token"?, "total" (seconds from the command's start, one
                 clock: first_token <= total)}  (seconds),
     "reader": {"model", "cited", "abstained", "latency_s", "usage", "warnings", "image_mode", "dropped",
                "local"? (the local reader: {"runtime", "model", "threads", "slots", "ctx_per_slot", ...,
                          "reused"?: bool (true: the warm server's reader was already running),
                          "keep_alive_s"?})} | null,
     "error": {"kind", "message", "server"} | null,
     "warnings": [str]  (an unconverged CDS solve, evidence from pages without a text layer, ...;
                         also printed to stderr),
     "abstained": bool  (true: the evidence was judged too weak before reading; the reader was not asked and
                         "answer" says the documents do not answer the question; never with --no-abstain),
     "abstention": {"abstained", "score" (what decided it), "feature" ("best_relevance" | "top_score" |
                    "payoff" | "support"), "threshold", "enabled"}  (cdsjax.pipeline.abstain)}

When reading fails (server down, errors after retries, malformed replies) the evidence is still printed,
``answer`` is null, ``error`` says why, and the exit code is 1. A reader that cannot be reached is found
by a quick check before the question is encoded.

With ``--agent planning`` (a DAG of sub-questions, G²-Reader §3.3; needs a reader) the object is
``cdsjax.agents.trace.PlanningResult.to_dict()``: question, answer, evidence (as above: what the final
reasoner read), reader, error, and ``trace`` = {probe, rounds: [{round, plan_source, plan: {nodes, order},
plan_repairs, plan_error, nodes: [{id, question, needs, answer, cited, evidence, ...}], verdict:
{sufficient, gaps}, retrieval}], stop_reason, explored_note_ids, llm_calls, usage}.

The reader is any OpenAI-compatible server (vLLM): ``--reader-url`` /
``--reader-model``, or the environment variables CDSJAX_READER_URL /
CDSJAX_READER_MODEL (and CDSJAX_READER_API_KEY).

By job: this module parses the command and runs it; the reader is chosen in :mod:`cdsjax.commands.reader_setup`,
a server is asked by :mod:`cdsjax.commands.server_client`, and :mod:`cdsjax.commands.ask_display` shows the result.
"""

from __future__ import annotations

import json
import os
import sys
import time

from cdsjax.commands import CLIError, add_reader_arguments, add_relevance_argument, add_selector_argument, printable
from cdsjax.commands.ask_display import Live, show
from cdsjax.commands.reader_setup import make_reader, read_options
from cdsjax.commands.server_client import ask_server
from cdsjax.defaults import DEFAULT_BUDGET, DEFAULT_KEEP_ALIVE, KEEP_ALIVE_CEILING, KEEP_ALIVE_FLOOR

# Selector names and the default are read where the selector is built (cdsjax.catalog, here or in the
# server), so this module stays free of JAX for `ask --server`.
OPTION_FLAGS = (("--beta", "beta"), ("--tau", "tau"), ("--max-iter", "max_iter"), ("--lam", "lam"))


def add_arguments(p) -> None:
    p.add_argument("inputs", nargs="+", metavar="DIR_OR_PDF", help="index directories or PDF files, then the question")
    add_selector_argument(p, "evidence selector; with --server, the server's default when not given")
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET,
                   help=f"number of evidence notes (default: {DEFAULT_BUDGET})")
    p.add_argument("--beta", type=float, default=None, help="CDS diversification strength (default 1.0)")
    p.add_argument("--tau", type=float, default=None, help="CDS query-edge threshold (default 0.0)")
    p.add_argument("--lam", type=float, default=None, help="MMR trade-off (default 0.5)")
    p.add_argument("--params", default=None, metavar="FILE",
                   help="parameters of a learned selector (a `cdsjax tune` file; default: the shipped fit of "
                   "its read-out)")
    p.add_argument("--max-iter", type=int, default=None,
                   help="CDS solver step cap (default: the solver's; paper mode: 10,000)")
    add_relevance_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (schema below)")
    p.add_argument("--server", default=None, metavar="URL",
                   help="ask a running `cdsjax serve` (e.g. http://127.0.0.1:8765) instead of loading the index; "
                   "then give only the question")
    p.add_argument("--token", default=None,
                   help="with --server: the server's bearer token; prefer the environment variable "
                   "CDSJAX_TOKEN (a --token value is visible to every user of the machine in `ps`)")
    p.add_argument("--embedder", action="append", default=[], metavar="MODEL",
                   help="accept indexes embedded with MODEL besides the shipped MiniLM and the documented presets")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let the embedding model run its own Python code (nomic-embed needs it); never taken "
                   "from an index")
    add_reader_arguments(p)
    p.add_argument("--keep-alive", default=None, metavar="SECONDS",
                   help=f"how long the warm server keeps the indexes and the reader after this command (between "
                   f"{KEEP_ALIVE_FLOOR:g} and {KEEP_ALIVE_CEILING:g}; it never shortens what another command asked "
                   f"for; `cdsjax reader stop` stops it now); 0 keeps nothing: load and read in this process (env "
                   f"CDSJAX_READER_KEEP_ALIVE; default: {DEFAULT_KEEP_ALIVE:g})")
    p.add_argument("--in-process", action="store_true",
                   help="load the indexes and run the reader in this process, without the warm server (env "
                   "CDSJAX_IN_PROCESS=1; for scripts and tests)")
    p.add_argument("--no-read", action="store_true", help="select evidence only, even if a reader is configured")
    p.add_argument("--no-abstain", action="store_true",
                   help="read the evidence even when it is judged too weak to answer the question (by default such "
                   "a question is answered 'the documents do not answer this question', unread)")
    p.add_argument("--agent", default="direct", choices=("direct", "planning"),
                   help="direct: one selection, one read (default); planning: a DAG of sub-questions, each "
                   "retrieved and answered, checked and refined (needs a reader; --json adds the trace)")
    p.add_argument("--combined", default=None, choices=("single", "peel"),
                   help="planning: one selection with every sub-question as a query vertex (peel: by peeling)")
    p.add_argument("--tau-max", type=int, default=3, help="planning: most refinement rounds (default: 3)")


def parse_inputs(inputs):
    if len(inputs) < 2:
        raise CLIError("give at least one index directory or PDF, then the question in quotes")
    *paths, question = inputs
    if not question.strip():
        raise CLIError("the question is empty")
    return paths, question


def selector_options(args) -> dict:
    """The selector options given as flags (checked against the selector by :func:`check_options`)."""
    if args.max_iter is not None and args.max_iter < 1:
        raise CLIError(f"--max-iter must be >= 1, got {args.max_iter}")
    return {opt: getattr(args, opt) for _, opt in OPTION_FLAGS if getattr(args, opt) is not None}


def check_options(selector: str, options: dict) -> None:
    """One line for an unknown selector, or a flag the selector has no option for."""
    from cdsjax.pipeline.catalog import selector_spec

    try:
        spec = selector_spec(selector)
    except ValueError as err:
        raise CLIError(str(err)) from None
    for flag, opt in OPTION_FLAGS:
        if opt in options and opt not in spec.options:
            raise CLIError(f"{flag} does not apply to --selector {selector}")


def check_params(selector: str, params):
    """The ``--params`` file's parameters (None without it); one line when it is given to a selector that plays
    no learned game, or names a bad file."""
    if params is None:
        return None
    from cdsjax.pipeline.catalog import display, selector_spec
    from cdsjax.core.registry import SPECS

    try:
        spec = selector_spec(selector)
    except ValueError as err:
        raise CLIError(str(err)) from None
    if not spec.learned:
        learned = ", ".join(display(s.name) for s in SPECS.values() if s.learned)
        raise CLIError(f"--params applies to the learned selectors ({learned}), not {selector}")
    from cdsjax.learn.params_io import resolve_params

    try:
        return resolve_params(params)
    except ValueError as err:
        raise CLIError(str(err), 1) from None


def run(args) -> int:
    args.started = time.perf_counter()
    if args.budget < 1:
        raise CLIError(f"--budget must be >= 1, got {args.budget}")
    options = selector_options(args)
    if args.server:
        if args.agent != "direct":
            raise CLIError("--agent planning runs locally; leave out --server")
        if len(args.inputs) != 1:
            raise CLIError("with --server give only the question (the server holds the index)")
        if args.reader_url or args.reader_model:
            raise CLIError("with --server the server's reader answers; give --reader-url to `cdsjax serve`")
        if not args.inputs[0].strip():
            raise CLIError("the question is empty")
        if getattr(args, "params", None) is not None:
            raise CLIError("with --server the server's parameters are used; give --params to `cdsjax serve`")
        result = ask_server(args.server, args.inputs[0], selector=args.selector, budget=args.budget,
                            options=options, read=not args.no_read, timeout=args.timeout,
                            abstain=not args.no_abstain,
                            token=args.token or os.environ.get("CDSJAX_TOKEN"))
    else:
        paths, question = parse_inputs(args.inputs)
        result = ask_warm(args, paths, question, options) if uses_warm_server(args) else None
        if result is None:
            result = ask_local(args, paths, question, options)
        if result is None:  # the planning agent printed its own output
            return 0
    return emit(result, args.json, shown=getattr(args, "shown", False))


def uses_warm_server(args) -> bool:
    """Whether the question goes to the warm server: not ``--in-process`` (nor CDSJAX_IN_PROCESS=1), not the
    planning agent, and a keep-alive other than 0 (one line for a keep-alive out of range)."""
    from cdsjax.commands.warm.place import IN_PROCESS_ENV, keep_alive_setting

    try:
        args.keep_alive = keep_alive_setting(getattr(args, "keep_alive", None))
    except ValueError as err:
        raise CLIError(str(err), 2) from None
    in_process = getattr(args, "in_process", False) or os.environ.get(IN_PROCESS_ENV, "") == "1"
    return not in_process and args.agent == "direct" and args.keep_alive > 0


def reader_request(args) -> "dict | None":
    """The reader the warm server should read with, from the flags (no reader module imported): a remote server,
    the local model and its settings, or None."""
    from cdsjax.commands.reader_setup import local_reader_model
    from cdsjax.io.reading.local.reader import LocalReaderConfig

    if args.no_read:
        return None
    common = dict(timeout=args.timeout, retries=args.retries, images=args.reader_images)
    url = args.reader_url or os.environ.get("CDSJAX_READER_URL")
    if url:
        return dict(url=url, model=args.reader_model or os.environ.get("CDSJAX_READER_MODEL"),
                    api_key=os.environ.get("CDSJAX_READER_API_KEY"), **common)
    model = local_reader_model(args)
    if model is None:
        return None
    try:
        LocalReaderConfig(model=model, threads=args.reader_threads, ctx_per_slot=args.reader_ctx,
                          slots=args.reader_slots)
    except ValueError as err:
        raise CLIError(str(err).replace("LocalReaderConfig.", "local reader: "), 2) from None
    if os.path.exists(model):
        model = os.path.abspath(model)
    return dict(local=model, threads=args.reader_threads, ctx_per_slot=args.reader_ctx, slots=args.reader_slots,
                **common)


def ask_warm(args, paths, question, options):
    """Asks this user's warm server (started when none runs) and shows the evidence and the answer as they come;
    returns the ``--json`` object, or None when the warm server's directory cannot be used (a warning says why,
    and the question is answered in this process)."""
    from cdsjax.commands.warm.client import WarmError, events
    from cdsjax.commands.warm.place import PlaceError, private_runtime_dir

    try:
        private_runtime_dir()
    except PlaceError as err:
        print(f"cdsjax ask: warning: {err}; answering in this process", file=sys.stderr)
        return None
    reader = reader_request(args)
    tokens = args.evidence_tokens
    if tokens is None and reader is not None and reader.get("local"):
        from cdsjax.defaults import LOCAL_EVIDENCE_TOKENS

        tokens = LOCAL_EVIDENCE_TOKENS
    if tokens is not None and tokens < 0:
        raise CLIError(f"--evidence-tokens must be >= 0, got {tokens}", 2)
    params = getattr(args, "params", None)
    request = dict(op="ask", paths=[os.path.abspath(p) for p in paths], question=question, selector=args.selector,
                   budget=args.budget, options=options, relevance=args.relevance, embedders=list(args.embedder),
                   trust_remote_code=args.trust_remote_code, abstain=not args.no_abstain, reader=reader,
                   evidence_tokens=tokens, keep_alive=args.keep_alive,
                   params=os.path.abspath(params) if params and os.path.exists(params) else params)
    live, first, result = None, None, None
    tell = not args.json and sys.stderr.isatty()
    try:
        for event in events(request, keep_alive=args.keep_alive):
            kind, now = event.get("event"), time.perf_counter() - args.started
            if kind == "status" and tell:
                print(f"cdsjax ask: {printable(event.get('text', ''))}", file=sys.stderr, flush=True)
            elif kind == "evidence":
                shown = dict(event["result"])
                shown["timings"] = dict(shown.get("timings") or {}, evidence=now, total=now)
                evidence_s = now
                live = None if args.json else Live(shown, reading=bool(event.get("reading")))
            elif kind == "token":
                first = now if first is None else first
                if live is not None:
                    live.token(event.get("text", ""))
            elif kind == "retry" and live is not None:
                live.retry(event.get("reason", ""))
            elif kind == "done":
                result = event["result"]
                # one clock, this command's: seconds from its start to the evidence, the first token and the end
                timings = dict(result.get("timings") or {}, evidence=evidence_s, total=now)
                if first is not None:
                    timings["first_token"] = first
                else:
                    timings.pop("first_token", None)
                result["timings"] = timings
                if live is not None:
                    live.done(result)
                    args.shown = True
            elif kind == "error":
                raise CLIError(str(event.get("message", "the warm server failed")), int(event.get("code", 1)))
    except (WarmError, PlaceError) as err:
        raise CLIError(str(err), getattr(err, "code", 1)) from None
    return result


def ask_local(args, paths, question, options):
    """Loads the indexes and answers here; returns the ``--json`` object (None after the planning agent)."""
    import contextlib

    from cdsjax.io.reading.local.held import stop_on_sigterm

    with contextlib.ExitStack() as stack:
        stack.enter_context(stop_on_sigterm())
        return _ask_local(args, paths, question, options, stack)


def _ask_local(args, paths, question, options, stack):
    from cdsjax.io.index.single import prestart_layout

    # a PDF to index: its layout helper starts now, its imports and model load overlapping this process's
    prestart_layout(paths)
    from cdsjax.io.compilation_cache import enable_compilation_cache
    from cdsjax.io.embed import EmbedderError
    from cdsjax.pipeline import Pipeline, PipelineError
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, display

    if args.selector is None:
        args.selector = display(DEFAULT_SELECTOR)
    check_options(args.selector, options)
    params = check_params(args.selector, getattr(args, "params", None))
    compile_cache = enable_compilation_cache()
    t0 = time.perf_counter()
    reader = make_reader(args, stack)
    read = read_options(args, reader)  # the read's evidence budget: the flags, else the reader's default
    # the reader module imports openai (~0.7 s): only when a reader is configured
    reader_errors = ()
    if reader is not None:
        from cdsjax.io.reading.llm.errors import ReaderError

        reader_errors = (ReaderError,)
    try:
        # a dead reader is found before loading and encoding; the evidence is still selected and printed
        unreachable = reader.probe() if reader is not None and args.agent != "planning" \
            and getattr(reader, "local", None) is None else None
        # a PDF indexed now: the selector compiles for its notes while they are embedded
        warm = dict(question=question, selector=args.selector, budget=args.budget, options=options) \
            if args.agent == "direct" else None
        pipe = Pipeline.from_paths(paths, reader=reader, progress=not args.json and sys.stderr.isatty(),
                                   embedders=args.embedder, trust_remote_code=args.trust_remote_code,
                                   params=params, warm=warm, compile_cache=compile_cache, relevance=args.relevance)
        load_s = time.perf_counter() - t0
        if args.agent == "planning":
            run_planning_agent(args, pipe, question, reader, options, load_s)
            return None
        answer = pipe.retrieve(question, selector=args.selector, budget=args.budget, options=options,
                               abstain=not args.no_abstain)
        answer.timings["load"] = load_s
        reading = reader is not None and unreachable is None
        if reading:  # the table marks the notes the reader will get, and those its token budget leaves out
            pipe.plan_read(answer, read)
        # one clock: "evidence", "first_token" and "total" are seconds from the command's start
        answer.timings["evidence"] = answer.timings["total"] = time.perf_counter() - args.started
        live = None if args.json else Live(answer.to_dict(), reading=reading)
        if reading:
            # streamed for --json too: the guard stops an echo or a loop early, and the first token is timed
            pipe.read(answer, read, on_token=live.token if live else (lambda _: None),
                      on_retry=live.retry if live else None, started=args.started)
        if unreachable is not None:
            from cdsjax.io.reading.reader import error_dict

            answer.error = error_dict(unreachable)
        if live is not None:
            live.done(answer.to_dict())
            args.shown = True
    except (PipelineError, EmbedderError) as err:
        raise CLIError(str(err), 1) from None
    except reader_errors as err:
        raise CLIError(f"reader: {err}", 1) from None
    except ValueError as err:
        raise CLIError(str(err), 2) from None
    return answer.to_dict()


def emit(result: dict, as_json: bool, shown: bool = False) -> int:
    """Prints the result (JSON on stdout, or the evidence table and the answer, unless ``shown`` as they came);
    warnings and a reader failure go to stderr either way. Returns the exit code: 1 when reading failed (the
    evidence is printed all the same)."""
    for warning in result.get("warnings") or []:
        print(f"cdsjax ask: warning: {printable(warning)}", file=sys.stderr)
    if as_json:
        print(json.dumps(result, indent=2, default=float))
    elif not shown:
        show(result)
    error = result.get("error")
    if error:
        print(f"cdsjax ask: error: reader: {printable(error['message'])}", file=sys.stderr)
        return 1
    return 0


def run_planning_agent(args, pipe, question, reader, options, load_s) -> None:
    from cdsjax.agents.retrieval import run_planning

    if reader is None:
        raise CLIError("--agent planning needs a reader: pass --reader-url, set CDSJAX_READER_URL, or install "
                       "the local one (pip install 'cdsjax[reader]')")
    result = run_planning(pipe, question, reader=reader, selector=args.selector, budget=args.budget,
                          options=options, combined=args.combined, tau_max=args.tau_max,
                          read_options=read_options(args, reader)).to_dict()
    result["timings"]["load"] = load_s
    if args.json:
        print(json.dumps(result, indent=2, default=float))
        return
    for r in result["trace"]["rounds"]:
        verdict = r["verdict"]
        state = "unreadable" if verdict is None else ("sufficient" if verdict["sufficient"] else
                                                      "gaps: " + "; ".join(verdict["gaps"]))
        print(f"round {r['round']} ({r['plan_source']}): {state}")
        for node in r["nodes"]:
            print(f"  {node['id']}: {node['question']} -> {' '.join(str(node['answer']).split())[:160]}")
    print(f"stopped: {result['trace']['stop_reason']}")
    print(f"\nAnswer: {result['answer']}" if result["answer"] is not None else f"\nno answer: {result['error']}")

"""``cdsjax ask DIR_OR_PDF... "question"``: select evidence (and answer, with a reader).

The default selector is :data:`cdsjax.catalog.DEFAULT_SELECTOR`: learned CDS read per page (``cds-learned-pages``,
the constrained dominant set of the fitted game, found by the serving solver ``pdas`` on the corpus block, its
ranking read one note per printed page per round).
``--selector cds-converged`` is the paper's game at its equilibrium; ``--selector cds-paper`` (also spelled
``cds``) is the paper's
replicator dynamics with its 10,000-step cap: it reproduces the paper, but on real indexes it often stops
far from equilibrium, and then ``ask`` says so in one line (residual and the way out).

``--server URL`` sends the question to a running ``cdsjax serve`` instead of loading the index here.

``--json`` prints one object:

    {"question": str, "answer": str | null, "selector": str (e.g. "cds-converged"), "budget": int,
     "evidence": [{"rank": int (1-based), "score": float, "document": str,
                   "index": str (the name of the index directory that holds the document),
                   "page": int (0-based), "bbox": [x0, y0, x1, y1] | null (PDF points, top-left origin),
                   "kind": "text" | "figure" | "table" | "chart", "text": str,
                   "note_id": str, "image_path": str | null (absolute locally; relative to its index
                   with --server), "summary": str, "caption": str}, ...],
     "diagnostics": {"solver": "pdas" | "active_set" | "replicator" | "inimdyn", "mode": "converged" | "paper",
                     "solver_run" (the solver that gave the point: "active_set" where pdas fell back, or on a
                     dense payoff), "num_iters", "converged", "status" ("converged" | "max_steps" | "nonfinite" |
                     "singular": how the solve ended), "kkt_residual", "objective",
                     "support_size" (notes with weight > 1e-6, the query excluded), "alpha",
                     "query_weight", "num_filled", "fill_reason" ("none" | "short_support" |
                     "no_query_edge"), "beta"}  ({} for baselines),
     "timings": {"encode", "select", "read"?, "total", "load"? (local), "queue"? (serve),
                 "roundtrip"? (--server)}  (seconds),
     "reader": {"model", "cited", "abstained", "latency_s", "usage", "warnings", "image_mode", "dropped",
                "local"? (the local reader: {"runtime", "model", "threads", "slots", "ctx_per_slot", ...,
                          "reused": bool (true: it was already running, warm), "keep_alive_s"})} | null,
     "error": {"kind", "message", "server"} | null,
     "warnings": [str]  (an unconverged CDS solve, evidence from pages without a text layer, ...;
                         also printed to stderr)}

When reading fails (server down, errors after retries, malformed replies) the evidence is still printed,
``answer`` is null, ``error`` says why, and the exit code is 1. A reader that cannot be reached is found
by a quick check before the question is encoded.

With ``--agent planning`` (a DAG of sub-questions, G²-Reader §3.3; needs a reader) the object is
``cdsjax.agents.planning.PlanningResult.to_dict()``: question, answer, evidence (as above: what the final
reasoner read), reader, error, and ``trace`` = {probe, rounds: [{round, plan_source, plan: {nodes, order},
plan_repairs, plan_error, nodes: [{id, question, needs, answer, cited, evidence, ...}], verdict:
{sufficient, gaps}, retrieval}], stop_reason, explored_note_ids, llm_calls, usage}.

The reader is any OpenAI-compatible server (vLLM): ``--reader-url`` /
``--reader-model``, or the environment variables CDSJAX_READER_URL /
CDSJAX_READER_MODEL (and CDSJAX_READER_API_KEY).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional

from cdsjax.commands import CLIError, add_reader_arguments, add_selector_argument, printable
from cdsjax.pipeline.defaults import DEFAULT_BUDGET, LOCAL_EVIDENCE_TOKENS, LOCAL_MAX_TOKENS

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
    p.add_argument("--no-read", action="store_true", help="select evidence only, even if a reader is configured")
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


def local_reader_model(args) -> Optional[str]:
    """The local reader's model when it should answer (no reader URL, reading not skipped, runtime installed),
    else None; one line for a local reader asked for by name whose runtime is missing."""
    url = getattr(args, "reader_url", None) or os.environ.get("CDSJAX_READER_URL")
    if getattr(args, "no_read", False) or url:
        return None
    named = getattr(args, "local_reader", None) or os.environ.get("CDSJAX_LOCAL_READER")
    if named == "off":
        return None
    from cdsjax.io.local_reader import RUNTIME_HINT, runtime_installed

    if not runtime_installed():
        if named:
            raise CLIError(f"--local-reader {named}: no local reader runtime: {RUNTIME_HINT}", 1)
        return None
    return named or "default"


def make_reader(args, stack=None):
    """The reader of ``ask`` / ``serve``: the remote server named by ``--reader-url`` (or CDSJAX_READER_URL),
    else the local one, else None.

    The local server is this user's shared one when it is running with the same model and settings (``reused``
    in ``reader.local``), else started here and waited for (its model loads in ~2-5 s; a preset is assembled
    into the cdsjax cache the first time); a server that cannot start is one line (exit 1). ``stack`` (a
    :class:`contextlib.ExitStack`) releases it: it stays up ``--keep-alive`` seconds after its last use
    (:func:`cdsjax.io.local_reader.keep_alive_setting`), or stops with ``stack`` when that is 0."""
    if getattr(args, "no_read", False):
        return None
    url = args.reader_url or os.environ.get("CDSJAX_READER_URL")
    images = getattr(args, "reader_images", "auto")
    if url:
        from cdsjax.io.reader import Reader, ReaderConfig

        model = args.reader_model or os.environ.get("CDSJAX_READER_MODEL")
        return Reader(ReaderConfig(base_url=url, model=model, timeout=args.timeout, max_retries=args.retries,
                                   images=images, evidence_tokens=getattr(args, "evidence_tokens", None)))
    model = local_reader_model(args)
    if model is None or stack is None:
        return None
    from cdsjax.io.local_model import LocalReaderError
    from cdsjax.io.local_reader import LocalReader, LocalReaderConfig, keep_alive_setting

    try:
        config = LocalReaderConfig(model=model, threads=args.reader_threads, ctx_per_slot=args.reader_ctx,
                                   slots=args.reader_slots,
                                   keep_alive=keep_alive_setting(getattr(args, "keep_alive", None)))
    except ValueError as err:
        raise CLIError(str(err).replace("LocalReaderConfig.", "local reader: "), 2) from None
    local = LocalReader(config, progress=sys.stderr.isatty() and not getattr(args, "json", False))
    stack.callback(local.close)
    try:
        local.start()
    except LocalReaderError as err:
        raise CLIError(f"local reader: {err}", 1) from None
    from cdsjax.io.reader import Reader

    tokens = getattr(args, "evidence_tokens", None)
    tokens = LOCAL_EVIDENCE_TOKENS if tokens is None else tokens
    return Reader(local.reader_config(timeout=args.timeout, max_retries=args.retries, max_tokens=LOCAL_MAX_TOKENS,
                                      images=images, evidence_tokens=tokens), local=local.describe())


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
                            token=args.token or os.environ.get("CDSJAX_TOKEN"))
    else:
        paths, question = parse_inputs(args.inputs)
        result = ask_local(args, paths, question, options)
        if result is None:  # the planning agent printed its own output
            return 0
    return emit(result, args.json, shown=getattr(args, "shown", False))


def ask_local(args, paths, question, options):
    """Loads the indexes and answers here; returns the ``--json`` object (None after the planning agent)."""
    import contextlib

    from cdsjax.io.local_reader import stop_on_sigterm

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
    # the reader module imports openai (~0.7 s): only when a reader is configured
    reader_errors = ()
    if reader is not None:
        from cdsjax.io.reader import ReaderError

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
                                   params=params, warm=warm, compile_cache=compile_cache)
        load_s = time.perf_counter() - t0
        if args.agent == "planning":
            run_planning_agent(args, pipe, question, reader, options, load_s)
            return None
        answer = pipe.retrieve(question, selector=args.selector, budget=args.budget, options=options)
        answer.timings["load"] = load_s
        answer.timings["evidence"] = time.perf_counter() - args.started
        live = None if args.json else Live(answer.to_dict(), reading=reader is not None and unreachable is None)
        if reader is not None and unreachable is None:
            read_from = time.perf_counter() - args.started
            # streamed for --json too: the guard stops an echo or a loop early, and the first token is timed
            pipe.read(answer, on_token=live.token if live else (lambda _: None), on_retry=live.retry if live else None)
            if "first_token" in answer.timings:  # from the command's start, as "evidence"
                answer.timings["first_token"] += read_from
        if unreachable is not None:
            from cdsjax.io.reader import error_dict

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


def ask_server(url: str, question: str, *, selector: Optional[str], budget: int, options: dict, read: bool = True,
               timeout: float = 300.0, token: "str | None" = None) -> dict:
    """POSTs the question to a running ``cdsjax serve`` (stdlib HTTP only: no JAX or torch here); without a
    ``selector`` the server uses its default."""
    import urllib.error
    import urllib.request

    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise CLIError(f"--server {url}: expected an http:// or https:// URL", 2)
    body = dict(question=question, budget=budget)
    if selector is not None:
        body["selector"] = selector
    if options:
        body["options"] = options
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = b"Bearer " + token.encode("utf-8")  # any text: the server compares bytes
    request = urllib.request.Request(f"{base}/{'ask' if read else 'select'}", data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            result = json.loads(response.read())
    except urllib.error.HTTPError as err:
        try:
            body = json.loads(err.read())
            message = body.get("error") or err.reason
        except (ValueError, AttributeError):
            body, message = {}, err.reason
        if err.code == 502 and isinstance(body.get("result"), dict):  # the reader failed; the evidence came back
            return body["result"]
        raise CLIError(f"server {base}: HTTP {err.code}: {message}", 1) from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise CLIError(f"server {base}: cannot reach it ({reason}); start one with `cdsjax serve INDEX`", 1) from None
    except ValueError:
        raise CLIError(f"server {base}: the reply is not JSON (is it a cdsjax server?)", 1) from None
    result.setdefault("timings", {})["roundtrip"] = time.perf_counter() - t0
    return result


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
    from cdsjax.agents.planning import run_planning

    if reader is None:
        raise CLIError("--agent planning needs a reader: pass --reader-url, set CDSJAX_READER_URL, or install "
                       "the local one (pip install 'cdsjax[reader]')")
    result = run_planning(pipe, question, reader=reader, selector=args.selector, budget=args.budget,
                          options=options, combined=args.combined, tau_max=args.tau_max).to_dict()
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


def _console():
    from rich.console import Console

    return Console()


def shown(text) -> str:
    """``text`` with neither a terminal escape sequence nor rich markup (a name or a PDF's text)."""
    from rich.markup import escape

    return escape(printable(text))


def show_evidence(result: dict, console=None) -> None:
    """The evidence table and the convergence line (``result``: the --json object)."""
    from rich.table import Table

    console = console or _console()
    table = Table(title=f"Evidence for: {shown(result['question'])}", show_lines=False, expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("score", justify="right", no_wrap=True)
    table.add_column("document", overflow="fold", max_width=28)
    table.add_column("page", justify="right", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("text", overflow="fold", ratio=3)
    for e in result["evidence"]:
        snippet = " ".join(e["text"].split())[:220]
        table.add_row(str(e["rank"]), f"{e['score']:.4f}", shown(e["document"]), str(e["page"] + 1), shown(e["kind"]),
                      shown(snippet))
    console.print(table)
    console.print("[dim]pages are shown 1-based here; --json gives 0-based pages[/dim]")
    console.print(convergence_line(result), highlight=False)


def show_tail(result: dict, console=None) -> None:
    """What follows the answer: the notes it cites, what the reader read, the timings."""
    console = console or _console()
    reader = result.get("reader") or {}
    if result.get("answer") is not None and reader.get("cited"):
        by_rank = {e["rank"]: e for e in result["evidence"]}
        cites = [f"\\[{n}] {shown(by_rank[n]['document'])} p.{by_rank[n]['page'] + 1} ({shown(by_rank[n]['kind'])})"
                 for n in reader["cited"] if n in by_rank]
        console.print("[dim]cited: " + "; ".join(cites) + "[/dim]", highlight=False)
    if reader.get("evidence_tokens"):
        left = reader.get("dropped") or 0
        console.print(f"[dim]the reader read ~{reader['evidence_tokens']} evidence tokens"
                      + (f"; {left} lowest-ranked note{'s' if left != 1 else ''} left out" if left else "")
                      + ("; one note cut to its sentences nearest the question" if reader.get("trimmed") else "")
                      + ("; a warm local reader" if (reader.get("local") or {}).get("reused") else "")
                      + "[/dim]", highlight=False)
    if result.get("answer") is not None and reader.get("model"):
        console.print(f"[dim]reader: {shown(reader['model'])}[/dim]", highlight=False)
    t = result.get("timings") or {}
    console.print("[dim]" + ", ".join(f"{k} {v:.2f}s" for k, v in t.items()) + "[/dim]")


def show(result: dict) -> None:
    """The evidence table, the convergence line, the answer and the timings, all at once (``ask --server``)."""
    console = _console()
    show_evidence(result, console)
    if result.get("answer") is not None:
        console.print(f"\n[bold]Answer[/bold] ({shown(result['reader']['model'])}): "
                      + "\n".join(shown(line) for line in str(result["answer"]).split("\n")))
    else:
        console.print(_no_answer_line(result))
    show_tail(result, console)


def _no_answer_line(result: dict) -> str:
    reader = result.get("reader") or {}
    if reader.get("no_answer"):
        from cdsjax.io.replies import NO_ANSWER

        return (f"\n[bold]No answer[/bold]: the reader gave none ({NO_ANSWER.get(reader['no_answer'], reader['no_answer'])}"
                f", asked twice); the evidence above was selected")
    if result.get("error"):
        return "\n[bold]No answer[/bold]: the reader failed (the evidence above was selected)"
    return ("[dim]no reader (--no-read, or none configured: --reader-url, or the local reader of "
            "`pip install 'cdsjax[reader]'`): showing the evidence only[/dim]")


class Live:
    """``ask`` on a terminal or a pipe: the evidence as soon as it is selected, the answer as it is written,
    then the citations and the timings. A reply that turns out to be no answer is never shown as one: the
    reader's guard holds back markers and echoed headers; when a loop is cut short, a line says the question
    is asked again."""

    def __init__(self, result: dict, *, reading: bool):
        self.console = _console()
        self.started = False
        show_evidence(result, self.console)
        if reading:
            self.console.print("\n[bold]Answer[/bold]:", end=" ")
            self.console.file.flush()

    def token(self, piece: str) -> None:
        self.started = True
        self.console.file.write(printable(piece, keep_newlines=True))
        self.console.file.flush()

    def retry(self, reason: str) -> None:
        from cdsjax.io.replies import NO_ANSWER

        if self.started:
            self.console.print(f"\n[dim](that was no answer: {NO_ANSWER.get(reason, reason)}; asking again)[/dim]")
        self.started = False

    def done(self, result: dict) -> None:
        if result.get("answer") is None:
            self.console.print(_no_answer_line(result))
        else:
            self.console.print()
        show_tail(result, self.console)


def convergence_line(result: dict) -> str:
    d = result.get("diagnostics") or {}
    if not d:
        return f"selector {result['selector']}: no solver involved"
    state = "converged" if d["converged"] else "did NOT converge" + (f" ({d['status']})" if "status" in d else "")
    return (f"CDS {d['mode']} mode ({d['solver']}): {state} after {d['num_iters']} steps, "
            f"KKT residual {d['kkt_residual']:.1e}, {d['support_size']} notes in the support")

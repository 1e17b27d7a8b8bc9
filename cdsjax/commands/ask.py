"""``cdsjax ask DIR_OR_PDF... "question"``: select evidence (and answer, with a reader).

``--json`` prints one object:

    {"question": str, "answer": str | null, "selector": str, "budget": int,
     "evidence": [{"rank": int (1-based), "score": float, "document": str,
                   "page": int (0-based), "bbox": [x0, y0, x1, y1] | null (PDF points, top-left origin),
                   "kind": "text" | "figure" | "table" | "chart", "text": str,
                   "note_id": str, "image_path": str | null, "summary": str, "caption": str}, ...],
     "diagnostics": {"solver", "mode", "num_iters", "converged", "kkt_residual", "objective",
                     "support_size", "alpha", "query_weight"}  ({} for baselines),
     "timings": {"encode", "select", "read"?, "total", "load"}  (seconds),
     "reader": {"model", "cited", "abstained", "latency_s", "usage", "warnings"} | null,
     "error": {"kind", "message", "server"} | null}

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

from cdsjax.cli import CLIError

SELECTOR_CHOICES = ("cds", "cds-converged", "cds-inimdyn", "cosine", "mmr", "dpp", "ppr", "random", "subgraph")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "ask",
        help="ask a question of indexed documents or PDFs",
        description="Select evidence for a question from index directories or PDFs (PDFs are indexed into a "
        "cache on first use) and, with a reader configured, answer it from that evidence.",
    )
    p.add_argument("inputs", nargs="+", metavar="DIR_OR_PDF", help="index directories or PDF files, then the question")
    p.add_argument("--selector", default="cds", choices=SELECTOR_CHOICES,
                   help="evidence selector (default: cds, paper mode; cds-converged solves to equilibrium)")
    p.add_argument("--budget", type=int, default=10, help="number of evidence notes (default: 10)")
    p.add_argument("--beta", type=float, default=None, help="CDS diversification strength (default 1.0)")
    p.add_argument("--tau", type=float, default=None, help="CDS query-edge threshold (default 0.0)")
    p.add_argument("--lam", type=float, default=None, help="MMR trade-off (default 0.5)")
    p.add_argument("--json", action="store_true", help="print one JSON object (schema in `cdsjax ask --help`)")
    p.add_argument("--reader-url", default=None, help="OpenAI-compatible base URL (env CDSJAX_READER_URL)")
    p.add_argument("--reader-model", default=None, help="reader model name (env CDSJAX_READER_MODEL)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds the reader may take in all, retries included (default: 300)")
    p.add_argument("--retries", type=int, default=3, help="reader retries on transient errors (default: 3)")
    p.add_argument("--no-read", action="store_true", help="select evidence only, even if a reader is configured")
    p.add_argument("--agent", default="direct", choices=("direct", "planning"),
                   help="direct: one selection, one read (default); planning: a DAG of sub-questions, each "
                   "retrieved and answered, checked and refined (needs a reader; --json adds the trace)")
    p.add_argument("--combined", default=None, choices=("single", "peel"),
                   help="planning: one selection with every sub-question as a query vertex (peel: by peeling)")
    p.add_argument("--tau-max", type=int, default=3, help="planning: most refinement rounds (default: 3)")
    p.set_defaults(func=run)


def parse_inputs(inputs):
    if len(inputs) < 2:
        raise CLIError("give at least one index directory or PDF, then the question in quotes")
    *paths, question = inputs
    if not question.strip():
        raise CLIError("the question is empty")
    return paths, question


def selector_options(args) -> dict:
    opts = {}
    name = args.selector
    if name.startswith("cds"):
        if args.beta is not None:
            opts["beta"] = args.beta
        if args.tau is not None:
            opts["tau"] = args.tau
    elif args.beta is not None or args.tau is not None:
        raise CLIError("--beta/--tau apply to the cds selectors only")
    if args.lam is not None:
        if name != "mmr":
            raise CLIError("--lam applies to --selector mmr only")
        opts["lam"] = args.lam
    return opts


def make_reader(args):
    url = args.reader_url or os.environ.get("CDSJAX_READER_URL")
    if args.no_read or not url:
        return None
    from cdsjax.io.reader import Reader, ReaderConfig

    model = args.reader_model or os.environ.get("CDSJAX_READER_MODEL")
    return Reader(ReaderConfig(base_url=url, model=model, timeout=args.timeout, max_retries=args.retries))


def run(args) -> int:
    from cdsjax.io.reader import ReaderError, error_dict
    from cdsjax.pipeline import Pipeline, PipelineError

    paths, question = parse_inputs(args.inputs)
    if args.budget < 1:
        raise CLIError(f"--budget must be >= 1, got {args.budget}")
    options = selector_options(args)
    t0 = time.perf_counter()
    try:
        reader = make_reader(args)
        # a dead reader is found before loading and encoding; the evidence is still selected and printed
        unreachable = reader.probe() if reader is not None and args.agent != "planning" else None
        pipe = Pipeline.from_paths(paths, reader=reader, progress=not args.json and sys.stderr.isatty())
        load_s = time.perf_counter() - t0
        if args.agent == "planning":
            return run_planning_agent(args, pipe, question, reader, options, load_s)
        answer = pipe.ask(question, selector=args.selector, budget=args.budget, options=options,
                          read=unreachable is None)
        if unreachable is not None:
            answer.error = error_dict(unreachable)
    except PipelineError as err:
        raise CLIError(str(err), 1) from None
    except ReaderError as err:
        raise CLIError(f"reader: {err}", 1) from None
    except ValueError as err:
        raise CLIError(str(err), 2) from None
    answer.timings["load"] = load_s
    return print_answer(args, answer, pipe)


def print_answer(args, answer, pipe) -> int:
    """Prints the answer (or, when reading failed, the evidence and the error); the exit code."""
    from cdsjax.io.reader import ask_warnings

    notes = pipe.corpus.notes
    for line in ask_warnings(answer, lambda nid: notes[pipe.corpus.note_index(nid)]):
        print(f"cdsjax ask: warning: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(answer.to_dict(), indent=2, default=float))
    else:
        show(answer)
    if answer.error is not None:
        print(f"cdsjax ask: error: reader: {answer.error['message']}", file=sys.stderr)
        return 1
    return 0


def run_planning_agent(args, pipe, question, reader, options, load_s) -> int:
    from cdsjax.agents.planning import run_planning

    if reader is None:
        raise CLIError("--agent planning needs a reader: pass --reader-url or set CDSJAX_READER_URL")
    result = run_planning(pipe, question, reader=reader, selector=args.selector, budget=args.budget,
                          options=options, combined=args.combined, tau_max=args.tau_max).to_dict()
    result["timings"]["load"] = load_s
    if args.json:
        print(json.dumps(result, indent=2, default=float))
        return 0
    for r in result["trace"]["rounds"]:
        verdict = r["verdict"]
        state = "unreadable" if verdict is None else ("sufficient" if verdict["sufficient"] else
                                                      "gaps: " + "; ".join(verdict["gaps"]))
        print(f"round {r['round']} ({r['plan_source']}): {state}")
        for node in r["nodes"]:
            print(f"  {node['id']}: {node['question']} -> {' '.join(str(node['answer']).split())[:160]}")
    print(f"stopped: {result['trace']['stop_reason']}")
    print(f"\nAnswer: {result['answer']}" if result["answer"] is not None else f"\nno answer: {result['error']}")
    return 0


def show(answer) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"Evidence for: {answer.question}", show_lines=False, expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("score", justify="right", no_wrap=True)
    table.add_column("document", overflow="fold", max_width=28)
    table.add_column("page", justify="right", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("text", overflow="fold", ratio=3)
    for e in answer.evidence:
        snippet = " ".join(e["text"].split())[:220]
        table.add_row(str(e["rank"]), f"{e['score']:.4f}", str(e["document"]), str(e["page"] + 1), e["kind"], snippet)
    console.print(table)
    console.print("[dim]pages are shown 1-based here; --json gives 0-based pages[/dim]")
    console.print(convergence_line(answer))
    if answer.answer is not None:
        console.print(f"\n[bold]Answer[/bold] ({answer.reader['model']}): {answer.answer}")
    elif answer.error is not None:
        console.print("\n[bold]No answer[/bold]: the reader failed (the evidence above was selected)")
    else:
        console.print("[dim]no reader configured (--reader-url / CDSJAX_READER_URL): showing the evidence only[/dim]")
    t = answer.timings
    console.print("[dim]" + ", ".join(f"{k} {v:.2f}s" for k, v in t.items()) + "[/dim]")


def convergence_line(answer) -> str:
    d = answer.diagnostics
    if not d:
        return f"selector {answer.selector}: no solver involved"
    state = "converged" if d["converged"] else "did NOT converge"
    hint = ""
    if not d["converged"] and d["mode"] == "paper":
        hint = " — paper mode stops at its step cap; --selector cds-converged solves to equilibrium"
    return (f"CDS {d['mode']} mode ({d['solver']}): {state} after {d['num_iters']} steps, "
            f"KKT residual {d['kkt_residual']:.1e}, support {d['support_size']} vertices{hint}")

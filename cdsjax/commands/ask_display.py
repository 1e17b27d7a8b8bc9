"""What ``cdsjax ask`` shows on a terminal or a pipe (without ``--json``): the evidence table and the
convergence line, the answer (as it is written, :class:`Live`, or all at once, :func:`show`), the notes it
cites, what the reader read and the timings; or the line that says why there is no answer. Text that cdsjax did
not write goes through :func:`shown`. rich is imported only when something is shown."""

from __future__ import annotations

from cdsjax.commands import printable


def make_console():
    """A rich console on stdout."""
    from rich.console import Console

    return Console()


def shown(text) -> str:
    """``text`` with neither a terminal escape sequence nor rich markup (a name or a PDF's text)."""
    from rich.markup import escape

    return escape(printable(text))


def show_evidence(result: dict, console=None) -> None:
    """The evidence table and the convergence line (``result``: the --json object)."""
    from rich.table import Table

    console = console or make_console()
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
    console = console or make_console()
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
    console = make_console()
    show_evidence(result, console)
    if result.get("answer") is not None:
        console.print(f"\n[bold]Answer[/bold] ({shown((result.get('reader') or {}).get('model') or 'not read')}): "
                      + "\n".join(shown(line) for line in str(result["answer"]).split("\n")))
    else:
        console.print(no_answer_line(result))
    show_tail(result, console)


def no_answer_line(result: dict) -> str:
    """Why ``result`` (the --json object) has no answer: the reader gave none, the reader failed, or no reader."""
    reader = result.get("reader") or {}
    if reader.get("no_answer"):
        from cdsjax.io.replies import describe_no_answer

        why = shown(describe_no_answer(reader["no_answer"]))
        return f"\n[bold]No answer[/bold]: {why}; the evidence above was selected"
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
        self.console = make_console()
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
            self.console.print(no_answer_line(result))
        else:
            self.console.print()
        show_tail(result, self.console)


def convergence_line(result: dict) -> str:
    """One line on how the selection's solve ended (or that no solver was involved)."""
    d = result.get("diagnostics") or {}
    if not d:
        return f"selector {result['selector']}: no solver involved"
    state = "converged" if d["converged"] else "did NOT converge" + (f" ({d['status']})" if "status" in d else "")
    return (f"CDS {d['mode']} mode ({d['solver']}): {state} after {d['num_iters']} steps, "
            f"KKT residual {d['kkt_residual']:.1e}, {d['support_size']} notes in the support")

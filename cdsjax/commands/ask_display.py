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
    marked = any("read" in e for e in result["evidence"])
    if marked:
        table.add_column("read", no_wrap=True)
    for e in result["evidence"]:
        snippet = " ".join(e["text"].split())[:220]
        cells = [str(e["rank"]), f"{e['score']:.4f}", shown(e["document"]), str(e["page"] + 1), shown(e["kind"]),
                 shown(snippet)]
        table.add_row(*cells, *([READ_MARKS.get(e.get("read"), "?")] if marked else []),
                      style="dim" if e.get("read") == "left out" else None)
    console.print(table)
    console.print("[dim]pages are shown 1-based here; --json gives 0-based pages"
                  + ("; read: yes = the reader gets the note, part = cut to its sentences nearest the question, "
                     "no = left out for the reader's token budget" if marked else "") + "[/dim]")
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
        console.print(f"[dim]the reader read ~{reader['evidence_tokens']} evidence tokens: {read_summary(result)}"
                      + ("; a warm local reader" if (reader.get("local") or {}).get("reused") else "")
                      + "[/dim]", highlight=False)
    if result.get("answer") is not None and reader.get("model"):
        console.print(f"[dim]reader: {shown(reader['model'])}[/dim]", highlight=False)
    console.print(f"[dim]{timings_line(result.get('timings') or {})}[/dim]")


# the table's "read" column (cdsjax.pipeline.answer.mark_read)
READ_MARKS = {"whole": "yes", "part": "part", "left out": "no"}
# points in time on the one clock (seconds from the start), in the order they happen; the rest are stage durations
CLOCK = (("evidence", "evidence"), ("first_token", "first token"), ("total", "done"))


def ranks(numbers: list) -> str:
    """``[1]-[3], [5]``: evidence ranks, runs joined."""
    runs, out = [], []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    for a, b in runs:
        out.append(f"\\[{a}]" if a == b else f"\\[{a}]-\\[{b}]")
    return ", ".join(out)


def read_summary(result: dict) -> str:
    """Which notes the reader got (whole or in part) and which were left out, by rank (the evidence's ``read``)."""
    ev = result.get("evidence") or []
    got = [e["rank"] for e in ev if e.get("read") in ("whole", "part")]
    part = [e["rank"] for e in ev if e.get("read") == "part"]
    left = [e["rank"] for e in ev if e.get("read") == "left out"]
    if not got and not left:
        return "which notes is not known"
    text = f"notes {ranks(got)}" if got else "no note"
    if part:
        text += f" ({ranks(part)} cut to {'its' if len(part) == 1 else 'their'} sentences nearest the question)"
    if left:
        text += f"; {ranks(left)} left out (past the token budget)"
    return text


def timings_line(t: dict) -> str:
    """The timings on one clock: when the evidence, the first token and the end came (seconds from the start),
    then how long each stage took."""
    points = [f"{label} at {t[k]:.2f}s" for k, label in CLOCK if k in t]
    stages = [f"{k} {v:.2f}s" for k, v in t.items() if k not in dict(CLOCK)]
    return "; ".join(part for part in (", ".join(points), ("stages: " + ", ".join(stages)) if stages else "") if part)


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
        from cdsjax.io.reading.replies import describe_no_answer

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
        from cdsjax.io.reading.replies import NO_ANSWER

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

r"""What a person waits for: ``cdsjax ask PDF QUESTION`` run as a person runs it (a fresh process each time, its
output read as it comes), timed from the process's start to the evidence on the screen, the first piece of the
answer and the whole answer.

    python experiments/ask_latency.py PDF "first question" "second question" "third question"
    python experiments/ask_latency.py PDF Q1 Q2 Q3 --sweep 300,600,900     # warm answers at other token budgets
    python experiments/ask_latency.py PDF Q1 Q2 Q3 --also PDF2 PDF3        # and the warm server's memory with 3 sets

The first question goes to a *new* PDF (the PDF's bytes with a comment appended, so no cached index matches) with
nothing warm running (``cdsjax reader stop`` first): it pays the warm server's start, the indexing and the
reader's start. The later questions are warm: the index is loaded and the reader is up. Each ask is its own
process, as at a shell. The counts of warm server and llama.cpp server processes after each ask show whether one
owner served them all. ``--also`` asks (without reading) about further PDFs, then reads the warm server's memory
and its reader's with 1 and with 1 + len(also) index sets loaded (``cdsjax reader status --json``). Prints a table
and writes ``results/latency/<pdf stem>.json`` (``--out`` names another file). Run it on a quiet machine:
llama.cpp slows several times beside other work.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "latency"


def servers() -> int:
    """llama.cpp server processes of the local reader running now."""
    out = subprocess.run(["pgrep", "-f", "cdsjax.io.reading.local.reader _serve"], capture_output=True, text=True)
    return len(out.stdout.split())


def owners() -> int:
    """Warm cdsjax server processes running now."""
    out = subprocess.run(["pgrep", "-f", "cdsjax[.]commands[.]warm"], capture_output=True, text=True)
    return len(out.stdout.split())


def memory() -> dict:
    """The warm server's and its readers' resident memory (MiB) and the index sets it holds, from ``cdsjax reader
    status --json``."""
    out = subprocess.run([sys.executable, "-m", "cdsjax.cli", "reader", "status", "--json"], capture_output=True,
                         text=True, cwd=ROOT)
    state = json.loads(out.stdout or "null")
    if not state:
        return {}
    return dict(server_mb=state["memory_mb"], readers_mb=[r["memory_mb"] for r in state["readers"]],
                index_sets=len(state["indexes"]))


def timed_ask(pdf: pathlib.Path, question: str, extra=()) -> dict:
    """One ``cdsjax ask``: seconds from its start to the evidence, the first answer text and its end."""
    cmd = [sys.executable, "-m", "cdsjax.cli", "ask", str(pdf), question, *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    text, evidence, first = "", None, None
    while True:
        chunk = proc.stdout.read1(4096)
        if not chunk:
            break
        now = time.perf_counter() - t0
        text += chunk.decode(errors="replace")
        if evidence is None and "pages are shown 1-based" in text:
            evidence = now
        if first is None and re.search(r"Answer:\s*\S", text):
            first = now
    code = proc.wait()
    whole = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    answer = text.split("Answer:", 1)[1].split("\n")[0].strip() if "Answer:" in text else None
    tokens = re.search(r"read ~(\d+) evidence tokens", text)
    return dict(question=question, code=code, evidence_s=evidence, first_token_s=first, whole_s=whole,
                answer=answer, evidence_tokens=int(tokens.group(1)) if tokens else None,
                warm_reader="a warm local reader" in " ".join(text.split()),  # the line may wrap
                servers_after=servers(), owners_after=owners(), no_answer="No answer" in text, stderr_tail=err.strip().splitlines()[-3:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pdf")
    p.add_argument("questions", nargs="+")
    p.add_argument("--sweep", default="", help="token budgets to time warm answers at, e.g. 300,600,900")
    p.add_argument("--repeats", type=int, default=1, help="warm rounds over the questions (default: 1)")
    p.add_argument("--also", nargs="*", default=[], metavar="PDF",
                   help="further PDFs asked about (no reading) before the memory is read with them loaded")
    p.add_argument("--out", default=None, help="the result file (default: results/latency/<pdf stem>.json)")
    args = p.parse_args(argv)
    source = pathlib.Path(args.pdf).resolve()
    OUT.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "cdsjax.cli", "reader", "stop"], cwd=ROOT, capture_output=True)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        pdf = pathlib.Path(tmp) / source.name
        shutil.copyfile(source, pdf)
        with open(pdf, "ab") as f:  # new bytes, same document: no cached index matches it
            f.write(f"\n% cdsjax latency run {time.time()}\n".encode())
        print(f"{source.name}: {len(args.questions)} questions; servers running before: {servers()}", flush=True)
        runs.append(dict(state="cold (new PDF, no reader running)", **timed_ask(pdf, args.questions[0])))
        for _ in range(args.repeats):
            for q in args.questions[1:] + args.questions[:1]:
                runs.append(dict(state="warm", **timed_ask(pdf, q)))
        for budget in [int(b) for b in args.sweep.split(",") if b]:
            for q in args.questions:
                runs.append(dict(state=f"warm, --evidence-tokens {budget}",
                                 **timed_ask(pdf, q, ("--evidence-tokens", str(budget)))))
        memory_used = {"1 index set": memory()}
        for other in args.also:
            timed_ask(pathlib.Path(other).resolve(), args.questions[0], ("--no-read",))
        if args.also:
            memory_used[f"{1 + len(args.also)} index sets"] = memory()
    print("| state | question | evidence (s) | first token (s) | whole answer (s) | evidence tokens | warm reader | "
          "warm servers | reader servers |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        cell = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
        print(f"| {r['state']} | {r['question'][:48]} | {cell(r['evidence_s'])} | {cell(r['first_token_s'])} | "
              f"{cell(r['whole_s'])} | {r['evidence_tokens']} | {'yes' if r['warm_reader'] else 'no'} | "
              f"{r['owners_after']} | {r['servers_after']} |")
    warm = [r for r in runs if r["state"] == "warm"]
    if warm:
        print(f"warm medians: evidence {statistics.median(r['evidence_s'] or 0 for r in warm):.1f} s, first token "
              f"{statistics.median(r['first_token_s'] or 0 for r in warm):.1f} s, whole "
              f"{statistics.median(r['whole_s'] for r in warm):.1f} s")
    for what, used in memory_used.items():
        print(f"memory with {what}: {used}")
    from cdsjax.io.provenance import provenance

    result = dict(pdf=source.name, commit=subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                                         capture_output=True, text=True).stdout.strip(),
                  load_before=os.getloadavg(), runs=runs, memory=memory_used, provenance=provenance())
    out = pathlib.Path(args.out) if args.out else OUT / f"{source.stem}.json"
    out.write_text(json.dumps(result, indent=1))
    for r in runs:
        for answer in [r["answer"]]:
            print(f"- {r['question'][:60]!r}: {answer!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

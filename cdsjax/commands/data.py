"""``cdsjax data fetch [--to DIR] [--only NAME]``: download the benchmark data and lay it out as ``data_root``.

    cdsjax data fetch                      # to $CDSJAX_DATA, else ../shared/data beside the repository
    cdsjax data fetch --to DIR --only qasper,hotpotqa
    cdsjax data list                       # the sources: size, licence, homepage

Sources (:mod:`cdsjax.io.datasets.sources`): mmlongbench (MMLongBench-Doc questions and PDFs), mmdocir (MMDocIR
annotations), qasper (QASPER test v0.3), hotpotqa (HotpotQA as sampled by HippoRAG), pdfs (PDFs of the parsing
tests). Each file is checked against its recorded size and sha256; an interrupted run resumes where it stopped,
and a file that fails its check is fetched again on the next run. Each failure is one line; exit code 1 when
any file failed. The development subset is laid out (the questions RESULTS.md reports on), not the whole
benchmark.
"""

from __future__ import annotations

import sys

from cdsjax.commands import CLIError


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    f = sub.add_parser("fetch", help="download, check and lay out the benchmark data",
                       description="Download the benchmark data's sources, check them against the recorded sizes "
                       "and sha256, and lay them out as data_root expects (resumable).")
    f.add_argument("--to", default=None, metavar="DIR",
                   help="the data root to fill (default: $CDSJAX_DATA, else ../shared/data beside the repository)")
    f.add_argument("--only", action="append", default=None, metavar="NAME",
                   help="fetch only these sources (repeat or separate by commas)")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    sub.add_parser("list", help="the sources: files, size, licence, homepage")


def _size(n) -> str:
    return "size unknown" if n is None else f"{n / 1e6:.1f} MB"


def run(args) -> int:
    from cdsjax.io.datasets.sources import SOURCES

    if args.action == "list":
        for s in SOURCES.values():
            count = len(s.files) + len(s.derived)
            print(f"{s.name:12s} {s.title}: {count} files, download {_size(s.total_size())}; "
                  f"licence {s.licence}; {s.homepage}")
        return 0
    if args.action != "fetch":
        raise CLIError("say what to do: `cdsjax data fetch` or `cdsjax data list`")
    names = [n.strip() for arg in (args.only or []) for n in arg.split(",") if n.strip()]
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise CLIError(f"no source named {', '.join(unknown)} (sources: {', '.join(SOURCES)})")
    from cdsjax.io.download import default_root, fetch_sources

    import pathlib

    root = pathlib.Path(args.to).expanduser() if args.to else default_root()
    if root.exists() and not root.is_dir():
        raise CLIError(f"--to {root}: not a directory")
    sources = [SOURCES[n] for n in (names or SOURCES)]

    def log(line: str) -> None:
        print(f"cdsjax data: {line}", file=sys.stderr)

    log(f"benchmark data to {root}: {', '.join(s.name for s in sources)}")
    failures = fetch_sources(root, sources, progress=not args.no_progress and sys.stderr.isatty(), log=log)
    if failures:
        log(f"{len(failures)} files failed (above); run the same command again to resume or refetch them")
        return 1
    log(f"done: use it with --config.data_root={root} or CDSJAX_DATA={root}")
    return 0

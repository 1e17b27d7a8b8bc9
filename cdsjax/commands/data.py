"""``cdsjax data fetch [--to DIR] [--only NAME]``: download the benchmark data and lay it out as ``data_root``.

    cdsjax data fetch                      # to $CDSJAX_DATA, else ../shared/data beside the repository
    cdsjax data fetch --to DIR --only qasper,hotpotqa
    cdsjax data list                       # the sources: size, licence, homepage

Sources (:mod:`cdsjax.io.datasets.sources`): mmlongbench (MMLongBench-Doc questions and PDFs), mmdocir (MMDocIR
annotations), qasper (QASPER test v0.3), hotpotqa (HotpotQA as sampled by HippoRAG), pdfs (PDFs of the parsing
tests). The development subset is laid out (the questions RESULTS.md reports on), not the whole benchmark.

Every download is made by :func:`pooch.retrieve`, with the file's recorded sha256 as its ``known_hash`` where
one is recorded: pooch streams it to a temporary file beside its destination and moves it into place only once
the hash matches (a mismatch or a broken connection leaves nothing there), and a file already in place with
that hash is not downloaded again. A download recorded by its git blob id instead is checked against it here,
and removed when it is not the recorded file. An archive (a download with a ``member``) is unpacked by
:class:`pooch.Untar` or :class:`pooch.Unzip`. A laid-out file is built from its downloads, checked against its
recorded size and sha256, written to a temporary name and renamed into place; its downloads are then removed.
Each failure is one line and the other files go on; exit code 1 when any file failed, and running the same
command again fetches what is missing or failed its check.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pathlib
import shutil
import sys
import tarfile
import zipfile
from typing import Callable, Iterable, List, Optional

from cdsjax.commands import CLIError

USER_AGENT = "cdsjax-data-fetch"


class FetchError(Exception):
    """One file could not be fetched or checked: the message is the failure's one line."""


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    f = sub.add_parser("fetch", help="download, check and lay out the benchmark data",
                       description="Download the benchmark data's sources, check them against the recorded sha256 "
                       "(or git blob id), and lay them out as data_root expects (files already there and checked "
                       "are not downloaded again).")
    f.add_argument("--to", default=None, metavar="DIR",
                   help="the data root to fill (default: $CDSJAX_DATA, else ../shared/data beside the repository)")
    f.add_argument("--only", action="append", default=None, metavar="NAME",
                   help="fetch only these sources (repeat or separate by commas)")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    sub.add_parser("list", help="the sources: files, size, licence, homepage")


def _size(n) -> str:
    return "size unknown" if n is None else f"{n / 1e6:.1f} MB"


def default_root() -> pathlib.Path:
    """Where ``data_root`` looks by default: ``$CDSJAX_DATA`` when set, else ``../shared/data`` beside the
    repository (:data:`cdsjax.io.datasets.common.DEFAULT_DATA_ROOT`)."""
    from cdsjax.io.datasets.common import DEFAULT_DATA_ROOT, REPO_ROOT

    env = os.environ.get("CDSJAX_DATA")
    return pathlib.Path(env) if env else pathlib.Path(os.path.normpath(REPO_ROOT / DEFAULT_DATA_ROOT))


def _git_blob(path: pathlib.Path) -> str:
    """The git blob id of a file: sha1 of ``blob <size>\\0`` and its content."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _mismatch(path: pathlib.Path, want, *, sha256: bool = True) -> Optional[str]:
    """Why the file at ``path`` is not the recorded one (None when it is, or nothing is recorded); ``want`` is a
    :class:`Download` or :class:`Derived` (size, sha256 and, for a download, git blob id when recorded);
    ``sha256=False``: the sha256 is not checked (pooch has just checked it)."""
    import pooch

    size = path.stat().st_size
    if want.size is not None and size != want.size:
        return f"{size} bytes, {want.size} expected"
    checks = [("sha256", sha256 and want.sha256, lambda: pooch.file_hash(str(path))),
              ("git blob", getattr(want, "git_blob", None), lambda: _git_blob(path))]
    for kind, value, digest in checks:
        if value and (got := digest()) != value:
            return f"{kind} {got[:12]}..., {value[:12]}... expected"
    return None


def _file_ok(path: pathlib.Path, want) -> bool:
    return path.is_file() and _mismatch(path, want) is None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:400]


def _retrieve(d, root: pathlib.Path, downloader) -> pathlib.Path:
    """``d`` (a :class:`Download`) at ``root / d.dest`` through :func:`pooch.retrieve`, checked; for an archive,
    the path of its unpacked ``member``."""
    import pooch
    import requests

    path = root / d.dest
    processor = None
    if d.member is not None:
        processor = pooch.Unzip() if d.dest.endswith(".zip") else pooch.Untar()
    try:
        got = pooch.retrieve(d.url, known_hash=f"sha256:{d.sha256}" if d.sha256 else None, fname=path.name,
                             path=path.parent, processor=processor, downloader=downloader)
    except requests.HTTPError as err:
        resp = err.response
        raise FetchError(f"HTTP {resp.status_code} {resp.reason} from {d.url}") from None
    except requests.RequestException as err:
        raise FetchError(f"cannot download {d.url} ({type(err).__name__}: {_one_line(err)}); nothing was kept, "
                         f"the next run fetches it again") from None
    except ValueError as err:  # pooch: the sha256 does not match (the temporary file is deleted)
        raise FetchError(f"not the recorded file: {_one_line(err)} The next run fetches it again.") from None
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as err:
        raise FetchError(f"cannot lay it out from {d.url}: not an archive pooch can unpack "
                         f"({_one_line(err) or type(err).__name__})") from None
    why = _mismatch(path, d, sha256=False)
    if why is not None:
        _remove_download(d, root)
        raise FetchError(f"not the recorded file ({why}); removed, the next run fetches it again")
    if d.member is None:
        return path
    found = [p for p in got if os.path.basename(p) == d.member]
    if not found:
        raise FetchError(f"cannot lay it out from {d.url}: {d.member} is not in the archive")
    return pathlib.Path(found[0])


def _remove_download(d, root: pathlib.Path) -> None:
    """Removes a download and what pooch unpacked from it (``<file>.untar`` / ``<file>.unzip``)."""
    path = root / d.dest
    path.unlink(missing_ok=True)
    for suffix in (".untar", ".unzip"):
        shutil.rmtree(path.with_name(path.name + suffix), ignore_errors=True)
    _prune(path, root)


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _derive(x, root: pathlib.Path, downloader) -> None:
    """The laid-out file ``x`` (a :class:`Derived`): its downloads retrieved, built, checked, written; the
    downloads removed afterwards (only the development subset is kept)."""
    try:
        data = x.build({d.dest: _retrieve(d, root, downloader).read_bytes() for d in x.inputs})
        sha = hashlib.sha256(data).hexdigest()
        if (x.size is not None and len(data) != x.size) or (x.sha256 and sha != x.sha256):
            raise FetchError(f"laid out from {x.inputs[0].url}, it is not the recorded file ({len(data)} bytes, "
                             f"sha256 {sha[:12]}...; {x.size} bytes, {(x.sha256 or '')[:12]}... expected); "
                             f"not written")
    except (FetchError, ValueError, KeyError, TypeError, OSError) as err:  # not the upstream file expected
        for d in x.inputs:  # a download nothing recorded vouches for is fetched again by the next run
            if not (d.sha256 or d.git_blob):
                _remove_download(d, root)
        if isinstance(err, FetchError):
            raise
        raise FetchError(f"cannot lay it out from {', '.join(d.url for d in x.inputs)}: {err}") from None
    _write_atomic(root / x.dest, data)
    for d in x.inputs:
        _remove_download(d, root)


def _prune(path: pathlib.Path, root: pathlib.Path) -> None:
    """Removes the empty directories above ``path`` up to (not including) ``root``."""
    parent = path.parent
    while parent != root and root in parent.parents:
        try:
            parent.rmdir()
        except OSError:
            return
        parent = parent.parent


@contextlib.contextmanager
def _quiet_pooch():
    """pooch's own INFO lines off (each file is reported here, in one line)."""
    import pooch

    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def fetch_sources(root: pathlib.Path, sources: Iterable, *, progress: bool = True, timeout: float = 60.0,
                  log: Callable[[str], None] = print) -> List[str]:
    """Fetches ``sources`` (:class:`cdsjax.io.datasets.sources.Source`) into ``root``; returns the failures,
    one line each (also passed to ``log``, with one line per source that is ready)."""
    import pooch

    from cdsjax.io.datasets.sources import Download

    root = pathlib.Path(root).absolute()
    downloader = pooch.HTTPDownloader(progressbar=progress, timeout=timeout, headers={"User-Agent": USER_AGENT})
    failures: List[str] = []
    with _quiet_pooch():
        for source in sources:
            todo = [d for d in (*source.files, *source.derived) if not _file_ok(root / d.dest, d)]
            count = len(source.files) + len(source.derived)
            if not todo:
                log(f"{source.name}: {count} files already there and checked")
                continue
            failed = len(failures)
            for item in todo:
                try:
                    if isinstance(item, Download):
                        _retrieve(item, root, downloader)
                    else:
                        _derive(item, root, downloader)
                except FetchError as err:
                    failures.append(f"{source.name}: {item.dest}: {err}")
                    log(failures[-1])
            if len(failures) == failed:
                log(f"{source.name}: {count} files ready ({len(todo)} fetched)")
    downloads = root / ".downloads"
    if downloads.is_dir() and not any(p.is_file() for p in downloads.rglob("*")):
        shutil.rmtree(downloads, ignore_errors=True)
    return failures


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
    try:
        import pooch  # noqa: F401
    except ImportError:
        raise CLIError("`cdsjax data fetch` downloads with pooch: pip install 'cdsjax[io]' (or pip install pooch)")
    root = pathlib.Path(args.to).expanduser() if args.to else default_root()
    if root.exists() and not root.is_dir():
        raise CLIError(f"--to {root}: not a directory")
    sources = [SOURCES[n] for n in (names or SOURCES)]

    def log(line: str) -> None:
        print(f"cdsjax data: {line}", file=sys.stderr)

    log(f"benchmark data to {root}: {', '.join(s.name for s in sources)}")
    failures = fetch_sources(root, sources, progress=not args.no_progress and sys.stderr.isatty(), log=log)
    if failures:
        log(f"{len(failures)} files failed (above); run the same command again to fetch them")
        return 1
    log(f"done: use it with --config.data_root={root} or CDSJAX_DATA={root}")
    return 0

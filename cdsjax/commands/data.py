"""``cdsjax data fetch [--to DIR] [--only NAME]``: download the benchmark data and lay it out as ``data_root``.

    cdsjax data fetch                      # to $CDSJAX_DATA, else ../shared/data beside the repository
    cdsjax data fetch --to DIR --only qasper,hotpotqa
    cdsjax data list                       # the sources: size, licence, homepage

Sources (:mod:`cdsjax.io.datasets.sources`): mmlongbench (MMLongBench-Doc questions and PDFs), mmdocir (MMDocIR
annotations), qasper (QASPER test v0.3), hotpotqa (HotpotQA as sampled by HippoRAG), pdfs (PDFs of the parsing
tests). The development subset is laid out (the questions the evaluation reports on), not the whole benchmark.

Every download is made by :func:`pooch.retrieve`, with the file's recorded sha256 as its ``known_hash`` where
one is recorded: pooch streams it to a temporary file beside its destination and moves it into place only once
the hash matches (a mismatch or a broken connection leaves nothing there), and a file already in place with
that hash is not downloaded again. A download recorded by its git blob id instead is checked against it here,
and removed when it is not the recorded file. A download with neither is refused before it is requested,
unless the caller allows it (``--allow-unrecorded``; the file laid out from it is still checked against its
recorded size and sha256). No download is read past its recorded size (or :data:`MAX_DOWNLOAD_BYTES`).

An archive (a download with a ``member``) is never unpacked to disk: the one member the layout needs is read
from it in memory (:func:`read_member`), and only when it is a regular file at a relative path without
``..`` (no link, device or folder; tarfile's ``data`` filter is applied too where Python has it) and the
archive does not expand beyond :data:`MAX_MEMBER_BYTES` or :data:`MAX_RATIO` times its own size on the way
to it: a bomb is refused from its headers, before anything is decompressed or written. A laid-out file is
built from its downloads, checked against its recorded size and sha256, written to a temporary name and
renamed into place; its downloads are then removed. Each failure is one line and the other files go on;
exit code 1 when any file failed, and running the same command again fetches what is missing or failed its
check.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import lzma
import os
import pathlib
import shutil
import sys
import tarfile
import zipfile
import zlib
from typing import Callable, Iterable, List, Optional

from cdsjax.commands import CLIError
from cdsjax.io.util import atomic_write, one_line

USER_AGENT = "cdsjax-data-fetch"
# Bounds on what a download and an archive may make this process read or hold (the real sources are far
# below them: the largest download is the QASPER test archive, its member about 40 MB of JSON).
MAX_DOWNLOAD_BYTES = 512 << 20  # a download whose size is not recorded
MAX_MEMBER_BYTES = 512 << 20  # the bytes an archive may expand to, up to and including the member read
MAX_RATIO = 100  # ... and at most this many times the archive's own size (JSON compresses 5-10x) ...
RATIO_FLOOR_BYTES = 16 << 20  # ... once past this (a small archive's headers and padding compress far better)


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
    f.add_argument("--allow-unrecorded", action="store_true",
                   help="also fetch downloads with no recorded sha256 (the QASPER archive): their bytes are not "
                   "checked, only the file laid out from them")
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


def _recorded(d) -> bool:
    """Whether a download's bytes are checked against a recorded figure (sha256, or git blob id)."""
    return bool(d.sha256 or d.git_blob)


class _TooLarge(Exception):
    pass


class _CappedFile:
    """A file pooch writes a download to that refuses to grow beyond ``limit`` bytes."""

    def __init__(self, f, limit: int):
        self.f, self.limit, self.written = f, limit, 0

    def write(self, chunk: bytes) -> int:
        self.written += len(chunk)
        if self.written > self.limit:
            raise _TooLarge(self.limit)
        return self.f.write(chunk)

    def flush(self) -> None:
        self.f.flush()


class _CappedDownloader:
    """``downloader`` (a pooch downloader) that stops a download at ``limit`` bytes."""

    def __init__(self, downloader, limit: int):
        self.downloader, self.limit = downloader, limit

    def __call__(self, url, output_file, pooch_, check_only=False):
        if check_only:
            return self.downloader(url, output_file, pooch_, check_only=True)
        with open(output_file, "w+b") as f:
            return self.downloader(url, _CappedFile(f, self.limit), pooch_)


def _retrieve(d, root: pathlib.Path, downloader, *, allow_unrecorded: bool = False) -> pathlib.Path:
    """``d`` (a :class:`Download`) at ``root / d.dest`` through :func:`pooch.retrieve`, checked (read no further
    than its recorded size); refused before any request when nothing is recorded for it and
    ``allow_unrecorded`` is False."""
    import pooch
    import requests

    if not (_recorded(d) or allow_unrecorded):
        raise FetchError(f"no sha256 is recorded for {d.url}, so its bytes cannot be checked; not downloaded "
                         f"(--allow-unrecorded fetches it anyway, checking only the file laid out from it)")
    path = root / d.dest
    limit = d.size if d.size is not None else MAX_DOWNLOAD_BYTES
    try:
        pooch.retrieve(d.url, known_hash=f"sha256:{d.sha256}" if d.sha256 else None, fname=path.name,
                       path=path.parent, downloader=_CappedDownloader(downloader, limit))
    except _TooLarge:
        raise FetchError(f"{d.url} sent more than {limit} bytes "
                         f"({'its recorded size' if d.size is not None else 'the limit'}); nothing was kept") from None
    except requests.HTTPError as err:
        resp = err.response
        raise FetchError(f"HTTP {resp.status_code} {resp.reason} from {d.url}") from None
    except requests.RequestException as err:
        raise FetchError(f"cannot download {d.url} ({type(err).__name__}: {one_line(err)}); nothing was kept, "
                         f"the next run fetches it again") from None
    except ValueError as err:  # pooch: the sha256 does not match (the temporary file is deleted)
        raise FetchError(f"not the recorded file: {one_line(err)} The next run fetches it again.") from None
    why = _mismatch(path, d, sha256=False)
    if why is not None:
        _remove_download(d, root)
        raise FetchError(f"not the recorded file ({why}); removed, the next run fetches it again")
    return path


def _download_bytes(d, root: pathlib.Path, downloader, *, allow_unrecorded: bool = False) -> bytes:
    """The bytes a derived file is built from: the download, or for an archive its ``member``."""
    path = _retrieve(d, root, downloader, allow_unrecorded=allow_unrecorded)
    if d.member is None:
        return path.read_bytes()
    try:
        return read_member(path, d.member)
    except ArchiveError as err:
        raise FetchError(f"cannot lay it out from {d.url}: {err}") from None


class ArchiveError(Exception):
    """An archive refused or unreadable: the message is one line."""


def _unsafe_name(name: str) -> Optional[str]:
    """Why an archive member's name is not a plain relative path (None when it is)."""
    parts = name.replace("\\", "/").split("/")
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in parts:
        return "a path climbing out with '..'"
    if "\x00" in name:
        return "a NUL byte in its name"
    return None


def _expansion_limit(archive_size: int) -> int:
    return min(MAX_MEMBER_BYTES, max(RATIO_FLOOR_BYTES, MAX_RATIO * archive_size))


def read_member(archive: pathlib.Path, member: str) -> bytes:
    """The content of the file named ``member`` (found in any folder) of a .tar(.gz/.bz2/.xz) or .zip archive,
    read in memory; nothing is unpacked to disk.

    Refused (:class:`ArchiveError`, one line) when the member is not there or there more than once, when it is
    not a regular file (a link, hard link, device, folder) or its name is absolute or climbs with ``..``, and
    when the archive would expand to more than :data:`MAX_MEMBER_BYTES` or :data:`MAX_RATIO` times its own
    size on the way to it (judged from its headers before the bytes are decompressed).
    """
    archive = pathlib.Path(archive)
    limit = _expansion_limit(archive.stat().st_size)
    try:
        if zipfile.is_zipfile(archive):
            return _zip_member(archive, member, limit)
        return _tar_member(archive, member, limit)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, zlib.error, lzma.LZMAError) as err:
        raise ArchiveError(f"not an archive that can be read ({one_line(err)})") from None


def _refuse(member_name: str, why: str) -> ArchiveError:
    return ArchiveError(f"refusing the archive: member {member_name[:120]!r} is {why}")


def _bomb(limit: int) -> ArchiveError:
    return ArchiveError(f"refusing the archive: it expands to more than {limit} bytes "
                        f"(at most {MAX_MEMBER_BYTES} bytes, or {MAX_RATIO} times its own size, are read)")


def _tar_member(archive: pathlib.Path, member: str, limit: int) -> bytes:
    with tarfile.open(archive, mode="r:*") as tar:
        found = None
        # members one at a time: each header says how far the stream goes before the next one, so a bomb is
        # refused before its bytes are decompressed (listing the archive whole would decompress it all)
        while True:
            info = tar.next()
            if info is None:
                break
            if info.offset_data + info.size > limit:
                raise _bomb(limit)
            if os.path.basename(info.name.rstrip("/")) != member:
                continue
            if found is not None:
                raise ArchiveError(f"refusing the archive: it holds {member!r} more than once")
            why = _unsafe_name(info.name)
            if why is None and not info.isreg():
                why = "a link" if (info.issym() or info.islnk()) else "not a regular file"
            if why is None and hasattr(tarfile, "data_filter"):  # the library's own rules, where Python has them
                try:
                    tarfile.data_filter(info, str(archive.parent))
                except tarfile.FilterError as err:
                    why = f"refused by tarfile's data filter ({one_line(err)})"
            if why is not None:
                raise _refuse(info.name, why)
            found = info
        if found is None:
            raise ArchiveError(f"{member} is not in the archive")
        f = tar.extractfile(found)
        data = f.read(found.size + 1)
        if len(data) != found.size:
            raise ArchiveError(f"{member} is cut short in the archive")
        return data


def _zip_member(archive: pathlib.Path, member: str, limit: int) -> bytes:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()  # the central directory: names and sizes, nothing inflated
        matches = [i for i in infos if os.path.basename(i.filename.rstrip("/")) == member]
        if not matches:
            raise ArchiveError(f"{member} is not in the archive")
        if len(matches) > 1:
            raise ArchiveError(f"refusing the archive: it holds {member!r} more than once")
        info = matches[0]
        why = _unsafe_name(info.filename)
        mode = (info.external_attr >> 16) & 0o170000
        if why is None and (info.is_dir() or mode not in (0, 0o100000)):
            why = "a link" if mode == 0o120000 else "not a regular file"
        if why is not None:
            raise _refuse(info.filename, why)
        if info.file_size > limit:  # a bomb, refused from its declared size before anything is inflated
            raise _bomb(limit)
        with zf.open(info) as f:  # reads no more than the declared size (and checks its CRC)
            data = f.read(limit + 1)
        if len(data) != info.file_size:
            raise ArchiveError(f"{member} does not have the size the archive declares")
        return data


def _remove_download(d, root: pathlib.Path) -> None:
    """Removes a download and what pooch unpacked from it (``<file>.untar`` / ``<file>.unzip``)."""
    path = root / d.dest
    path.unlink(missing_ok=True)
    for suffix in (".untar", ".unzip"):
        shutil.rmtree(path.with_name(path.name + suffix), ignore_errors=True)
    _prune(path, root)


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)


def _derive(x, root: pathlib.Path, downloader, *, allow_unrecorded: bool = False) -> None:
    """The laid-out file ``x`` (a :class:`Derived`): its downloads retrieved, built, checked, written; the
    downloads removed afterwards (only the development subset is kept)."""
    try:
        data = x.build({d.dest: _download_bytes(d, root, downloader, allow_unrecorded=allow_unrecorded)
                        for d in x.inputs})
        sha = hashlib.sha256(data).hexdigest()
        if (x.size is not None and len(data) != x.size) or (x.sha256 and sha != x.sha256):
            raise FetchError(f"laid out from {x.inputs[0].url}, it is not the recorded file ({len(data)} bytes, "
                             f"sha256 {sha[:12]}...; {x.size} bytes, {(x.sha256 or '')[:12]}... expected); "
                             f"not written")
    except (FetchError, ValueError, KeyError, TypeError, OSError) as err:  # not the upstream file expected
        for d in x.inputs:  # a download nothing recorded vouches for is fetched again by the next run
            if not _recorded(d):
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
                  log: Callable[[str], None] = print, allow_unrecorded: bool = False) -> List[str]:
    """Fetches ``sources`` (:class:`cdsjax.io.datasets.sources.Source`) into ``root``; returns the failures,
    one line each (also passed to ``log``, with one line per source that is ready). A download with no
    recorded sha256 or git blob id is refused (one failure line) unless ``allow_unrecorded``."""
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
                        _retrieve(item, root, downloader, allow_unrecorded=allow_unrecorded)
                    else:
                        _derive(item, root, downloader, allow_unrecorded=allow_unrecorded)
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
    failures = fetch_sources(root, sources, progress=not args.no_progress and sys.stderr.isatty(), log=log,
                             allow_unrecorded=args.allow_unrecorded)
    if failures:
        log(f"{len(failures)} files failed (above); run the same command again to fetch them")
        return 1
    log(f"done: use it with --config.data_root={root} or CDSJAX_DATA={root}")
    return 0

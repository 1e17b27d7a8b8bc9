"""Downloads the benchmark data's sources (:mod:`cdsjax.io.datasets.sources`) and lays them out under a data root.

Nothing is half-written: a download goes to ``<file>.part`` and is renamed into place once its size and sha256
(or git blob id) match the recorded figures; a derived file is written to a temporary name and renamed once it
matches. An interrupted download resumes from its ``.part`` on the next run (an HTTP Range request); a file
that fails its check is removed, so the next run fetches it again. Each failure is one line; the other files go
on.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import pathlib
import shutil
import urllib.error
import urllib.request
from typing import Callable, Dict, Iterable, List, Optional

from cdsjax.io.datasets.sources import Derived, Download, Source

__all__ = ["FetchError", "default_root", "fetch_sources", "file_digest"]

CHUNK = 1 << 16
USER_AGENT = "cdsjax-data-fetch"


class FetchError(Exception):
    """One file could not be fetched or checked: the message is the failure's one line."""


def default_root() -> pathlib.Path:
    """Where ``data_root`` looks by default: ``$CDSJAX_DATA`` when set, else ``../shared/data`` beside the
    repository (:data:`cdsjax.io.datasets.common.DEFAULT_DATA_ROOT`)."""
    from cdsjax.io.datasets.common import DEFAULT_DATA_ROOT, REPO_ROOT

    env = os.environ.get("CDSJAX_DATA")
    return pathlib.Path(env) if env else pathlib.Path(os.path.normpath(REPO_ROOT / DEFAULT_DATA_ROOT))


def file_digest(path: pathlib.Path, size: int) -> Dict[str, str]:
    """sha256 and git blob id (sha1 of ``blob <size>\\0`` + content) of a file, read once."""
    sha256, blob = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha256.update(chunk)
            blob.update(chunk)
    return {"sha256": sha256.hexdigest(), "git_blob": blob.hexdigest()}


def _mismatch(size: int, digest: Callable[[], Dict[str, str]], want) -> Optional[str]:
    """Why a file of ``size`` bytes is not the recorded one (None when it is, or nothing is recorded)."""
    if want.size is not None and size != want.size:
        return f"{size} bytes, {want.size} expected"
    checks = [(k, getattr(want, k, None)) for k in ("sha256", "git_blob")]
    checks = [(k, v) for k, v in checks if v]
    if checks:
        got = digest()
        for kind, value in checks:
            if got[kind] != value:
                return f"{kind.replace('_', ' ')} {got[kind][:12]}..., {value[:12]}... expected"
    return None


def _file_ok(path: pathlib.Path, want) -> bool:
    if not path.is_file():
        return False
    size = path.stat().st_size
    return _mismatch(size, lambda: file_digest(path, size), want) is None


def _download(d: Download, path: pathlib.Path, bar, timeout: float) -> None:
    """``d.url`` to ``path`` through ``path.part`` (resumed when there), checked, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    if d.size is not None and have > d.size:
        part.unlink()
        have = 0
    headers = {"User-Agent": USER_AGENT, **({"Range": f"bytes={have}-"} if have else {})}
    try:
        resp = urllib.request.urlopen(urllib.request.Request(d.url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as err:
        if not (err.code == 416 and have):  # 416: nothing past what the .part holds; check it below
            raise FetchError(f"HTTP {err.code} {err.reason} from {d.url}") from None
        resp = None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise FetchError(f"cannot download {d.url}: {reason}") from None
    if resp is not None:
        with resp:
            if have and resp.status == 206 and resp.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
                mode = "ab"
            else:
                mode, have = "wb", 0  # the server sent the whole file
            length = resp.headers.get("Content-Length")
            total = have + int(length) if length and length.isdigit() else d.size
            bar.update(have)
            got = have
            with open(part, mode) as f:
                while True:
                    try:
                        chunk = resp.read(CHUNK)
                    except (http.client.IncompleteRead, OSError):
                        chunk = b""
                    if not chunk:
                        break
                    f.write(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
        if total is not None and got < total:
            raise FetchError(f"download stopped after {got} of {total} bytes (kept; the next run resumes it)")
    size = part.stat().st_size
    why = _mismatch(size, lambda: file_digest(part, size), d)
    if why is not None:
        part.unlink()
        raise FetchError(f"not the recorded file ({why}); removed, the next run fetches it again")
    os.replace(part, path)


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _derive(x: Derived, root: pathlib.Path, bar, timeout: float) -> None:
    for d in x.inputs:
        if not _file_ok(root / d.dest, d):
            _download(d, root / d.dest, bar, timeout)
        else:
            bar.update(d.size or 0)
    try:
        data = x.build({d.dest: (root / d.dest).read_bytes() for d in x.inputs})
        why = _mismatch(len(data), lambda: {"sha256": hashlib.sha256(data).hexdigest()}, x)
        if why is not None:
            raise FetchError(f"laid out from {x.inputs[0].url}, it is not the recorded file ({why}); not written")
    except (FetchError, ValueError, KeyError, TypeError, OSError) as err:  # not the upstream file expected
        for d in x.inputs:  # an input nothing recorded vouches for is fetched again by the next run
            if not (d.sha256 or d.git_blob):
                (root / d.dest).unlink(missing_ok=True)
        if isinstance(err, FetchError):
            raise
        raise FetchError(f"cannot lay it out from {', '.join(d.url for d in x.inputs)}: {err}") from None
    _write_atomic(root / x.dest, data)
    for d in x.inputs:  # the full upstream file is not kept: only the development subset is laid out
        (root / d.dest).unlink(missing_ok=True)
        _prune(root / d.dest, root)


def _prune(path: pathlib.Path, root: pathlib.Path) -> None:
    """Removes the empty directories above ``path`` up to (not including) ``root``."""
    parent = path.parent
    while parent != root and root in parent.parents:
        try:
            parent.rmdir()
        except OSError:
            return
        parent = parent.parent


def fetch_sources(root: pathlib.Path, sources: Iterable[Source], *, progress: bool = True, timeout: float = 60.0,
                  log: Callable[[str], None] = print) -> List[str]:
    """Fetches ``sources`` into ``root``; returns the failures, one line each (also passed to ``log``, with one
    line per source that is ready)."""
    from tqdm.auto import tqdm

    root = pathlib.Path(root)
    failures: List[str] = []
    for source in sources:
        todo_files = [d for d in source.files if not _file_ok(root / d.dest, d)]
        todo_derived = [x for x in source.derived if not _file_ok(root / x.dest, x)]
        count = len(source.files) + len(source.derived)
        if not todo_files and not todo_derived:
            log(f"{source.name}: {count} files already there and checked")
            continue
        known = [d.size for d in todo_files] + [i.size for x in todo_derived for i in x.inputs]
        total = None if any(s is None for s in known) else sum(known)
        failed = len(failures)
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=source.name,
                  disable=not progress, leave=False) as bar:
            for item in [*todo_files, *todo_derived]:
                try:
                    if isinstance(item, Download):
                        _download(item, root / item.dest, bar, timeout)
                    else:
                        _derive(item, root, bar, timeout)
                except FetchError as err:
                    failures.append(f"{source.name}: {item.dest}: {err}")
                    log(failures[-1])
        if len(failures) == failed:
            log(f"{source.name}: {count} files ready ({len(todo_files) + len(todo_derived)} fetched)")
    downloads = root / ".downloads"
    if downloads.is_dir() and not any(downloads.rglob("*")):
        shutil.rmtree(downloads, ignore_errors=True)
    return failures

"""What a request to ``cdsjax serve`` may ask for: option values, Host names, tokens and files.

:class:`cdsjax.commands.guard.Guard` decides who may ask, how much and for how long; this module holds the
rules it and the handlers (:mod:`cdsjax.commands.server`) apply to the values a request carries, so each rule
lives in one place:

- :func:`check_http_options`: a per-selector allow-list of solver options, with strict types and bounds;
- :func:`parse_host`: the whole ``Host`` header (name and port), anything else refused;
- :func:`token_matches`, :func:`token_from_header`, :func:`token_from_cookie`, :func:`token_from_query`:
  tokens are compared as bytes, in constant time, whatever characters they hold;
- paths: :func:`public_path` and :func:`scrub` (no server path leaves the server), :func:`read_checked`
  (a file read without following a link and kept only if the bytes read have the recorded sha256), used by
  :func:`read_crop` and :class:`PdfFiles`.

Nothing here imports the web framework, so it is cheap to test on its own.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import os
import re
import stat
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple
from urllib.parse import parse_qs, quote, unquote_to_bytes

MAX_BUDGET = 512
# The most evidence tokens a request may ask the reader to read (a 128k-token window, the largest commonly served).
MAX_EVIDENCE_TOKENS = 131072
MAX_QUESTION_CHARS = 4000
MAX_ECHO_CHARS = 200  # a request value quoted back in an error is cut to this
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
TOKEN_COOKIE = "cdsjax_token"
DEFAULT_MAX_PDF_MB = 256
MAX_CROP_BYTES = 32 << 20
FLOAT32_MAX = 3.4028234663852886e38  # selection runs in float32: a larger option value would become inf

# The options an HTTP request may set, by name, with their types and, for those that set how much work a
# request costs, the HTTP policy's bounds (tighter than SolveOptions' own hard limits, which every caller
# gets: a request's solve stays within seconds on a few thousand notes). A selector accepts those of them
# its registry spec declares (SelectorSpec.options); everything else (solver, params, the
# affinity's shape fields, ...) is refused with 400.
HTTP_MAX_ITER = 20_000  # twice paper mode's 10,000 steps
HTTP_MIN_TOL = 1e-12
HTTP_MAX_SUPPORT_STEPS = 40  # twice cds-support's default bisection
HTTP_OPTIONS = dict(
    beta=(float,), tau=(float,), threshold=(float,), init=(str,), prior_temperature=(float,), fill=(bool,),
    peel=(bool,), lam=(float,), theta=(float,), quality=(str,), damping=(float,), temperature=(float,),
    tol=(float, HTTP_MIN_TOL, 1.0), max_iter=(int, 1, HTTP_MAX_ITER), num_steps=(int, 1, HTTP_MAX_SUPPORT_STEPS),
)


def echo(value) -> str:
    """``repr(value)`` cut to :data:`MAX_ECHO_CHARS`, for quoting a request value back in an error."""
    text = repr(value)
    return text if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + "..."


def is_text(value) -> bool:
    """True for a string that is valid Unicode throughout (JSON can carry lone surrogates; UTF-8 cannot)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _typed(kind: type, value):
    """``value`` as an option of type ``kind`` (a float option takes an int too), or None if it is not one.

    Strict: a string is never a number, a bool never an int or a float, and a float option must be finite
    in float32, the precision selection runs in (an integer too large for a float, or a float beyond
    float32's range, is refused rather than overflowing later).
    """
    if kind is bool:
        return value if isinstance(value, bool) else None
    if kind is str:
        return value if isinstance(value, str) and len(value) <= 40 and is_text(value) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if kind is int:
        return value if isinstance(value, int) else None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and abs(number) <= FLOAT32_MAX else None


def finite(value):
    """``value`` (an answer's JSON) with every non-finite float replaced by None: JSON has no inf or NaN, and
    a diagnostic that overflowed must not turn an answer into an error."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def check_http_options(selector, options: dict) -> dict:
    """The request's options if every one is on the selector's allow-list with the right type and bounds.

    Args:
      selector: the selector's spec (as :func:`cdsjax.pipeline.catalog.resolve` returns it) or name.
      options: the request's ``options`` object.

    Returns:
      The options, float-typed ones as Python floats.

    Raises:
      ValueError: one line naming the option.
    """
    from cdsjax.pipeline.catalog import selector_spec

    spec = selector_spec(selector)
    allowed = {name: HTTP_OPTIONS[name] for name in spec.options if name in HTTP_OPTIONS}
    checked = {}
    for name, value in options.items():
        if name not in allowed:
            raise ValueError(f"option {echo(name)} is not accepted for selector {spec.name!r} over HTTP; "
                             f"accepted: {sorted(allowed) or 'none'}")
        kind, *bounds = allowed[name]
        typed = _typed(kind, value)
        if typed is None:
            raise ValueError(f"option {name!r} must be a {'finite number' if kind is float else kind.__name__}, "
                             f"got {echo(value)}")
        if bounds and not bounds[0] <= typed <= bounds[1]:
            raise ValueError(f"option {name!r} must be in [{bounds[0]:g}, {bounds[1]:g}] over HTTP, got {echo(value)}")
        checked[name] = typed
    return checked


# ------------------------------------------------------------------ Host header

_HOST = re.compile(r"(?P<name>\[[0-9a-f:.]+\]|[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?)(?::(?P<port>[0-9]{1,5}))?")


def parse_host(header: str) -> Optional[Tuple[str, Optional[int]]]:
    """``(name, port or None)`` of a whole ``Host`` header, or None if it is anything but a host name, an IPv4
    address or a bracketed IPv6 address, optionally followed by ``:PORT`` (1-65535). Lower-cased; IPv6 keeps
    its brackets (``[::1]``)."""
    match = _HOST.fullmatch(header.lower())
    if match is None:
        return None
    name, port = match["name"], match["port"]
    if name.startswith("["):
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            return None
    if port is not None and not 1 <= int(port) <= 65535:
        return None
    return name, int(port) if port is not None else None


def is_loopback(host: str) -> bool:
    """True for names and addresses that reach only this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------ tokens (bytes, constant time)


def token_matches(given: Optional[bytes], token: bytes) -> bool:
    return bool(given) and hmac.compare_digest(given, token)


def token_from_header(authorization: bytes) -> Optional[bytes]:
    """The token of an ``Authorization: Bearer T`` header value (raw bytes, as the client sent them)."""
    scheme, _, value = authorization.strip().partition(b" ")
    return value.strip() if scheme.lower() == b"bearer" else None


def cookie_value(token: bytes) -> str:
    """The token as a cookie value (percent-encoded: a cookie is ASCII whatever the token holds)."""
    return quote(token, safe="")


def token_from_cookie(cookie: bytes) -> Optional[bytes]:
    for part in cookie.split(b";"):
        name, _, value = part.strip().partition(b"=")
        if name == TOKEN_COOKIE.encode():
            return unquote_to_bytes(value)
    return None


def token_from_query(query: bytes) -> Optional[bytes]:
    """The ``token`` parameter of a query string, percent-decoded to bytes."""
    values = parse_qs(query.decode("latin-1"), encoding="latin-1").get("token")
    return values[0].encode("latin-1") if values else None


# ------------------------------------------------------------------ paths and files


def public_path(path: Optional[str], roots) -> Optional[str]:
    """``path`` relative to the index root that holds it (``crops/...``), so no server path leaves the server."""
    if not path:
        return path
    for root in roots:
        prefix = str(root).rstrip(os.sep) + os.sep
        if str(path).startswith(prefix):
            return str(path)[len(prefix):]
    return os.path.basename(str(path))


def scrub(message: str, roots) -> str:
    """``message`` with the server's index directories and home directory replaced by short names."""
    for root in sorted((str(r) for r in roots), key=len, reverse=True):
        message = message.replace(root, f"<index {os.path.basename(root.rstrip(os.sep))}>")
    home = os.path.expanduser("~")
    return message.replace(home, "~") if home not in ("", "/") else message


def read_checked(path: str, expected_sha: Optional[str], max_bytes: int, prefix: bytes = b"") -> Optional[bytes]:
    """The bytes of the regular file at ``path`` if they have the sha256 ``expected_sha``, else None.

    The file is opened without following a final symlink (nor blocking on a FIFO), its size checked against
    ``max_bytes`` before anything is read, and the bytes returned are the very bytes hashed: nothing is
    re-opened afterwards, so a file swapped or rewritten meanwhile is either refused or served as it was
    checked. Blocking (the whole file is read): call it off the event loop for anything large.
    """
    if not expected_sha:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return None
        data = bytearray(info.st_size)
        view, got = memoryview(data), 0
        while got < info.st_size:
            n = os.readv(fd, [view[got:]])
            if n == 0:  # shrank meanwhile
                return None
            got += n
        if os.read(fd, 1):  # grew meanwhile
            return None
    except OSError:
        return None
    finally:
        os.close(fd)
    if not data.startswith(prefix) or hashlib.sha256(data).hexdigest() != expected_sha:
        return None
    return bytes(data)


def read_crop(path: str, roots, expected_sha: Optional[str]) -> Optional[bytes]:
    """The bytes of a crop if it is still a regular file inside one of ``roots`` with its recorded sha256."""
    real = os.path.realpath(path)
    if not any(os.path.commonpath([real, os.path.realpath(r)]) == os.path.realpath(r) for r in roots):
        return None
    return read_checked(path, expected_sha, MAX_CROP_BYTES)


class PdfFiles:
    """The source PDFs of the loaded indexes, by document id (the request never names a path).

    Every :meth:`read` opens the document's recorded file afresh without following a link and serves the bytes
    it read only if they start like a PDF and have the recorded sha256; nothing is cached across requests, so a
    file gone, changed, replaced by a link or restored is answered as it is now. The recorded file is the
    entry's ``resolved`` path (the real file, every symlink resolved when it was indexed and hashed), so a
    document indexed through a link is served; an entry without one (an index written before it was recorded)
    is served from its ``path`` only while that is not a link.
    """

    def __init__(self, roots: Sequence[str], max_bytes: int = DEFAULT_MAX_PDF_MB << 20):
        from cdsjax.io.store import index_name, read_manifest

        self.max_bytes = max_bytes
        self._entries: Dict[str, dict] = {}
        self.index_of: Dict[str, str] = {}  # document id -> the name of the index that holds it
        for root in roots:
            manifest = read_manifest(Path(root)) or {}
            for entry in manifest.get("documents", []):
                if isinstance(entry, dict) and entry.get("doc_id") is not None and entry.get("path"):
                    self._entries.setdefault(str(entry["doc_id"]), entry)
                    self.index_of.setdefault(str(entry["doc_id"]), index_name(root))

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._entries

    def read(self, doc_id: str) -> Optional[bytes]:
        """The PDF of ``doc_id`` as checked now, or None (unknown id, no recorded hash, file gone, changed,
        a link, not a PDF, or over ``max_bytes``). Blocking: call it off the event loop."""
        entry = self._entries.get(doc_id)
        if entry is None:
            return None
        path = entry.get("resolved") or entry["path"]
        return read_checked(str(path), entry.get("sha256"), self.max_bytes, prefix=b"%PDF-")

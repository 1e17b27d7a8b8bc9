"""What keeps ``cdsjax serve`` safe to expose: who may ask, how much, and for how long.

:class:`Guard` is a plain ASGI middleware in front of the FastAPI application. For every HTTP request it
checks, in this order and before any byte of the body is parsed (the rules on values it applies live in
:mod:`cdsjax.commands.policy`):

1. the whole ``Host`` header (name and port) against the names the server answers to (DNS rebinding: a web
   page the user visits cannot reach a loopback server through a name of its own) -> 400;
2. the bearer token, when one is set (``Authorization: Bearer T``, or the cookie that ``/?token=T`` sets for
   the web page), compared as bytes -> 401; the page itself (``GET /``) is static and needs none;
3. the body size, from ``Content-Length`` and again while reading -> 413;
4. the upload: a request with a body holds one of ``uploads`` upload slots until its body has arrived, and
   must finish within ``body_timeout`` seconds -> 408 (slot freed). When every upload slot is held, a new
   upload takes the slot of the oldest one that has already run longer than :data:`SLOW_UPLOAD_S` (a normal
   body arrives in milliseconds), which gets 408; only a flood of fresh uploads makes a new one wait for
   nothing but a 503. So uploads that trickle in, however many, never hold the question slots below, and
   never keep a normal question out;
5. admission: at most ``queue`` question requests at once whose body has arrived (waiting or running)
   -> 503 with ``Retry-After``;
6. the deadline: a question request that has not answered after its deadline gets 504 and its slot back;
   a client that disconnects gets its slot back at once.

JAX computations cannot be interrupted mid-call, so the server bounds a request's work twice: the options a
request may set are an allow-list with hard limits (``cdsjax.core.SolveOptions``), and the selection runs on
a :class:`Lane`, a worker thread the request waits on. A request that times out or whose client leaves
*abandons* its job: the job keeps its thread until it ends by itself (its work is bounded), the next job
starts on a fresh thread at once, and while ``max_abandoned`` jobs are still running new questions get 503
instead of piling more work on the machine. Threads are daemons, so SIGTERM never waits for them.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import threading
from typing import Callable, FrozenSet, List, Optional

from cdsjax.commands import policy

QUESTION_PATHS = frozenset({"/ask", "/select"})
SLOW_UPLOAD_S = 1.0  # an upload still arriving after this long may give its slot to a new one


class Busy(Exception):
    """Too many abandoned jobs are still running: the request is refused with 503."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the guard enforces.

    Attributes:
      queue: most question requests admitted at once (body arrived, waiting or running).
      max_body: most bytes of a request body.
      request_timeout: seconds a /select may take from admission to answer (queueing included).
      read_timeout: extra seconds an /ask may take for reading (the reader's own timeout), 0 without a reader.
      allowed_hosts: ``Host`` names accepted; None accepts any well-formed one (``--allowed-host '*'``).
      token: the bearer token every request but the page must carry, or None.
      body_timeout: seconds a request body may take to arrive, from the end of its headers.
      uploads: most requests whose body is still arriving (the upload slots).
    """

    queue: int = 32
    max_body: int = 64 * 1024
    request_timeout: float = 30.0
    read_timeout: float = 0.0
    allowed_hosts: Optional[FrozenSet[str]] = policy.LOOPBACK_NAMES
    token: Optional[str] = None
    body_timeout: float = 5.0
    uploads: int = 64

    def deadline(self, path: str) -> float:
        return self.request_timeout + (self.read_timeout if path == "/ask" else 0.0)


@dataclasses.dataclass
class Traffic:
    """What the guard counts (read by ``/health``): admitted question requests, uploads still arriving, and
    refusals by kind. Only :class:`Guard` and the handlers' :meth:`count` change it."""

    in_flight: int = 0
    uploading: int = 0
    refused: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def count(self, kind: str) -> None:
        self.refused[kind] += 1


@dataclasses.dataclass
class _Upload:
    started: float
    cut: asyncio.Future


class Lane:
    """Runs blocking jobs on daemon threads, ``concurrency`` at a time, and lets a waiting request give up.

    A job whose awaiting request is cancelled (deadline, disconnect, shutdown) is abandoned: its slot is
    released at once and the job finishes on its own thread. ``max_abandoned`` such jobs may run at once;
    beyond that :meth:`run` raises :class:`Busy`.
    """

    def __init__(self, name: str, concurrency: int = 1, max_abandoned: int = 2):
        self.name = name
        self.concurrency = concurrency
        self.max_abandoned = max_abandoned
        self._slots: Optional[asyncio.Semaphore] = None
        self._lock = threading.Lock()
        self.abandoned = 0
        self.threads: set = set()

    async def run(self, fn: Callable, *args):
        """``fn(*args)`` on a worker thread; its result, or its exception re-raised here."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        async with self._slots:
            if self.abandoned >= self.max_abandoned:
                raise Busy(f"{self.abandoned} earlier computations that ran past their deadline are still "
                           "finishing")
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            state = {"abandoned": False}

            def finish(setter, value):
                if not done.done():
                    setter(value)

            def work():
                try:
                    value = fn(*args)
                except BaseException as err:  # noqa: BLE001 - handed to the awaiting request
                    outcome = (done.set_exception, err)
                else:
                    outcome = (done.set_result, value)
                with self._lock:
                    self.threads.discard(threading.current_thread())
                    if state["abandoned"]:
                        self.abandoned -= 1
                        return
                try:
                    loop.call_soon_threadsafe(finish, *outcome)
                except RuntimeError:  # the loop is closed: the server stopped meanwhile
                    pass

            thread = threading.Thread(target=work, name=f"cdsjax-{self.name}", daemon=True)
            with self._lock:
                self.threads.add(thread)
            thread.start()
            try:
                return await asyncio.shield(done)
            except asyncio.CancelledError:
                with self._lock:
                    if thread in self.threads:
                        state["abandoned"] = True
                        self.abandoned += 1
                raise

    def running(self) -> int:
        """Jobs whose threads are still alive (abandoned ones included)."""
        with self._lock:
            return len(self.threads)


class Guard:
    """The ASGI middleware described in the module docstring; ``traffic`` is what it counts."""

    def __init__(self, app, limits: Limits, traffic: Traffic):
        self.app = app
        self.limits = limits
        self.traffic = traffic
        self._token = limits.token.encode("utf-8") if limits.token is not None else None
        self._uploads: List[_Upload] = []  # oldest first

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        path = scope.get("path", "")
        refusal = self.check_host(headers) or self.check_token(scope, headers, path)
        if refusal is not None:
            return await self.reply(send, *refusal)
        if path == "/" and scope.get("method") == "GET" and self._token is not None:
            cookie = policy.token_from_query(scope.get("query_string", b""))
            if policy.token_matches(cookie, self._token):  # /?token=T: a same-site cookie, dropped from the URL
                return await self.set_cookie(send, cookie)
        length = headers.get("content-length", b"").decode("latin-1")
        if length and (not length.isdigit() or len(length) > 18 or int(length) > self.limits.max_body):
            return await self.reply(send, 413, f"request body over the limit of {self.limits.max_body} bytes")
        has_body = (length not in ("", "0")) or "transfer-encoding" in headers
        body = await self.read_body(receive, send, has_body)
        if body is None:  # answered (408, 413, 503) or the client left
            return
        question = path in QUESTION_PATHS and scope.get("method") == "POST"
        if question and self.traffic.in_flight >= self.limits.queue:
            return await self.reply(send, 503, f"server busy: {self.traffic.in_flight} requests in flight "
                                    f"(limit {self.limits.queue}); retry later", {"retry-after": "1"})
        if question:
            self.traffic.in_flight += 1
        try:
            await self.handle(scope, body, receive, send, path, question)
        finally:
            if question:
                self.traffic.in_flight -= 1

    def make_room(self, now: float) -> bool:
        """True if a new upload may start: a slot is free, or the oldest slow upload is cut off for it."""
        active = [u for u in self._uploads if not u.cut.done()]
        if len(active) < self.limits.uploads:
            return True
        if now - active[0].started < SLOW_UPLOAD_S:
            return False
        active[0].cut.set_result(True)
        return True

    async def read_body(self, receive, send, has_body: bool) -> Optional[bytes]:
        """The whole request body, or None once the request is answered (or its client left)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        upload = None
        if has_body:
            if not self.make_room(now):
                return await self.reply(send, 503, f"server busy: {len(self._uploads)} uploads in progress "
                                        f"(limit {self.limits.uploads}); retry later", {"retry-after": "1"})
            upload = _Upload(now, loop.create_future())
            self._uploads.append(upload)
            self.traffic.uploading += 1
        deadline = now + self.limits.body_timeout
        body = bytearray()
        try:
            while True:
                message = asyncio.ensure_future(receive())
                waits = {message, upload.cut} if upload is not None else {message}
                try:
                    done, _ = await asyncio.wait(waits, timeout=max(0.0, deadline - loop.time()),
                                                 return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:  # the server is stopping
                    message.cancel()
                    raise
                if message not in done:
                    message.cancel()
                    cut = upload is not None and upload.cut.done()
                    self.traffic.count("upload_cut" if cut else "slow_upload")
                    why = ("it was still arriving when the upload slots were needed" if cut
                           else f"it did not arrive within {self.limits.body_timeout:g} s")
                    return await self.reply(send, 408, f"request body too slow: {why}", {"connection": "close"})
                message = message.result()
                if message["type"] == "http.disconnect":
                    return None
                body += message.get("body", b"")
                if len(body) > self.limits.max_body:
                    return await self.reply(send, 413, f"request body over the limit of {self.limits.max_body} "
                                            "bytes", {"connection": "close"})
                if not message.get("more_body", False):
                    return bytes(body)
        finally:
            if upload is not None:
                self._uploads.remove(upload)
                self.traffic.uploading -= 1

    async def handle(self, scope, body: bytes, receive, send, path: str, question: bool):
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        started = False

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        if not question:
            return await self.app(scope, replay, tracked_send)
        app_task = asyncio.ensure_future(self.app(scope, replay, tracked_send))
        watch = asyncio.ensure_future(self.wait_disconnect(receive))
        shutting_down = False
        try:
            finished, _ = await asyncio.wait({app_task, watch}, timeout=self.limits.deadline(path),
                                             return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server is stopping (SIGTERM) and cancels what is still running
            finished, shutting_down = set(), True
        finally:
            watch.cancel()
        if app_task in finished:
            return app_task.result()
        app_task.cancel()  # its selection job, if running, is abandoned (see Lane)
        try:
            await app_task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the request is over either way
            pass
        if shutting_down:
            if not started:
                await self.reply(send, 503, "the server is shutting down")
            return
        if watch in finished:
            self.traffic.count("disconnected")
            return
        self.traffic.count("timeout")
        if not started:
            await self.reply(send, 504, f"the request ran past its deadline of {self.limits.deadline(path):g} s")

    @staticmethod
    async def wait_disconnect(receive):
        while (await receive())["type"] != "http.disconnect":
            pass

    def check_host(self, headers: dict):
        allowed = self.limits.allowed_hosts
        raw = headers.get("host", b"")
        parsed = policy.parse_host(raw.decode("latin-1"))
        if parsed is not None and (allowed is None or parsed[0] in allowed):
            return None
        if allowed is None and not raw:  # '*' and no Host header (HTTP/1.0)
            return None
        self.traffic.count("bad_host")
        if allowed is None:
            return 400, "bad Host header: expected NAME or NAME:PORT"
        return 400, ("bad Host header: this server answers only to " + ", ".join(sorted(allowed))
                     + ", optionally with :PORT (start it with --allowed-host NAME to add a name)")

    def check_token(self, scope, headers: dict, path: str):
        if self._token is None or (path == "/" and scope.get("method") == "GET"):
            return None
        given = None
        if "authorization" in headers:
            given = policy.token_from_header(headers["authorization"])
        elif "cookie" in headers:
            given = policy.token_from_cookie(headers["cookie"])
        if policy.token_matches(given, self._token):
            return None
        self.traffic.count("unauthorized")
        return 401, "missing or wrong token: send 'Authorization: Bearer TOKEN' (or open /?token=TOKEN once)"

    async def set_cookie(self, send, token: bytes):
        cookie = f"{policy.TOKEN_COOKIE}={policy.cookie_value(token)}; Path=/; HttpOnly; SameSite=Strict"
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", b"/"), (b"set-cookie", cookie.encode("ascii")),
                                (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    async def reply(self, send, status: int, message: str, extra: Optional[dict] = None):
        """Sends a one-line JSON error; returns None (so a caller can ``return await self.reply(...)``)."""
        if status in (413, 503):
            self.traffic.count({413: "too_large", 503: "busy"}[status])
        body = json.dumps({"error": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return None

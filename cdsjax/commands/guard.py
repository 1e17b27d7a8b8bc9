"""What keeps ``cdsjax serve`` safe to expose: who may ask, how much, and for how long.

:class:`Guard` is a plain ASGI middleware in front of the FastAPI application. For every HTTP request it
checks, in this order and before any byte of the body is parsed:

1. the ``Host`` header against the names the server answers to (DNS rebinding: a web page the user visits
   cannot reach a loopback server through a name of its own) -> 400;
2. the bearer token, when one is set (``Authorization: Bearer T``, or the cookie that ``/?token=T`` sets for
   the web page) -> 401; the page itself (``GET /``) is static and needs none;
3. admission: at most ``queue`` question requests at once, counted from the first byte of their upload,
   so slow uploads are bounded too -> 503 with ``Retry-After``;
4. the body size, from ``Content-Length`` and again while reading -> 413;
5. the deadline: a question request that has not answered after its deadline gets 504 and its slot back;
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
import dataclasses
import hmac
import ipaddress
import json
import threading
from typing import Callable, FrozenSet, Optional

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
TOKEN_COOKIE = "cdsjax_token"
QUESTION_PATHS = frozenset({"/ask", "/select"})


class Busy(Exception):
    """Too many abandoned jobs are still running: the request is refused with 503."""


def is_loopback(host: str) -> bool:
    """True for names and addresses that reach only this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name part of a ``Host`` header (port and IPv6 brackets handled), lower-cased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the guard enforces.

    Attributes:
      queue: most question requests admitted at once (uploading, waiting or running).
      max_body: most bytes of a request body.
      request_timeout: seconds a /select may take from admission to answer (queueing included).
      read_timeout: extra seconds an /ask may take for reading (the reader's own timeout), 0 without a reader.
      allowed_hosts: ``Host`` names accepted; None accepts any (``--allowed-host '*'``).
      token: the bearer token every request but the page must carry, or None.
    """

    queue: int = 32
    max_body: int = 64 * 1024
    request_timeout: float = 30.0
    read_timeout: float = 0.0
    allowed_hosts: Optional[FrozenSet[str]] = LOOPBACK_NAMES
    token: Optional[str] = None

    def deadline(self, path: str) -> float:
        return self.request_timeout + (self.read_timeout if path == "/ask" else 0.0)


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
    """The ASGI middleware described in the module docstring.

    ``state["in_flight"]`` counts admitted question requests (read by ``/health``).
    """

    def __init__(self, app, limits: Limits, state: dict):
        self.app = app
        self.limits = limits
        self.state = state
        state.setdefault("in_flight", 0)
        state.setdefault("refused", {})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path = scope.get("path", "")
        refusal = self.check_host(headers) or self.check_token(scope, headers, path)
        if refusal is not None:
            return await self.reply(send, *refusal)
        if path == "/" and scope.get("method") == "GET" and self.limits.token is not None:
            cookie = self.token_from_query(scope)
            if cookie is not None:  # /?token=T: keep it in a same-site cookie and drop it from the URL
                return await self.set_cookie(send, cookie)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limits.max_body):
            return await self.reply(send, 413, f"request body over the limit of {self.limits.max_body} bytes")
        question = path in QUESTION_PATHS and scope.get("method") == "POST"
        if question and self.state["in_flight"] >= self.limits.queue:
            return await self.reply(send, 503, f"server busy: {self.state['in_flight']} requests in flight "
                                    f"(limit {self.limits.queue}); retry later", {"retry-after": "1"})
        if question:
            self.state["in_flight"] += 1
        try:
            await self.handle(scope, receive, send, path, question)
        finally:
            if question:
                self.state["in_flight"] -= 1

    async def handle(self, scope, receive, send, path: str, question: bool):
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.limits.max_body:
                return await self.reply(send, 413, f"request body over the limit of {self.limits.max_body} bytes")
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
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
            self.count("disconnected")
            return
        self.count("timeout")
        if not started:
            await self.reply(send, 504, f"the request ran past its deadline of {self.limits.deadline(path):g} s")

    @staticmethod
    async def wait_disconnect(receive):
        while (await receive())["type"] != "http.disconnect":
            pass

    def count(self, kind: str) -> None:
        refused = self.state["refused"]
        refused[kind] = refused.get(kind, 0) + 1

    def check_host(self, headers: dict):
        allowed = self.limits.allowed_hosts
        if allowed is None:
            return None
        name = host_name(headers.get("host", ""))
        if name in allowed:
            return None
        self.count("bad_host")
        return 400, ("bad Host header: this server answers only to " + ", ".join(sorted(allowed))
                     + " (start it with --allowed-host NAME to add a name)")

    def check_token(self, scope, headers: dict, path: str):
        token = self.limits.token
        if token is None or (path == "/" and scope.get("method") == "GET"):
            return None
        given = ""
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        elif TOKEN_COOKIE in headers.get("cookie", ""):
            for part in headers["cookie"].split(";"):
                name, _, value = part.strip().partition("=")
                if name == TOKEN_COOKIE:
                    given = value
        if given and hmac.compare_digest(given.encode(), token.encode()):
            return None
        self.count("unauthorized")
        return 401, "missing or wrong token: send 'Authorization: Bearer TOKEN' (or open /?token=TOKEN once)"

    def token_from_query(self, scope) -> Optional[str]:
        from urllib.parse import parse_qs

        values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
        if not values:
            return None
        if not hmac.compare_digest(values[0].encode(), self.limits.token.encode()):
            return None
        return values[0]

    async def set_cookie(self, send, token: str):
        cookie = f"{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", b"/"), (b"set-cookie", cookie.encode("latin-1")),
                                (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    async def reply(self, send, status: int, message: str, extra: Optional[dict] = None):
        if status in (413, 503):
            self.count({413: "too_large", 503: "busy"}[status])
        body = json.dumps({"error": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

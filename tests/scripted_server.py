"""A local scripted server that speaks the OpenAI chat-completions API: the test suite's stand-in for a model
server. Standard library only.

It listens on 127.0.0.1 (an ephemeral port, or ``port``), records every request body and its headers, and
answers each chat completion with whatever ``responder(request_json)`` returns:
a string (the assistant message content), a dict (a full JSON body), an
``(status, body)`` tuple to simulate server errors, or bytes (sent as the body as
they are, to simulate a malformed reply). ``delay`` seconds of sleep
before answering simulates a slow server. A request with ``"stream": true`` gets a string reply as
server-sent events, word by word (``stream_pause`` seconds between pieces; ``hung_up`` counts streams the
client closed early; ``cut_stream`` ends each stream after its content, with no finish reason, usage or
``[DONE]``, as a server that dies mid-reply does). ``model_fields`` maps a model id to fields added to its
``/v1/models`` entry, as vLLM adds ``max_model_len`` (the served context window); ``props`` is the JSON body
of ``GET /props`` at the server's root, as llama.cpp answers it (``default_generation_settings.n_ctx``), and
without it that path is a 404.

    with OpenAIServer(lambda req: "42") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x")
        ...
        srv.requests  # list of parsed request bodies
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Union

Response = Union[str, dict, tuple]


class OpenAIServer:
    """The server, started on entering ``with`` and stopped on leaving it; ``base_url`` is its ``/v1`` URL.

    Args:
      responder: ``responder(request body) -> reply`` (see the module docstring for the reply forms).
      models: the model ids ``GET /v1/models`` lists.
      delay: seconds to sleep before each answer.
      port: the port to listen on; 0 picks a free one.
    """

    def __init__(
        self,
        responder: Callable[[dict], Response] = lambda req: "ok",
        *,
        models: tuple = ("test-model",),
        delay: float = 0.0,
        model_fields: Optional[Dict[str, dict]] = None,
        props: Optional[dict] = None,
        port: int = 0,
        stream_pause: float = 0.0,
        cut_stream: bool = False,
    ):
        self.responder = responder
        self.stream_pause = stream_pause
        self.cut_stream = cut_stream
        self.hung_up = 0
        self.models = list(models)
        self.model_fields = dict(model_fields or {})
        self.props = props
        self.delay = delay
        self.requests: List[dict] = []
        self.headers: List[Dict[str, str]] = []  # each request's HTTP headers (lower-case names), as ``requests``
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, status: int, body: Any):
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and hung up (the timeout tests do this on purpose)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [
                        {"id": m, "object": "model", "created": 0, "owned_by": "test",
                         **server.model_fields.get(m, {})} for m in server.models
                    ]})
                elif self.path.rstrip("/") == "/props" and server.props is not None:
                    self._send(200, server.props)
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    server.requests.append(body)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                if server.delay:
                    time.sleep(server.delay)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "not found"}})
                    return
                model = body.get("model")
                if model not in server.models:
                    self._send(404, {"error": {"message": f"The model `{model}` does not exist.",
                                               "type": "NotFoundError", "code": 404}})
                    return
                try:
                    out = server.responder(body)
                except Exception as err:  # a responder bug should show up as a 500
                    self._send(500, {"error": {"message": f"responder failed: {err}"}})
                    return
                if isinstance(out, bytes):  # raw bytes as the body (a malformed reply)
                    self._send(200, out)
                elif isinstance(out, tuple):
                    self._send(out[0], out[1])
                elif isinstance(out, dict):
                    self._send(200, out)
                elif body.get("stream"):
                    self._stream(str(out), model, bool((body.get("stream_options") or {}).get("include_usage")))
                else:
                    self._send(200, completion(str(out), model))

            def _stream(self, content: str, model: str, usage: bool):
                """Server-sent events as the OpenAI streaming API sends them: one chunk per word (``stream_pause``
                seconds apart), then the finish reason, the usage when asked for, and ``[DONE]``."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                words = re.findall(r"\S+\s*|\s+", content)
                chunks = [chunk(model, {"content": w}) for w in words]
                if not server.cut_stream:
                    chunks.append(chunk(model, {}, finish="stop"))
                if usage and not server.cut_stream:
                    chunks.append({**chunk(model, {}), "choices": [],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": len(words),
                                             "total_tokens": 1 + len(words)}})
                try:
                    for c in chunks:
                        self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
                        self.wfile.flush()
                        if server.stream_pause:
                            time.sleep(server.stream_pause)
                    if not server.cut_stream:
                        self.wfile.write(b"data: [DONE]\n\n")
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    with server.lock:
                        server.hung_up += 1  # the client closed the stream early

        self.httpd = ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> "OpenAIServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def chunk(model: str, delta: dict, finish: Optional[str] = None) -> dict:
    """A chat.completion.chunk body (one piece of a streamed reply)."""
    return {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def completion(content: str, model: str = "test-model") -> dict:
    """A chat.completion body with one assistant message."""
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def message_text(request: dict) -> str:
    """All text parts of a recorded request's messages, joined (for assertions)."""
    parts = []
    for msg in request.get("messages", []):
        content = msg.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p.get("text", "") for p in content if p.get("type") == "text")
    return "\n".join(parts)


def message_images(request: dict) -> List[str]:
    """All image URLs (data URLs for base64 images) in a recorded request."""
    urls = []
    for msg in request.get("messages", []):
        content = msg.get("content")
        if isinstance(content, list):
            urls.extend(p["image_url"]["url"] for p in content if p.get("type") == "image_url")
    return urls

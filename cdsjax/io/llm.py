"""The one client for OpenAI-compatible chat servers (vLLM, OpenAI, ...): reader, judge, VLM enrichment and
the planning agent all call models through :class:`ChatClient`.

One retry policy for every caller: transient failures (connection errors, timeouts, HTTP 408/409/429/5xx,
and replies that are malformed, empty or carry no message) are retried with exponential backoff and
jitter (tenacity) before they are raised; ``timeout`` bounds the whole call, retries included. Two refusals
are never retried as they are, whatever their status: a server that takes no images (llama.cpp's text-only
server answers HTTP 500 "image input is not supported"; kind ``images_unsupported``) and a request longer
than the context (llama.cpp's HTTP 400 "request (N tokens) exceeds the available context size"; kind
``context_too_long``). Every failure is a :class:`ReaderError` with a one-line message and a ``kind`` (see
:mod:`cdsjax.io.reader`). A call returns a :class:`ChatReply`; :mod:`cdsjax.io.replies` reads its text.

Images (``ReaderConfig.images``): ``on`` always sends them, ``off`` never, ``auto`` learns once per client
whether its server takes them (:meth:`ChatClient.send_with_images`: the first refusal makes that request and
every later one go as text). :meth:`ChatClient.context_size` asks the server for its context window
(llama.cpp's ``GET /props``, vLLM's ``max_model_len`` in ``/v1/models``).

    client = ChatClient(ReaderConfig(base_url="http://localhost:8000/v1", model="m"))
    reply = client.chat([{"role": "user", "content": "Hi"}])
    reply.content, reply.usage, reply.latency_s
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
import urllib.request
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

import openai
import tenacity

from cdsjax.io.util import one_line


class ReaderError(RuntimeError):
    """A failed chat call (reader, judge, VLM, planner), with a one-line message.

    Attributes:
      kind: what went wrong: ``config``, ``unreachable``, ``timeout``, ``server_error``, ``rate_limited``,
        ``model_not_found``, ``context_too_long``, ``images_unsupported``, ``auth``, ``bad_request`` or
        ``bad_response``.
      url: the server's base URL, when known.
      attempts: how many requests were made before giving up (0 when none was sent).
      status: the HTTP status of the last answer, when the server sent one.
      overflow: ``(prompt tokens, context tokens)`` of a ``context_too_long`` refusal where the server said
        them (llama.cpp does), else None.
    """

    def __init__(self, message: str, *, kind: str, url: Optional[str] = None, attempts: int = 0,
                 status: Optional[int] = None, overflow: Optional[Tuple[int, int]] = None):
        super().__init__(message)
        self.kind = kind
        self.url = url
        self.attempts = attempts
        self.status = status
        self.overflow = overflow


# Errors that every later request would hit too: a batch stops at the first one even when it collects errors.
FATAL_KINDS = ("config", "unreachable", "model_not_found", "auth")


IMAGE_MODES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class ReaderConfig:
    """How to reach an OpenAI-compatible chat server and how to decode (reader and judge alike).

    Attributes:
      base_url: server URL ending in ``/v1``; None reads ``<PREFIX>_URL`` from the environment.
      model: model name; None reads ``<PREFIX>_MODEL``, and failing that uses the server's only model.
      api_key: None reads ``<PREFIX>_API_KEY``, then "EMPTY".
      timeout: seconds one call may take in all, retries and waits between them included.
      max_retries: retries of a transient failure (so at most ``max_retries + 1`` requests per call).
      backoff: first wait between retries, in seconds; it doubles each retry, with up to ``backoff``
        seconds of random jitter.
      max_backoff: longest wait between retries, in seconds.
      max_tokens: new tokens per answer (greedy decoding, paper: 1024).
      temperature: sampling temperature; 0 is greedy.
      max_text_chars: longest text passed per note (paper: 1500); longer text is cut.
      concurrency: requests in flight at once in ``answer_many`` / ``judge_many``.
      max_model_len: the server's context window in tokens, for clamping the no-retrieval control's output
        length; None asks the server (llama.cpp at /props, vLLM in /v1/models), else 32768.
      evidence_tokens: the reader's evidence budget in estimated tokens (:mod:`cdsjax.io.evidence_fit`); None
        derives it from the server's window (:meth:`cdsjax.io.reader.Reader.evidence_tokens`).
      images: ``auto`` (default) sends visual notes as images until the server refuses one, then as text
        (caption, summary and surrounding text) from that request on; ``on`` always sends images (a refusal
        is an error); ``off`` never does.
    """

    base_url: Optional[str] = None
    model: Optional[str] = None
    api_key: Optional[str] = None
    timeout: float = 300.0
    max_retries: int = 3
    backoff: float = 1.0
    max_backoff: float = 30.0
    max_tokens: int = 1024
    temperature: float = 0.0
    max_text_chars: int = 1500
    concurrency: int = 8
    max_model_len: Optional[int] = None
    images: str = "auto"
    evidence_tokens: Optional[int] = None

    def __post_init__(self):
        if self.images not in IMAGE_MODES:
            raise ValueError(f"ReaderConfig.images must be one of {', '.join(IMAGE_MODES)}, got {self.images!r}")
        checks = {
            "timeout": self.timeout > 0,
            "max_retries": self.max_retries >= 0,
            "backoff": self.backoff >= 0,
            "max_backoff": self.max_backoff >= 0,
            "max_tokens": self.max_tokens >= 1,
            "temperature": self.temperature >= 0,
            "max_text_chars": self.max_text_chars >= 1,
            "concurrency": self.concurrency >= 1,
            "max_model_len": self.max_model_len is None or self.max_model_len >= 1,
            "evidence_tokens": self.evidence_tokens is None or self.evidence_tokens >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"ReaderConfig.{name} is out of range: {getattr(self, name)!r}")

    def resolve(self, env_prefix: str = "CDSJAX_READER", key_fallbacks: Sequence[str] = ()) -> "ReaderConfig":
        """Fills unset connection fields from ``<env_prefix>_URL`` / ``_MODEL`` / ``_API_KEY``.

        Raises:
          ReaderError: (kind ``config``) when no URL is given either way.
        """
        env = os.environ
        base_url = self.base_url or env.get(f"{env_prefix}_URL") or None
        if not base_url:
            raise ReaderError(f"no server URL configured: pass base_url or set {env_prefix}_URL", kind="config")
        api_key = self.api_key or env.get(f"{env_prefix}_API_KEY")
        for name in key_fallbacks:
            api_key = api_key or env.get(name)
        return dataclasses.replace(
            self,
            base_url=base_url.rstrip("/"),
            model=self.model or env.get(f"{env_prefix}_MODEL") or None,
            api_key=api_key or "EMPTY",
        )


@dataclasses.dataclass(frozen=True)
class ChatReply:
    """One chat completion.

    Attributes:
      content: the message text (never empty: an empty reply is an error).
      finish_reason: "stop", or "length" when the reply hit max_tokens.
      usage: the server's token counts (prompt_tokens, completion_tokens, total_tokens), or None.
      model: the model that answered.
      latency_s: wall time of the call, retries included.
      first_token_s: for a streamed reply, seconds from the call to its first piece of text; else None.
    """

    content: str
    finish_reason: Optional[str]
    usage: Optional[dict]
    model: str
    latency_s: float
    first_token_s: Optional[float] = None


_CONTEXT_TOO_LONG = re.compile(
    r"context length|context_length|context window|context size|maximum model length|max_model_len|"
    r"too long|too many tokens|is too large|exceeds? the (?:maximum|limit|available context)", re.IGNORECASE)
# llama.cpp's overflow, whatever status its version sends it with; the token counts where it gives them.
_LLAMA_OVERFLOW = re.compile(r"exceeds? the available context size", re.IGNORECASE)
_OVERFLOW_TOKENS = re.compile(r"\((\d+) tokens\) exceeds? the available context size \((\d+) tokens\)",
                              re.IGNORECASE)
# A server (or model) that takes no images: llama.cpp without a vision projector, vLLM with a text model,
# OpenAI with a text model.
_IMAGES_REFUSED = re.compile(
    r"image input is not supported|images? (?:inputs? )?(?:is |are )?not supported|not a multimodal model|"
    r"does not support (?:image|vision|multimodal)|image_url is only supported|at most 0 image", re.IGNORECASE)


def refusal_kind(status: int, message: str) -> Optional[str]:
    """``images_unsupported`` or ``context_too_long`` when an HTTP error is one of the two refusals that are
    never retried as they are (module docstring), else None."""
    if status in (400, 413, 415, 422) or status >= 500:
        if _IMAGES_REFUSED.search(message):
            return "images_unsupported"
        if _LLAMA_OVERFLOW.search(message) or (status in (400, 413, 422) and _CONTEXT_TOO_LONG.search(message)):
            return "context_too_long"
    return None


def count_images(messages: Sequence[Mapping[str, Any]]) -> int:
    """The ``image_url`` parts of chat ``messages``."""
    return sum(1 for m in messages if isinstance(m.get("content"), list)
               for p in m["content"] if p.get("type") == "image_url")


def has_images(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether chat ``messages`` carry an ``image_url`` part."""
    return count_images(messages) > 0


class _MalformedReply(Exception):
    """A reply that is not a usable chat completion (invalid JSON, no choices, no message content)."""


class _Streamed:
    """Whether a streamed call has handed text to its caller: after that a failure is not retried (the caller
    has shown the text), it is raised."""

    def __init__(self):
        self.started = False


class _Delivered(Exception):
    """A failure of a stream after its first piece of text: not retried."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def _stream(client, request: dict, on_token, streamed: _Streamed, start: float) -> dict:
    """One streamed completion: ``on_token`` gets each piece; returns the reply's fields (see ChatClient.chat)."""
    if streamed.started:  # a retry after text was shown would show it twice
        raise _Delivered(RuntimeError("the stream broke after its first piece"))
    stream = client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
    pieces: list = []
    finish, usage, model, first = None, None, None, None
    try:
        for chunk in stream:
            model = getattr(chunk, "model", None) or model
            if getattr(chunk, "usage", None) is not None:
                usage = chunk.usage.model_dump()
            for choice in getattr(chunk, "choices", None) or []:
                finish = choice.finish_reason or finish
                piece = getattr(choice.delta, "content", None) if choice.delta is not None else None
                if not piece:
                    continue
                if first is None:
                    first = time.perf_counter() - start
                streamed.started = True
                pieces.append(piece)
                if on_token(piece):
                    finish = "stopped"
                    return dict(content="".join(pieces), finish_reason=finish, usage=usage, model=model,
                                first_token_s=first)
    except (openai.OpenAIError, ValueError) as err:
        if streamed.started:
            raise _Delivered(err) from err
        raise
    finally:
        stream.close()  # also on Ctrl-C: the server sees the connection close and stops generating
    content = "".join(pieces)
    if not content.strip():
        raise _MalformedReply(f"an empty reply (finish_reason={finish})")
    return dict(content=content, finish_reason=finish, usage=usage, model=model, first_token_s=first)


def _is_transient(err: BaseException) -> bool:
    if isinstance(err, (openai.APIConnectionError, _MalformedReply, ValueError)):  # ValueError: invalid JSON body
        return True
    if isinstance(err, openai.APIStatusError):
        if refusal_kind(err.status_code, _server_message(err)) is not None:
            return False  # sent again as it is, it would be refused again
        return err.status_code in (408, 409, 429) or err.status_code >= 500
    return False


def _overflow(err: openai.APIStatusError, message: str) -> Optional[Tuple[int, int]]:
    """(prompt tokens, context tokens) of an overflow refusal: llama.cpp's ``n_prompt_tokens`` / ``n_ctx``
    fields, else the counts in its message."""
    body = err.body if isinstance(err.body, Mapping) else {}
    pair = body.get("n_prompt_tokens"), body.get("n_ctx")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        return pair
    match = _OVERFLOW_TOKENS.search(message)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _tries(attempts: int) -> str:
    return f"{attempts} attempt{'s' if attempts != 1 else ''}"


def _server_message(err: openai.APIStatusError) -> str:
    body = err.body
    if isinstance(body, Mapping):
        message = body.get("message") or body.get("detail") or body
        return one_line(message)
    return one_line(body if body else err.message)


class ChatClient:
    """The one OpenAI-compatible chat client: config, one openai client, retries, errors, batches.

    ``ChatClient(config)`` or ``ChatClient(base_url=..., model=...)`` (keyword overrides of
    :class:`ReaderConfig`). The reader, the judge and VLM enrichment are subclasses or instances that differ
    only in ``env_prefix`` (where unset connection fields are read from), ``key_fallbacks`` and ``role``
    (the word error messages use).
    """

    env_prefix = "CDSJAX_READER"
    key_fallbacks: tuple = ()
    role = "reader"

    def __init__(self, config: Optional[ReaderConfig] = None, **overrides: Any):
        config = config if config is not None else ReaderConfig()
        if overrides:
            config = dataclasses.replace(config, **overrides)
        self.config = config.resolve(self.env_prefix, self.key_fallbacks)
        self.url = self.config.base_url
        # openai's own retries are off: tenacity retries instead, so backoff is configurable and errors
        # can say how many attempts were made.
        self.client = openai.OpenAI(base_url=self.url, api_key=self.config.api_key,
                                    timeout=self.config.timeout, max_retries=0)
        self._model = self.config.model
        self._model_lock = threading.Lock()
        # Whether the server takes images: None until a request with images is answered or refused (auto).
        self._takes_images: Optional[bool] = None
        self._images_lock = threading.Lock()
        self._context_size: Optional[int] = None
        self._context_known = False
        self._context_lock = threading.Lock()

    def close(self) -> None:
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def list_models(self) -> list:
        """The server's /v1/models entries as dicts (vLLM adds ``max_model_len``)."""
        try:
            page = self.client.models.list()
        except openai.NotFoundError as err:
            raise ReaderError(f"the {self.role} at {self.url} has no model list (HTTP 404: {_server_message(err)}); "
                              f"check the URL (it usually ends in /v1)", kind="bad_request", url=self.url,
                              attempts=1) from err
        except openai.OpenAIError as err:
            raise self._error(err, attempts=1) from err
        return [m.model_dump() for m in page.data]

    @property
    def model(self) -> str:
        """The configured model, or the server's only model when none is configured."""
        with self._model_lock:
            if self._model is None:
                names = [m["id"] for m in self.list_models()]
                if len(names) != 1:
                    offered = ", ".join(names) if names else "none"
                    raise ReaderError(
                        f"no {self.role} model configured and the server at {self.url} offers {offered}: "
                        f"pass model or set {self.env_prefix}_MODEL", kind="config", url=self.url)
                self._model = names[0]
            return self._model

    def check(self) -> str:
        """Confirms the server is up and serves the model; returns the model name."""
        model = self.model
        names = [m["id"] for m in self.list_models()]
        if model not in names:
            raise ReaderError(self._not_found_message(model, names), kind="model_not_found", url=self.url)
        return model

    def chat(self, messages: list, *, max_tokens: Optional[int] = None, seed: Optional[int] = None,
             on_token: Optional[Callable[[str], Optional[bool]]] = None) -> ChatReply:
        """One chat completion, retrying transient failures (see the module docstring).

        Args:
          messages: OpenAI chat messages.
          max_tokens: new-token limit for this call (default ``config.max_tokens``).
          seed: the sampling seed sent to the server (vLLM and OpenAI accept one); None sends none.
          on_token: streams the reply (the OpenAI streaming API, which vLLM, llama.cpp and Ollama serve):
            called with each piece of text as it arrives; when it returns True the request is closed at once
            (the server stops generating) and the reply so far comes back with ``finish_reason="stopped"``.
            A transient failure is retried only before the first piece; an interrupt (Ctrl-C) closes the
            request before it propagates.

        Raises:
          ReaderError: no usable reply within ``config.timeout`` and ``config.max_retries`` retries.
        """
        cfg = self.config
        start = time.perf_counter()
        model = self.model
        deadline = start + cfg.timeout
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(cfg.max_retries + 1) | tenacity.stop_before_delay(cfg.timeout),
            wait=(tenacity.wait_exponential(multiplier=cfg.backoff, max=cfg.max_backoff)
                  + tenacity.wait_random(0, cfg.backoff)),
            retry=tenacity.retry_if_exception(_is_transient),
            reraise=True,
        )
        attempts = 0
        streamed = _Streamed()
        request = dict(model=model, messages=messages, temperature=cfg.temperature,
                       max_tokens=int(max_tokens or cfg.max_tokens), **({} if seed is None else {"seed": int(seed)}))
        try:
            for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        raise openai.APITimeoutError(request=None)  # the deadline passed between attempts
                    client = self.client.with_options(timeout=left)
                    if on_token is not None:
                        reply = _stream(client, request, on_token, streamed, start)
                        continue
                    response = client.chat.completions.create(**request)
                    choices = getattr(response, "choices", None) or []
                    if not choices or choices[0].message is None:
                        raise _MalformedReply("a reply without choices")
                    content = choices[0].message.content
                    if content is None or not content.strip():
                        raise _MalformedReply(f"an empty reply (finish_reason={choices[0].finish_reason})")
                    usage = response.usage.model_dump() if getattr(response, "usage", None) is not None else None
                    reply = dict(content=content, finish_reason=choices[0].finish_reason, usage=usage,
                                 model=response.model or model, first_token_s=None)
        except _Delivered as err:  # the stream broke after text was shown: raised, not retried
            if isinstance(err.cause, openai.OpenAIError):
                raise self._error(err.cause, attempts) from err.cause
            raise ReaderError(f"the {self.role} at {self.url} broke off its reply ({one_line(err.cause, 120)})",
                              kind="bad_response", url=self.url, attempts=attempts) from None
        except openai.OpenAIError as err:
            raise self._error(err, attempts) from err
        except _MalformedReply as err:
            raise ReaderError(f"the {self.role} at {self.url} sent {err} ({_tries(attempts)})",
                              kind="bad_response", url=self.url, attempts=attempts) from None
        except ValueError as err:  # the body was not valid JSON
            raise ReaderError(f"the {self.role} at {self.url} sent a malformed reply (not valid JSON: "
                              f"{one_line(err, 120)}; {_tries(attempts)})", kind="bad_response", url=self.url,
                              attempts=attempts) from None
        if has_images(messages):
            self._takes_images = True
        return ChatReply(content=reply["content"], finish_reason=reply["finish_reason"], usage=reply["usage"],
                         model=reply["model"] or model, latency_s=time.perf_counter() - start,
                         first_token_s=reply["first_token_s"])

    @property
    def takes_images(self) -> Optional[bool]:
        """What this client knows of its server: True once a request with images was answered, False once one
        was refused (or ``images`` is ``off``), None before either."""
        return False if self.config.images == "off" else self._takes_images

    def send_with_images(self, build: Callable[[bool], list], send: Callable[[list], Any], *,
                         known: Optional[Callable[[list], bool]] = None) -> Tuple[Any, list]:
        """Sends a request that may carry images, as ``config.images`` says; returns ``(send's result, the
        messages sent)``.

        Args:
          build: ``build(images)`` -> the chat messages, with image parts when ``images`` is True and with
            every visual note as text when it is False.
          send: sends the messages (``self.chat``, or a cached call around it) and returns its result.
          known: ``known(messages)`` is True when ``send`` can answer those messages without the server (a
            reply cache): a request whose text-only form is known and whose image form is not goes as text
            before this client has learned anything.

        ``auto`` sends images until a refusal (``images_unsupported``) and from then on text: the refused
        request goes again at once as text, and so does every later one. Until the server has answered or
        refused a request with images, such requests go one at a time, so a server that takes none refuses
        exactly one. ``on`` sends images (a refusal raises); ``off`` never does.

        Raises:
          ReaderError: what ``send`` raises (a refusal of images only under ``on``).
        """
        mode = self.config.images
        if mode == "off" or self._takes_images is False:
            messages = build(False)
            return send(messages), messages
        messages = build(True)
        if mode == "on" or self._takes_images or not has_images(messages):
            return send(messages), messages
        if known is not None and not known(messages):
            text = build(False)
            if known(text):
                return send(text), text
        with self._images_lock:
            if self._takes_images is None:
                try:
                    return send(messages), messages
                except ReaderError as err:
                    if err.kind != "images_unsupported":
                        raise
                    self._takes_images = False
            learned = self._takes_images
        if learned:
            return send(messages), messages
        text = build(False)
        return send(text), text

    def context_size(self) -> Optional[int]:
        """The server's context window in tokens where it says so, asked once per client: llama.cpp's
        ``GET /props`` (``default_generation_settings.n_ctx``, the window of one slot, else ``n_ctx``) at the
        server's root, then vLLM's ``max_model_len`` of the model in ``/v1/models``; None when neither says."""
        with self._context_lock:
            if not self._context_known:
                self._context_size = self._props_n_ctx() or self._models_max_len()
                self._context_known = True
            return self._context_size

    def _props_n_ctx(self) -> Optional[int]:
        root = self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url
        if not root.lower().startswith(("http://", "https://")):
            return None
        request = urllib.request.Request(f"{root}/props", headers={"Authorization": f"Bearer {self.config.api_key}"})
        try:
            with urllib.request.urlopen(request, timeout=min(5.0, self.config.timeout)) as response:
                props = json.loads(response.read())
        except (OSError, ValueError):  # no /props (an HTTP error is an OSError), or not JSON
            return None
        if not isinstance(props, Mapping):
            return None
        settings = props.get("default_generation_settings")
        for value in ((settings or {}).get("n_ctx") if isinstance(settings, Mapping) else None, props.get("n_ctx")):
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    def _models_max_len(self) -> Optional[int]:
        try:
            model = self.model
            entries = self.list_models()
        except ReaderError:
            return None
        for entry in entries:
            value = entry.get("max_model_len")
            if entry.get("id") == model and isinstance(value, int) and value > 0:
                return value
        return None

    def probe(self, timeout: float = 5.0) -> Optional["ReaderError"]:
        """A quick reachability check (one ``GET /models``, no retries): None when the server answers and
        serves the model, else the :class:`ReaderError` a call would end with."""
        try:
            page = self.client.with_options(timeout=min(timeout, self.config.timeout)).models.list()
            names = [m.id for m in page.data]
        except openai.NotFoundError:
            return None  # some servers have no model list; the chat call will tell
        except openai.OpenAIError as err:
            return self._error(err, attempts=1)
        except ValueError as err:
            return ReaderError(f"the {self.role} at {self.url} sent a malformed model list (not valid JSON: "
                               f"{one_line(err, 120)})", kind="bad_response", url=self.url, attempts=1)
        if self._model is not None and names and self._model not in names:
            return ReaderError(self._not_found_message(self._model, names), kind="model_not_found", url=self.url)
        if self._model is None:
            try:
                self.model
            except ReaderError as err:
                return err
        return None

    def _not_found_message(self, model: str, names: Sequence[str]) -> str:
        offered = ", ".join(names) if names else "no models"
        return f"model '{model}' not found at {self.url}; the server offers: {offered}"

    def _error(self, err: openai.OpenAIError, attempts: int) -> ReaderError:
        url, role = self.url, self.role
        tries = _tries(attempts)
        if isinstance(err, openai.APITimeoutError):
            return ReaderError(f"the {role} at {url} did not answer within {self.config.timeout:g} s ({tries})",
                               kind="timeout", url=url, attempts=attempts)
        if isinstance(err, openai.APIConnectionError):
            cause = one_line(err.__cause__ or err.message, 200)
            return ReaderError(f"cannot reach the {role} at {url}: {cause} ({tries}; is the server running?)",
                               kind="unreachable", url=url, attempts=attempts)
        if isinstance(err, openai.APIStatusError):
            out = self._status_error(err, attempts)
            out.status = err.status_code
            return out
        return ReaderError(f"the {role} at {url} sent an unreadable response: {one_line(err)}",
                           kind="bad_response", url=url, attempts=attempts)

    def _status_error(self, err: openai.APIStatusError, attempts: int) -> ReaderError:
        url, role = self.url, self.role
        tries = _tries(attempts)
        status, message = err.status_code, _server_message(err)
        if status == 404:
            return self._model_not_found(message, attempts)
        refusal = refusal_kind(status, message)
        if refusal == "images_unsupported":
            return ReaderError(f"the {role} at {url} takes no images (HTTP {status}): {message}; set images to "
                               f"auto or off to send visual notes as text", kind=refusal, url=url, attempts=attempts)
        if refusal == "context_too_long":
            return ReaderError(f"the request is too long for model '{self._model}' at {url}: {message}",
                               kind=refusal, url=url, attempts=attempts, overflow=_overflow(err, message))
        if status in (401, 403):
            return ReaderError(f"the {role} at {url} refused the API key (HTTP {status}): {message}; "
                               f"set {self.env_prefix}_API_KEY", kind="auth", url=url, attempts=attempts)
        if status == 429:
            return ReaderError(f"the {role} at {url} is rate limiting (HTTP 429) after {tries}: {message}",
                               kind="rate_limited", url=url, attempts=attempts)
        if status >= 500 or status in (408, 409):
            return ReaderError(f"the {role} at {url} failed with HTTP {status} after {tries}: {message}",
                               kind="server_error", url=url, attempts=attempts)
        return ReaderError(f"the {role} at {url} rejected the request (HTTP {status}): {message}",
                           kind="bad_request", url=url, attempts=attempts)

    def _model_not_found(self, message: str, attempts: int) -> ReaderError:
        model = self._model
        try:
            names = [m.id for m in self.client.models.list().data]
        except openai.OpenAIError as err:
            return ReaderError(
                f"{self.url} answered HTTP 404 for model '{model}' ({message}) and could not list its models "
                f"({one_line(err, 120)}); check the URL (it usually ends in /v1) and the model name",
                kind="model_not_found", url=self.url, attempts=attempts)
        if model in names:
            return ReaderError(f"the {self.role} at {self.url} answered HTTP 404: {message}",
                               kind="bad_request", url=self.url, attempts=attempts)
        return ReaderError(self._not_found_message(model, names), kind="model_not_found",
                           url=self.url, attempts=attempts)

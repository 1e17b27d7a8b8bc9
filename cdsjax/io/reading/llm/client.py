"""The one client for OpenAI-compatible chat servers (vLLM, OpenAI, ...): reader, judge, VLM enrichment and
the planning agent all call models through :class:`ChatClient`.

One retry policy for every caller: transient failures are retried with exponential backoff and jitter
(tenacity) before they are raised (:func:`cdsjax.io.reading.llm.errors.is_transient`); ``timeout`` bounds the whole
call, retries included. A refusal of images or of a request longer than the context is never retried as it is
(:func:`cdsjax.io.reading.llm.errors.refusal_kind`). Every failure is a :class:`~cdsjax.io.reading.llm.errors.ReaderError` with
a one-line message and a ``kind``. A call returns a :class:`~cdsjax.io.reading.llm.config.ChatReply`;
:mod:`cdsjax.io.reading.replies` reads its text.

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
import threading
import time
from typing import Any, Callable, Optional, Sequence, Tuple

import openai
import tenacity

from cdsjax.io.reading.llm.config import ChatReply, ReaderConfig
from cdsjax.io.reading.llm.errors import (MalformedReply, ReaderError, attempts_phrase, is_transient, overflow_tokens,
                                  refusal_kind, server_message)
from cdsjax.io.reading.llm.transport import Delivered, Streamed, complete, has_images, props_n_ctx, stream_reply
from cdsjax.io.util import one_line


def unix_client(socket_path: Optional[str]):
    """The HTTP client of a server on the Unix socket ``socket_path`` (None: openai's own, over TCP)."""
    if socket_path is None:
        return None
    import importlib

    # the HTTP library openai's client is built on (httpx, or its successor httpx2): its transport takes a socket
    library = importlib.import_module(openai.DefaultHttpxClient.__mro__[1].__module__.split(".")[0])
    return openai.DefaultHttpxClient(transport=library.HTTPTransport(uds=socket_path))


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
        self.client = openai.OpenAI(base_url=self.url, api_key=self.config.api_key, timeout=self.config.timeout,
                                    max_retries=0, http_client=unix_client(self.config.socket))
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
            raise ReaderError(f"the {self.role} at {self.url} has no model list (HTTP 404: {server_message(err)}); "
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
            retry=tenacity.retry_if_exception(is_transient),
            reraise=True,
        )
        attempts = 0
        streamed = Streamed()
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
                        reply = stream_reply(client, request, on_token, streamed, start)
                    else:
                        reply = complete(client, request)
        except Delivered as err:  # the stream broke after text was shown: raised, not retried
            if isinstance(err.cause, openai.OpenAIError):
                raise self._error(err.cause, attempts) from err.cause
            raise ReaderError(f"the {self.role} at {self.url} broke off its reply ({one_line(err.cause, 120)})",
                              kind="bad_response", url=self.url, attempts=attempts) from None
        except openai.OpenAIError as err:
            raise self._error(err, attempts) from err
        except MalformedReply as err:
            raise ReaderError(f"the {self.role} at {self.url} sent {err} ({attempts_phrase(attempts)})",
                              kind="bad_response", url=self.url, attempts=attempts) from None
        except ValueError as err:  # the body was not valid JSON
            raise ReaderError(f"the {self.role} at {self.url} sent a malformed reply (not valid JSON: "
                              f"{one_line(err, 120)}; {attempts_phrase(attempts)})", kind="bad_response", url=self.url,
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
                by_props = props_n_ctx(self.url, self.config.api_key, min(5.0, self.config.timeout),
                                       socket_path=self.config.socket)
                self._context_size = by_props or self._models_max_len()
                self._context_known = True
            return self._context_size

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
        tries = attempts_phrase(attempts)
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
        tries = attempts_phrase(attempts)
        status, message = err.status_code, server_message(err)
        if status == 404:
            return self._model_not_found(message, attempts)
        refusal = refusal_kind(status, message)
        if refusal == "images_unsupported":
            return ReaderError(f"the {role} at {url} takes no images (HTTP {status}): {message}; set images to "
                               f"auto or off to send visual notes as text", kind=refusal, url=url, attempts=attempts)
        if refusal == "context_too_long":
            return ReaderError(f"the request is too long for model '{self._model}' at {url}: {message}",
                               kind=refusal, url=url, attempts=attempts, overflow=overflow_tokens(err, message))
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

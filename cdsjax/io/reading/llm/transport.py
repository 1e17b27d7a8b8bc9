"""The wire side of a chat call: one request, streamed or not, turned into the reply's fields; the images a
request carries; the context window a llama.cpp server states at ``GET /props``.

A function here makes one request and raises what it meets (openai's errors, :class:`MalformedReply`);
retries, deadlines and the messages of :class:`~cdsjax.io.reading.llm.errors.ReaderError` are the client's
(:class:`cdsjax.io.reading.llm.client.ChatClient`).
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping, Optional, Sequence

import openai

from cdsjax.io.reading.llm.errors import MalformedReply
from cdsjax.io.util import http_get


def count_images(messages: Sequence[Mapping[str, Any]]) -> int:
    """The ``image_url`` parts of chat ``messages``."""
    return sum(1 for m in messages if isinstance(m.get("content"), list)
               for p in m["content"] if p.get("type") == "image_url")


def has_images(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether chat ``messages`` carry an ``image_url`` part."""
    return count_images(messages) > 0


class Streamed:
    """Whether a streamed call has handed text to its caller: after that a failure is not retried (the caller
    has shown the text), it is raised."""

    def __init__(self):
        self.started = False


class Delivered(Exception):
    """A failure of a stream after its first piece of text: not retried."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def stream_reply(client, request: dict, on_token, streamed: Streamed, start: float) -> dict:
    """One streamed completion: ``on_token`` gets each piece; returns the reply's fields (see ChatClient.chat).

    A stream counts as whole only when a choice carried its ``finish_reason`` (or ``on_token`` stopped it):
    one that ends without it after text was shown raises :class:`Delivered` (not retried), before it a
    :class:`MalformedReply` (retried)."""
    if streamed.started:  # a retry after text was shown would show it twice
        raise Delivered(RuntimeError("the stream broke after its first piece"))
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
            raise Delivered(err) from err
        raise
    finally:
        stream.close()  # also on Ctrl-C: the server sees the connection close and stops generating
    content = "".join(pieces)
    if finish is None and streamed.started:  # cut off (a server that died, a proxy that closed): not an answer
        raise Delivered(MalformedReply("a stream that ended before its end marker (no finish_reason): the reply "
                                       "is incomplete"))
    if not content.strip():
        raise MalformedReply(f"an empty reply (finish_reason={finish})")
    return dict(content=content, finish_reason=finish, usage=usage, model=model, first_token_s=first)


def complete(client, request: dict) -> dict:
    """One completion, not streamed; returns the reply's fields (see ChatClient.chat)."""
    response = client.chat.completions.create(**request)
    choices = getattr(response, "choices", None) or []
    if not choices or choices[0].message is None:
        raise MalformedReply("a reply without choices")
    content = choices[0].message.content
    if content is None or not content.strip():
        raise MalformedReply(f"an empty reply (finish_reason={choices[0].finish_reason})")
    usage = response.usage.model_dump() if getattr(response, "usage", None) is not None else None
    return dict(content=content, finish_reason=choices[0].finish_reason, usage=usage,
                model=response.model or request["model"], first_token_s=None)


def props_n_ctx(url: str, api_key: str, timeout: float, socket_path: Optional[str] = None) -> Optional[int]:
    """The context window llama.cpp states at ``GET /props`` of the server's root (``url`` less its ``/v1``):
    ``default_generation_settings.n_ctx`` (the window of one slot), else ``n_ctx``; None when it says neither."""
    root = url[: -len("/v1")] if url.endswith("/v1") else url
    if not root.lower().startswith(("http://", "https://")):
        return None
    status, body = http_get(f"{root}/props", headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout,
                            socket_path=socket_path)
    try:
        props = json.loads(body) if status == 200 else None
    except ValueError:  # not JSON
        return None
    if not isinstance(props, Mapping):
        return None
    settings = props.get("default_generation_settings")
    for value in ((settings or {}).get("n_ctx") if isinstance(settings, Mapping) else None, props.get("n_ctx")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None

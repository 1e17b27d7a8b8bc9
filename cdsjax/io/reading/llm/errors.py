"""What can go wrong in a chat call, and which failures are worth a retry.

A failed call is a :class:`ReaderError` with a one-line message and a ``kind``. Transient failures (connection
errors, timeouts, HTTP 408/409/429/5xx, and replies that are malformed, empty or carry no message) are retried
(:func:`is_transient`). Two refusals are never retried as they are, whatever their status
(:func:`refusal_kind`): a server that takes no images (llama.cpp's text-only server answers HTTP 500 "image input
is not supported"; kind ``images_unsupported``) and a request longer than the context (llama.cpp's HTTP 400
"request (N tokens) exceeds the available context size"; kind ``context_too_long``).
"""

from __future__ import annotations

import re
from typing import Mapping, Optional, Tuple

import openai

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


class MalformedReply(Exception):
    """A reply that is not a usable chat completion (invalid JSON, no choices, no message content)."""


def is_transient(err: BaseException) -> bool:
    """Whether a failed request is worth sending again as it is."""
    if isinstance(err, (openai.APIConnectionError, MalformedReply, ValueError)):  # ValueError: invalid JSON body
        return True
    if isinstance(err, openai.APIStatusError):
        if refusal_kind(err.status_code, server_message(err)) is not None:
            return False  # sent again as it is, it would be refused again
        return err.status_code in (408, 409, 429) or err.status_code >= 500
    return False


def overflow_tokens(err: openai.APIStatusError, message: str) -> Optional[Tuple[int, int]]:
    """(prompt tokens, context tokens) of an overflow refusal: llama.cpp's ``n_prompt_tokens`` / ``n_ctx``
    fields, else the counts in its message."""
    body = err.body if isinstance(err.body, Mapping) else {}
    pair = body.get("n_prompt_tokens"), body.get("n_ctx")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        return pair
    match = _OVERFLOW_TOKENS.search(message)
    return (int(match.group(1)), int(match.group(2))) if match else None


def attempts_phrase(attempts: int) -> str:
    """``"1 attempt"``, ``"3 attempts"``: for error messages."""
    return f"{attempts} attempt{'s' if attempts != 1 else ''}"


def server_message(err: openai.APIStatusError) -> str:
    """The server's own words of an HTTP error, on one line."""
    body = err.body
    if isinstance(body, Mapping):
        message = body.get("message") or body.get("detail") or body
        return one_line(message)
    return one_line(body if body else err.message)

"""What a chat call is given and what it returns: :class:`ReaderConfig` (how to reach a server and how to
decode) and :class:`ChatReply` (one completion)."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence


IMAGE_MODES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class ReaderConfig:
    """How to reach an OpenAI-compatible chat server and how to decode (reader and judge alike); what one read
    may use (its evidence budget, ...) is that read's :class:`cdsjax.io.reading.options.ReadOptions`.

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
      images: ``auto`` (default) sends visual notes as images until the server refuses one, then as text
        (caption, summary and surrounding text) from that request on; ``on`` always sends images (a refusal
        is an error); ``off`` never does.
      socket: a Unix socket the server listens on (the local reader's, in a directory only its user may
        enter): every request goes there, and ``base_url`` gives only the path. None: TCP to ``base_url``.
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
    socket: Optional[str] = None

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
            from cdsjax.io.reading.llm.errors import ReaderError  # openai loads with it: not when flags are parsed

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


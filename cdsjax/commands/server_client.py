"""``cdsjax ask --server URL``: the question sent to a running ``cdsjax serve``, with the standard library's HTTP
client only, so that asking a server loads neither JAX nor torch."""

from __future__ import annotations

import json
import time
from typing import Optional

from cdsjax.commands import CLIError


def ask_server(url: str, question: str, *, selector: Optional[str], budget: int, options: dict, read: bool = True, abstain: bool = True,
               timeout: float = 300.0, token: "str | None" = None) -> dict:
    """POSTs the question to a running ``cdsjax serve`` (stdlib HTTP only: no JAX or torch here); without a
    ``selector`` the server uses its default."""
    import urllib.error
    import urllib.request

    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise CLIError(f"--server {url}: expected an http:// or https:// URL", 2)
    body = dict(question=question, budget=budget)
    if not abstain:
        body["abstain"] = False
    if selector is not None:
        body["selector"] = selector
    if options:
        body["options"] = options
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = b"Bearer " + token.encode("utf-8")  # any text: the server compares bytes
    request = urllib.request.Request(f"{base}/{'ask' if read else 'select'}", data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            result = json.loads(response.read())
    except urllib.error.HTTPError as err:
        try:
            body = json.loads(err.read())
            message = body.get("error") or err.reason
        except (ValueError, AttributeError):
            body, message = {}, err.reason
        if err.code == 502 and isinstance(body.get("result"), dict):  # the reader failed; the evidence came back
            return body["result"]
        raise CLIError(f"server {base}: HTTP {err.code}: {message}", 1) from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise CLIError(f"server {base}: cannot reach it ({reason}); start one with `cdsjax serve INDEX`", 1) from None
    except ValueError:
        raise CLIError(f"server {base}: the reply is not JSON (is it a cdsjax server?)", 1) from None
    result.setdefault("timings", {})["roundtrip"] = time.perf_counter() - t0
    return result

"""Headless Chromium driven over the DevTools protocol (a websocket on loopback), for page tests that must wait
for something that happens over real time, such as a streamed answer, which ``--dump-dom`` with a virtual-time
budget does not wait for."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request

from websockets.sync.client import connect

from tests.processes import stop_process

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


def page_html_when(chromium: str, url: str, ready_js: str, profile, timeout: float = 120.0) -> str:
    """Opens ``url`` and returns the page's HTML once ``ready_js`` (a JavaScript expression) is true."""
    proc = subprocess.Popen([chromium, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        port = None
        while port is None:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {proc.returncode}")
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = int(found.group(1)) if found else None
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not open its DevTools port")
        target = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?{urllib.parse.quote(url, safe='')}",
                                        method="PUT")
        with urllib.request.urlopen(target, timeout=30) as r:
            ws_url = json.loads(r.read())["webSocketDebuggerUrl"]
        with connect(ws_url, max_size=None, open_timeout=30) as ws:
            ask = _evaluator(ws, timeout)
            # polled from here, not awaited in the page: a navigation replaces the page's context mid-wait
            while not ask(f"location.href.startsWith('http') && document.readyState === 'complete' && ({ready_js})"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the page did not get ready within {timeout:g} s: {ready_js}")
                time.sleep(0.05)
            return ask("document.documentElement.outerHTML")
    finally:
        stop_process(proc, timeout=10)


def _evaluator(ws, timeout: float):
    ids = iter(range(1, 1 << 30))

    def ask(expression: str):
        n = next(ids)
        ws.send(json.dumps({"id": n, "method": "Runtime.evaluate",
                            "params": {"expression": expression, "returnByValue": True}}))
        while True:
            reply = json.loads(ws.recv(timeout=timeout))
            if reply.get("id") == n:
                break
        result = reply.get("result") or {}
        if "error" in reply or "exceptionDetails" in result:
            return None  # between documents (a navigation), or not yet defined: asked again
        return result.get("result", {}).get("value")

    return ask

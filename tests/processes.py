"""Stopping a child process a test started (a `cdsjax serve` server, a headless Chromium)."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Asks ``proc`` to end (SIGTERM), waits up to ``timeout`` seconds, then kills it; nothing when it has ended."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

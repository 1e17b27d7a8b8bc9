"""The local reader's server process: ``python -m cdsjax.io.reading.local.reader _serve ...`` (:func:`serve`), llama.cpp's
server (``xllamacpp``) on a Unix socket, behind the API key it finds in its environment.

It runs until it is told to stop (SIGTERM, SIGINT, SIGHUP) or its parent is gone
(:func:`cdsjax.io.child.watch_parent`): it always has one owner, the process that started it (a command, an
evaluation, or the warm cdsjax server of :mod:`cdsjax.commands.warm`), which decides how long it lives.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Sequence

from cdsjax.io.child import watch_parent

SERVE_MODULE = "cdsjax.io.reading.local.reader"  # a server's command line: python -m SERVE_MODULE _serve ... (ps shows it)
KEY_ENV = "_CDSJAX_LOCAL_READER_KEY"  # how the API key reaches the server (never its command line: `ps` shows that)


def serve(argv: Sequence[str]) -> int:
    """Runs the server (the arguments: :func:`cdsjax.io.reading.local.launch.server_command`); does not return."""
    import argparse

    p = argparse.ArgumentParser(prog="cdsjax.io.reading.local.reader _serve")
    p.add_argument("--model", required=True)
    p.add_argument("--alias", required=True)
    p.add_argument("--socket", required=True, help="the Unix socket to listen on (a path ending in .sock)")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--ctx", type=int, required=True)
    p.add_argument("--slots", type=int, required=True)
    p.add_argument("--parent", type=int, required=True, help="exit when this process is gone")
    args = p.parse_args(argv)
    key = os.environ.pop(KEY_ENV, "") or None
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.set())
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.hostnames = [args.socket]  # a path ending in .sock: llama.cpp listens on a Unix socket, no TCP port
    params.n_ctx = args.ctx
    params.n_parallel = args.slots
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.ui = False  # no web UI: this server is the reader's API only
    if key:
        params.api_keys = [key]  # every endpoint but /health answers 401 without it
    server = xllamacpp.Server(params)  # noqa: F841  (serves until the process ends)
    with contextlib.suppress(OSError):
        os.chmod(args.socket, 0o600)  # its directory is already this user's alone
    print(f"cdsjax local reader: serving {args.alias} on {args.socket}", flush=True)
    if args.parent:
        watch_parent(args.parent, stopping.set)  # the owner is gone: do not outlive it
    while not stopping.wait(1.0):
        pass
    with contextlib.suppress(OSError):
        Path(args.socket).unlink()
    os._exit(0)  # the server's threads end with the process

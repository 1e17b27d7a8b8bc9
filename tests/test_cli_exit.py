"""`cdsjax` ends its process without the interpreter's teardown, but only after what Python would finish at exit:
threads it waits for, exit handlers, buffered output; and with the command's own exit code."""

import atexit
import os
import subprocess
import sys
import threading
import time

import pytest

from cdsjax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_entry_finishes_threads_handlers_and_output_first(monkeypatch, capsys):
    events = []

    def command():
        worker = threading.Thread(target=lambda: (time.sleep(0.2), events.append("thread")))  # not a daemon
        worker.start()
        print("answer", end="")  # no newline: still in the buffer when the command returns
        return 3

    class Exited(Exception):
        pass

    def fake_exit(code):
        events.append(("exit", code))
        raise Exited

    monkeypatch.setattr(cli, "main", command)
    monkeypatch.setattr(cli.os, "_exit", fake_exit)
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: events.append("atexit"))  # not this process's own
    monkeypatch.setattr(atexit, "unregister", lambda f: events.append(("unregister", f.__module__, f.__name__)))
    monkeypatch.setattr(threading, "_shutdown", lambda: [t.join() for t in threading.enumerate()
                                                         if t is not threading.main_thread() and not t.daemon
                                                         and t.name.startswith("Thread-")])
    with pytest.raises(Exited):
        cli.entry()
    # JAX's exit handler (freeing XLA's backends one object at a time) is dropped before the others run
    assert events == ["thread", ("unregister", "jax._src.api", "clean_up"), "atexit", ("exit", 3)]
    assert capsys.readouterr().out == "answer"


def test_jax_keeps_its_exit_handler_while_jax_distributed_runs(monkeypatch):
    """Its handler also tells the coordinator this process left: kept when jax.distributed was initialised."""
    import jax._src.distributed as distributed

    dropped = []
    monkeypatch.setattr(atexit, "unregister", dropped.append)
    monkeypatch.setattr(distributed.global_state, "client", object())
    cli._skip_jax_teardown()
    assert dropped == []
    monkeypatch.setattr(distributed.global_state, "client", None)
    cli._skip_jax_teardown()
    assert [f.__name__ for f in dropped] == ["clean_up"]


@pytest.mark.slow
def test_the_executable_keeps_its_exit_code_and_messages():
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "cdsjax.cli", "ask", os.path.join(ROOT, "no-such-file.pdf"), "q?"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert proc.returncode != 0
    assert "no-such-file.pdf" in proc.stderr and "Traceback" not in proc.stderr

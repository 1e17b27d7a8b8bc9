"""`cdsjax` ends through the interpreter's ordinary exit (``sys.exit``), with the command's own exit code: threads it
waits for, exit handlers and buffered output all finish first; no private interpreter or JAX internals."""

import os
import subprocess
import sys

import pytest

from cdsjax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_entry_exits_with_the_command_code_and_flushes_its_output(monkeypatch, capsys):
    def command():
        print("answer", end="")  # no newline: still in the buffer when the command returns
        return 3

    monkeypatch.setattr(cli, "main", command)
    with pytest.raises(SystemExit) as exited:
        cli.entry()
    assert exited.value.code == 3 and capsys.readouterr().out == "answer"


def test_the_executable_waits_for_threads_and_exit_handlers(tmp_path):
    """What Python finishes at exit still happens after a command: a non-daemon thread's work and an exit handler."""
    marks = tmp_path / "marks"
    script = (
        "import atexit, sys, threading, time\n"
        "from cdsjax import cli\n"
        f"marks = open({str(marks)!r}, 'a')\n"
        "def command():\n"
        "    threading.Thread(target=lambda: (time.sleep(0.2), marks.write('thread\\n'), marks.flush())).start()\n"
        "    atexit.register(lambda: (marks.write('atexit\\n'), marks.flush()))\n"
        "    print('answer', end='')\n"
        "    return 3\n"
        "cli.main = command\n"
        "cli.entry()\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 3 and proc.stdout == "answer", proc.stderr
    assert marks.read_text().split() == ["thread", "atexit"]


@pytest.mark.slow
def test_the_executable_keeps_its_exit_code_and_messages():
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "cdsjax.cli", "ask", os.path.join(ROOT, "no-such-file.pdf"), "q?"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert proc.returncode != 0
    assert "no-such-file.pdf" in proc.stderr and "Traceback" not in proc.stderr

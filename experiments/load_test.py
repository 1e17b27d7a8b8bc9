"""Load test of `cdsjax serve` under a mix of normal and hostile clients (loopback only, bounded, stops itself).

Run (from the repository root):

    python experiments/load_test.py INDEX [INDEX...] --clients 8 --seconds 60 --hostile 0.3

It starts one ``cdsjax serve`` on 127.0.0.1 (a free port; it cannot be pointed elsewhere) on a private copy of
the first index whose manifest also lists one more document, a copy of that index's first PDF that the
``pdf_swap`` clients swap for a link to a secret file and back. It waits until the server is ready, then runs
``--clients`` client threads for ``--seconds`` (at most ``--max-requests`` requests in all), ``--tricklers``
threads that each keep one trickled upload open all the time (a byte a second, never finishing; a new one as
soon as the server cuts it off), and one thread that times ``GET /health`` every quarter second.
Each request is normal with probability ``1 - --hostile``: a /select question from a fixed list with the
server's default selector. Otherwise it is one of the hostile kinds, chosen uniformly:

- ``bad_options``: solver options that used to spin forever (``tol: -1``, ``max_iter: 2**31 - 1``) -> 400;
- ``new_compile``: a fresh beta for converged CDS, which compiles a new selector (slow; LRU-capped) -> 200,
  504, or 503 while two abandoned compilations are still running;
- ``heavy``: the most work the HTTP bounds allow (paper mode, 20,000 steps, tol 1e-12, a fresh beta);
- ``big_body``: a 1 MB question -> 413 before it is read;
- ``slow_upload``: an upload that stalls, then the client leaves -> the slot is freed;
- ``disconnect``: a compiling request whose client leaves at once -> the slot is freed;
- ``bad_host``: a foreign Host header (DNS rebinding) -> 400;
- ``crop_escape``: ``/crop?note=../../etc/passwd`` -> 404;
- ``trickle``: an upload that sends one byte a second until the server answers -> 408 after ``--body-timeout``;
- ``pdf_swap``: ``/pdf`` of the swappable document while it is a link to a secret file -> 404 (``LEAK`` if
  the secret came back);
- ``giant_number``: a 401-digit integer as a float option, a budget or a near-duplicate threshold -> 4xx.

A 503 is labelled by its cause: ``503-lane`` (two abandoned computations of that lane are still running: the
computation lanes really are full), ``503-queue`` (``--queue`` requests in flight) or ``503-uploads`` (every
upload slot held by fresh uploads).

Printed at the end: requests served, p50/p95 latency of the normal ones, outcomes by kind (HTTP status or
connection error), the trickled uploads' outcomes, the slowest ``/health`` and how many took 1 s or more, the
server's RSS after warm-up and at the end, and its /health at the end. The server is stopped (SIGTERM) when
the run ends, and the seconds it took to exit are printed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from cdsjax.io.util import free_port

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"  # loopback only, by construction
QUESTIONS = ("What is this document about?", "Which table lists the figures for each year?",
             "What does the first chart show?", "Who is the intended audience?", "What are the main results?",
             "Which model or product is described?", "What do the authors conclude?", "What are the prices?")
HOSTILE = ("bad_options", "new_compile", "heavy", "big_body", "slow_upload", "disconnect", "bad_host",
           "crop_escape", "trickle", "pdf_swap", "giant_number")
SWAP_DOC = "load-test-swap.pdf"
SECRET = b"load-test secret: must never be served"
TRICKLE_HEAD = (b"POST /select HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n{\"question\": ")


def request_selectors() -> dict:
    """Display names the hostile requests use, from the selector registry: paper mode, the default, a
    converged CDS selector that takes beta (a new beta compiles a new selector), and support-targeted CDS (the
    converged CDS selector that takes no beta)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from cdsjax.core.registry import SPECS
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, PAPER_SELECTOR, display

    support = next(s for s in SPECS.values() if s.mode == "converged" and "beta" not in s.options)
    beta = next(s for s in SPECS.values() if s.mode == "converged" and "beta" in s.options)
    return dict(paper=display(PAPER_SELECTOR), default=display(DEFAULT_SELECTOR),
                support=display(support.name), beta=display(beta.name))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def post(url: str, body: bytes, timeout: float, headers=None) -> str:
    """The reply's status; a 503 labelled by its cause (see the module docstring)."""
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return str(r.status)
    except urllib.error.HTTPError as err:
        text = err.read().decode("utf-8", "replace")
        if err.code != 503:
            return str(err.code)
        return "503-" + ("lane" if "still finishing" in text else "queue" if "in flight" in text else
                         "uploads" if "uploads" in text else "other")


def trickle(port: int, limit: float = 60.0, unanswered: str = "never answered") -> str:
    """An upload that sends one byte a second until the server answers; the status it got (``unanswered``
    after ``limit`` seconds)."""
    sock = socket.create_connection((HOST, port), timeout=30)
    t0 = time.time()
    try:
        sock.sendall(TRICKLE_HEAD)
        while time.time() - t0 < limit:
            if select.select([sock], [], [], 1.0)[0]:
                head = sock.recv(64).split()
                return head[1].decode() if len(head) > 1 else "closed"
            sock.sendall(b" ")
        return unanswered
    except OSError as err:
        return f"error:{type(err).__name__}"
    finally:
        sock.close()


def raw(port: int, payload: bytes, *, hold: float = 0.0, read: bool = True) -> str:
    """Sends ``payload`` on a fresh connection, waits ``hold`` seconds, and returns the status (or why not)."""
    sock = socket.create_connection((HOST, port), timeout=30)
    try:
        sock.sendall(payload)
        if hold:
            time.sleep(hold)
        if not read:
            return "left"
        head = sock.recv(64).split()
        return head[1].decode() if len(head) > 1 else "closed"
    finally:
        sock.close()


class Swap:
    """The swappable document's PDF: swapped for a link to a secret file for one request at a time."""

    def __init__(self, pdf: Path, secret: Path):
        self.pdf, self.secret, self.lock = pdf, secret, threading.Lock()
        self.good = pdf.read_bytes()

    def request(self, url: str) -> str:
        with self.lock:
            self.pdf.unlink()
            self.pdf.symlink_to(self.secret)
            try:
                with urllib.request.urlopen(f"{url}/pdf?document={SWAP_DOC}", timeout=30) as r:
                    body, status = r.read(), str(r.status)
            except urllib.error.HTTPError as err:
                body, status = err.read(), str(err.code)
            finally:
                self.pdf.unlink()
                self.pdf.write_bytes(self.good)
        return "LEAK" if SECRET in body else status


class Client(threading.Thread):
    def __init__(self, url: str, port: int, stop: float, hostile: float, seed: int, budget: dict, timeout: float,
                 swap: Swap):
        super().__init__(daemon=True)
        self.url, self.port, self.stop_at, self.hostile, self.swap = url, port, stop, hostile, swap
        self.rng = random.Random(seed)
        self.names = request_selectors()
        self.budget = budget
        self.timeout = timeout
        self.latencies = []
        self.outcomes = collections.Counter()

    def run(self):
        while time.time() < self.stop_at:
            with self.budget["lock"]:
                if self.budget["left"] <= 0:
                    return
                self.budget["left"] -= 1
            kind = "normal" if self.rng.random() >= self.hostile else self.rng.choice(HOSTILE)
            t0 = time.perf_counter()
            try:
                outcome = str(self.one(kind))
            except (OSError, urllib.error.URLError) as err:
                outcome = f"error:{type(err).__name__}"
            if kind == "normal" and outcome == "200":
                self.latencies.append(time.perf_counter() - t0)
            self.outcomes[(kind, outcome)] += 1

    def one(self, kind: str):
        q = self.rng.choice(QUESTIONS)
        select = self.url + "/select"
        if kind == "normal":
            return post(select, json.dumps({"question": q}).encode(), self.timeout)
        if kind == "bad_options":
            body = {"question": q, "selector": self.names["paper"], "options": {"tol": -1, "max_iter": 2**31 - 1}}
            return post(select, json.dumps(body).encode(), self.timeout)
        if kind == "new_compile":
            body = {"question": q, "selector": self.names["beta"],
                    "options": {"beta": round(self.rng.uniform(0.1, 3), 6)}}
            return post(select, json.dumps(body).encode(), self.timeout)
        if kind == "heavy":
            body = {"question": q, "selector": self.names["paper"],
                    "options": {"beta": round(self.rng.uniform(0.1, 3), 6), "max_iter": 20000, "tol": 1e-12}}
            return post(select, json.dumps(body).encode(), self.timeout)
        if kind == "big_body":
            return post(select, b'{"question": "' + b"x" * (1 << 20) + b'"}', self.timeout)
        if kind == "slow_upload":
            head = (b"POST /select HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 5000\r\n\r\n{\"question\": ")
            return raw(self.port, head, hold=2.0, read=False)
        if kind == "disconnect":
            body = json.dumps({"question": q, "selector": self.names["support"],
                               "options": {"tau": round(self.rng.uniform(0, 0.2), 6)}}).encode()
            head = (b"POST /select HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body))
            return raw(self.port, head + body, hold=0.2, read=False)
        if kind == "bad_host":
            return raw(self.port, b"GET /documents HTTP/1.1\r\nHost: rebind.attacker.example\r\n"
                       b"Connection: close\r\n\r\n")
        if kind == "crop_escape":
            return raw(self.port, b"GET /crop?note=../../etc/passwd HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Connection: close\r\n\r\n")
        if kind == "trickle":
            return trickle(self.port)
        if kind == "pdf_swap":
            return self.swap.request(self.url)
        if kind == "giant_number":
            giant = b"9" * 401
            body = self.rng.choice([
                b'{"question": "x", "selector": "%s", "options": {"beta": %s}}' % (self.names["beta"].encode(), giant),
                b'{"question": "x", "budget": %s}' % giant, b'{"question": "x", "near_duplicates": -%s}' % giant])
            return post(select, body, self.timeout)
        raise ValueError(kind)


class Trickler(threading.Thread):
    """Keeps one trickled upload open until ``stop``; counts what the server answered."""

    def __init__(self, port: int, stop: float):
        super().__init__(daemon=True)
        self.port, self.stop_at = port, stop
        self.outcomes = collections.Counter()

    def run(self):
        while time.time() < self.stop_at:
            self.outcomes[trickle(self.port, max(1.0, self.stop_at - time.time()), "still open at the end")] += 1


PROBE = """
import sys, time, urllib.request
url, stop = sys.argv[1], float(sys.argv[2])
while time.time() < stop:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url + "/health", timeout=30) as r:
            r.read()
        print(time.perf_counter() - t0, flush=True)
    except OSError as err:
        print(type(err).__name__, flush=True)
    time.sleep(0.25)
"""


class HealthProbe(threading.Thread):
    """Times ``GET /health`` every quarter second until ``stop``, from a process of its own (so the clients'
    threads do not share its interpreter)."""

    def __init__(self, url: str, stop: float):
        super().__init__(daemon=True)
        self.url, self.stop_at = url, stop
        self.seconds = []
        self.failures = collections.Counter()

    def run(self):
        proc = subprocess.run([sys.executable, "-c", PROBE, self.url, str(self.stop_at)], capture_output=True,
                              text=True, timeout=self.stop_at - time.time() + 60)
        for line in proc.stdout.split():
            try:
                self.seconds.append(float(line))
            except ValueError:
                self.failures[line] += 1


def private_copy(index: Path, workdir: Path) -> Swap:
    """Copies ``index`` into ``workdir`` with one more document in its manifest (:data:`SWAP_DOC`): a copy of
    the index's first PDF, which :class:`Swap` swaps for a link to a secret file and back."""
    shutil.copytree(index, workdir / "index", symlinks=True)
    manifest_path = workdir / "index" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    source = manifest["documents"][0]
    pdf, secret = workdir / "swap.pdf", workdir / "secret.txt"
    shutil.copyfile(source["path"], pdf)
    secret.write_bytes(SECRET)
    manifest["documents"].append(dict(source, doc_id=SWAP_DOC, path=str(pdf)))
    manifest_path.write_text(json.dumps(manifest))
    return Swap(pdf, secret)


def start_server(indexes, args):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("CDSJAX_READER_URL", None)
    cmd = [sys.executable, "-m", "cdsjax.cli", "serve", *map(str, indexes), "--host", HOST, "--port", str(port),
           "--queue", str(args.queue), "--request-timeout", str(args.request_timeout),
           "--max-compiled", str(args.max_compiled), "--body-timeout", str(args.body_timeout)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise SystemExit(f"load_test: the server did not start: {line}{proc.stderr.read()[-2000:]}")
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its pipe drained
    return proc, port


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("indexes", nargs="+", help="index directories to serve")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--hostile", type=float, default=0.3, help="fraction of hostile requests (default 0.3)")
    p.add_argument("--max-requests", type=int, default=20000)
    p.add_argument("--queue", type=int, default=16)
    p.add_argument("--request-timeout", type=float, default=10.0)
    p.add_argument("--max-compiled", type=int, default=16)
    p.add_argument("--body-timeout", type=float, default=5.0)
    p.add_argument("--tricklers", type=int, default=32, help="trickled uploads kept open all the time (default 32)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not (1 <= args.clients <= 64 and 0 < args.seconds <= 900 and 0 <= args.hostile <= 1
            and 0 <= args.tricklers <= 256):
        raise SystemExit("load_test: --clients 1..64, --seconds up to 900, --hostile in [0, 1], --tricklers 0..256")
    workdir = Path(tempfile.mkdtemp(prefix="cdsjax-load-"))
    try:
        swap = private_copy(Path(args.indexes[0]), workdir)
        return run(args, [workdir / "index", *args.indexes[1:]], swap)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(args, indexes, swap: Swap) -> int:
    proc, port = start_server(indexes, args)
    url = f"http://{HOST}:{port}"
    try:
        for q in QUESTIONS:  # warm the encoder's buckets and the default selector
            post(url + "/select", json.dumps({"question": q}).encode(), 120)
        rss_before = rss_mb(proc.pid)
        print(f"load_test: warmed up; load average {os.getloadavg()[0]:.1f} at the start", flush=True)
        budget = dict(left=args.max_requests, lock=threading.Lock())
        stop = time.time() + args.seconds
        clients = [Client(url, port, stop, args.hostile, args.seed * 1000 + i, budget, args.request_timeout + 20,
                          swap) for i in range(args.clients)]
        tricklers = [Trickler(port, stop) for _ in range(args.tricklers)]
        probe = HealthProbe(url, stop)
        t0 = time.time()
        for thread in (probe, *tricklers, *clients):
            thread.start()
        samples = []  # (seconds, RSS MB) every tenth of the run
        while any(c.is_alive() for c in clients) and time.time() < stop + args.request_timeout + 60:
            samples.append((time.time() - t0, rss_mb(proc.pid)))
            time.sleep(max(1.0, args.seconds / 10))
        wall = time.time() - t0
        for thread in (probe, *tricklers):
            thread.join(timeout=args.body_timeout + 5)
        rss_after = rss_mb(proc.pid)
        with urllib.request.urlopen(url + "/health", timeout=30) as r:
            health = json.loads(r.read())
    finally:
        t_stop = time.time()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        stop_s = time.time() - t_stop
    report(clients, args, wall, rss_before, rss_after, health, stop_s, samples, tricklers, probe)
    return 0


def report(clients, args, wall, rss_before, rss_after, health, stop_s, samples, tricklers, probe) -> None:
    outcomes = collections.Counter()
    for c in clients:
        outcomes.update(c.outcomes)
    lat = sorted(x for c in clients for x in c.latencies)
    total = sum(outcomes.values())
    print(f"load_test: {args.clients} clients and {args.tricklers} tricklers for {wall:.1f} s, {args.hostile:.0%} "
          f"hostile, --queue {args.queue}, --request-timeout {args.request_timeout:g} s, --body-timeout "
          f"{args.body_timeout:g} s, --max-compiled {args.max_compiled}; load average {os.getloadavg()[0]:.1f}")
    print(f"requests: {total} ({total / wall:.1f}/s); normal answered 200: {len(lat)}")
    if lat:
        p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        print(f"normal latency: p50 {1000 * statistics.median(lat):.0f} ms, p95 {1000 * p95:.0f} ms, "
              f"max {1000 * lat[-1]:.0f} ms")
    print("outcomes by kind (HTTP status, or what the client saw):")
    for kind in ("normal", *HOSTILE):
        row = {o: n for (k, o), n in sorted(outcomes.items()) if k == kind}
        if row:
            print(f"  {kind:12s} " + ", ".join(f"{o}: {n}" for o, n in row.items()))
    trickled = collections.Counter()
    for t in tricklers:
        trickled.update(t.outcomes)
    print(f"trickled uploads ({args.tricklers} open at all times): " + ", ".join(f"{o}: {n}" for o, n in
                                                                           sorted(trickled.items())))
    if probe.seconds:
        slow = sum(s >= 1.0 for s in probe.seconds)
        print(f"/health: {len(probe.seconds)} probes, p50 {1000 * statistics.median(probe.seconds):.0f} ms, "
              f"max {1000 * max(probe.seconds):.0f} ms, {slow} took 1 s or more"
              + (f"; failed: {dict(probe.failures)}" if probe.failures else ""))
    print(f"server RSS: {rss_before:.0f} MB after warm-up, {rss_after:.0f} MB at the end; during the run: "
          + ", ".join(f"{t:.0f}s {m:.0f}" for t, m in samples))
    print(f"server /health at the end: queue {health['queue']}, compute {health['compute']}, "
          f"refused {health['refused']}")
    print(f"server stopped {stop_s:.1f} s after SIGTERM")


if __name__ == "__main__":
    sys.exit(main())

"""``cdsjax reader status | stop``: your local readers that stay warm between commands.

A local reader started by ``ask``, ``serve``, ``demo`` or the evaluation stays up for its keep-alive
(``--keep-alive SECONDS``, env CDSJAX_READER_KEEP_ALIVE, default 300) after its last use, so that the next
command of yours pays neither its start nor a cold prompt cache. It is found through the cdsjax cache
(``<cache>/readers/``, mode 0700: a record per server with its port, pid and API key), listens on 127.0.0.1 only
and answers only requests carrying that key.

    status   lists them: model, port, pid, seconds since the last use, keep-alive (``--json``: a list of
             objects with those fields, ``alive``, ``threads``, ``slots``, ``ctx_per_slot``, ``log``, ``record``)
    stop     stops them now and removes their records (exit 0, also when none runs)
"""

from __future__ import annotations

import json
import time

from cdsjax.commands import printable


def add_arguments(p) -> None:
    p.add_argument("action", choices=("status", "stop"), help="status: list them; stop: stop them now")
    p.add_argument("--json", action="store_true", help="print JSON (a list of servers)")


def run(args) -> int:
    from cdsjax.io.reading.local.records import list_readers, readers_dir, stop_readers

    servers = stop_readers() if args.action == "stop" else list_readers()
    if args.json:
        print(json.dumps(servers, indent=2))
        return 0
    if not servers:
        print(f"no local reader {'to stop' if args.action == 'stop' else 'running'} ({readers_dir()})")
        return 0
    if args.action == "stop":
        for s in servers:
            print(f"stopped {printable(s['model'] or 'a reader without a record')} (pid {s['pid']}, "
                  f"port {s['port']})")
        return 0
    now = time.time()
    for s in servers:
        if s["record"] is None:
            print(f"pid {s['pid']}: a reader whose record is gone (it exits once idle; `cdsjax reader stop`)")
            continue
        state = "up" if s["alive"] else "dead (its record is replaced at the next start)"
        up = f", up {now - s['started']:.0f}s" if s.get("started") else ""
        print(f"{printable(s['model'])}: port {s['port']}, pid {s['pid']}, {state}{up}, idle {s['idle_s']:.0f}s "
              f"of keep-alive {s['keep_alive']:g}s ({s['threads']} threads, {s['slots']} slots of "
              f"{s['ctx_per_slot']} tokens)")
    return 0

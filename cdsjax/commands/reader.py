"""``cdsjax reader status | stop``: your warm cdsjax server (:mod:`cdsjax.commands.warm`) — what it holds, or
stopping it now.

``cdsjax ask`` leaves the indexes it loaded, the encoder, the compiled selectors and the local reader in one
process of yours that stays up ``--keep-alive`` seconds after the last command (env CDSJAX_READER_KEEP_ALIVE,
default 300), so the next question pays neither loading nor the reader's start. It listens on a Unix socket in a
directory only you may enter (``$CDSJAX_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/cdsjax``, else ``cdsjax-UID`` in
the temporary directory); no network port is opened.

    status   what it holds: pid, memory, seconds idle and left, the index sets loaded and the readers running
             (``--json``: that object, or null when none runs)
    stop     stops it and its readers now (exit 0, also when none runs)
"""

from __future__ import annotations

import json

from cdsjax.commands import CLIError, printable


def add_arguments(p) -> None:
    p.add_argument("action", choices=("status", "stop"), help="status: what it holds; stop: stop it now")
    p.add_argument("--json", action="store_true", help="print JSON (the server's state, or null)")


def run(args) -> int:
    from cdsjax.commands.warm.client import WarmError, call
    from cdsjax.commands.warm.place import PlaceError, runtime_dir

    try:
        state = call({"op": args.action})
    except (WarmError, PlaceError) as err:
        raise CLIError(str(err), 1) from None
    if args.json:
        print(json.dumps(state, indent=2))
        return 0
    if state is None:
        print(f"no warm cdsjax server {'to stop' if args.action == 'stop' else 'running'} ({runtime_dir()})")
        return 0
    verb = "stopped" if args.action == "stop" else "running"
    print(f"warm cdsjax server {verb}: pid {state['pid']}, {state['memory_mb']} MiB, up {state['uptime_s']:.0f}s, "
          f"idle {state['idle_s']:.0f}s, {state['keep_alive_left_s']:.0f}s of keep-alive left, "
          f"{state['in_flight']} request(s) in flight")
    for entry in state["indexes"]:
        print(f"  indexes: {', '.join(printable(p) for p in entry['paths'])} ({entry['notes']} notes, idle "
              f"{entry['idle_s']:.0f}s)")
    for r in state["readers"]:
        print(f"  reader: {printable(r['model'])} (pid {r['pid']}, {r['memory_mb']} MiB, {r['threads']} threads, "
              f"{r['slots']} slots of {r['ctx_per_slot']} tokens, idle {r['idle_s']:.0f}s, "
              f"{r['keep_alive_left_s']:.0f}s of keep-alive left)")
    return 0

"""The warm cdsjax server: one process per user that owns everything warm for ``cdsjax ask`` — the loaded indexes
(a bounded set, least recently used out), the question encoder, the compiled selectors and the local reader's
llama.cpp children, each with an idle timer — so that a second question shows its evidence in under a second.

``cdsjax ask`` is its client (:mod:`~cdsjax.commands.warm.client`, no JAX imported): it finds this user's server
on a Unix socket in a directory only the user may enter (:mod:`~cdsjax.commands.warm.place`), or starts one,
sends the question (:mod:`~cdsjax.commands.warm.wire`: one JSON line, the answer back as JSON lines) and shows the
evidence and the answer as they come. The server (:mod:`~cdsjax.commands.warm.server`, ``python -m
cdsjax.commands.warm``) exits once it has been idle for the longest keep-alive any command gave it.
``cdsjax reader status|stop`` asks it what it holds, or stops it.
"""

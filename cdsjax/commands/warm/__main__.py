"""``python -m cdsjax.commands.warm [--keep-alive SECONDS]``: the warm server (:mod:`cdsjax.commands.warm.server`),
started by ``cdsjax ask`` when none runs."""

import sys

from cdsjax.commands.warm.server import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The entry-point preamble the absl-based experiment scripts share."""

import contextlib
import sys

from absl import app, flags, logging


def check_argv(argv) -> None:
    """Rejects positional arguments and quiets absl logging.

    Orbax logs every checkpoint read at INFO, which buries progress bars and tables,
    so absl logging drops to WARNING unless ``--verbosity`` was given.
    """
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")


def config_or_exit(argv, config, example: str):
    """:func:`check_argv`, then returns the loaded ``--config``.

    Args:
      argv: ``main``'s argv (no positional arguments are accepted).
      config: the value of the script's ``config_flags`` flag.
      example: config file named in the error when ``--config`` is missing.
    """
    check_argv(argv)
    if config is None:
        raise app.UsageError(f"--config is required, e.g. --config {example}")
    try:
        config.keys()  # a config file that failed to load raises here, on first use
    except OSError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        print(f"{argv[0].rsplit('/', 1)[-1]}: error: cannot load --config: {lines[-1] if lines else err}",
              file=sys.stderr)
        sys.exit(2)
    return config


@contextlib.contextmanager
def exit_on_user_error(prog: str):
    """Turns a bad config or missing data (ValueError, FileNotFoundError, KeyError) into one line on
    stderr and exit status 1 instead of a traceback."""
    try:
        yield
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(f"{prog}: error: {str(err).strip(chr(39) + chr(34))}", file=sys.stderr)
        sys.exit(1)


def parse_flags_or_exit(argv):
    """``app.run(main, flags_parser=parse_flags_or_exit)``: a config file that is missing or does not
    load (the config flag executes it while flags are parsed), or an override naming no field, is one line on
    stderr and exit status 2, not a traceback."""
    prog = argv[0].rsplit("/", 1)[-1] if argv else "experiment"
    try:
        return flags.FLAGS(argv)
    except flags.Error as err:
        message = str(err)
    except (AttributeError, KeyError) as err:  # an override naming no field of the config
        from cdsjax.config import unknown_field_message

        print(f"{prog}: error: {unknown_field_message(err, argv)}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:  # the config module itself failed: OSError, SyntaxError, NameError, ...
        message = f"{type(err).__name__}: {err}"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    detail = lines[-1] if lines else message
    head = lines[0] if lines else ""
    print(f"{prog}: error: {head}{' — ' + detail if detail != head else ''}", file=sys.stderr)
    sys.exit(2)

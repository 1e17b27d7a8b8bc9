"""What the config files share: one helper that reads the ``ARG`` of ``--config FILE:ARG``.

    python experiments/run_eval.py --config configs/pool_sweep.py:mmlongbench,10,similar
    python experiments/run_eval.py --config configs/pool_sweep.py:benchmark=qasper,size=20

A config declares its argument's fields and defaults once, ``common.parse_arg(arg, benchmark="mmlongbench",
size=5)``, and gets a ConfigDict back; the argument gives values by position (in the order declared), by
``name=value``, or both (positions first). Each value takes the type of its default.
"""

from typing import Optional

import ml_collections


def _typed(name: str, text: str, default):
    """``text`` as the type of ``default`` (bool: true/false/yes/no/1/0)."""
    if isinstance(default, bool):
        low = text.lower()
        if low not in ("true", "false", "yes", "no", "1", "0"):
            raise ValueError(f"config argument {name}: expected true or false, got {text!r}")
        return low in ("true", "yes", "1")
    if default is None or isinstance(default, str):
        return text
    try:
        return type(default)(text)
    except ValueError:
        raise ValueError(f"config argument {name}: expected {type(default).__name__}, got {text!r}") from None


def parse_arg(arg: Optional[str], **spec) -> ml_collections.ConfigDict:
    """The fields of ``spec`` (name -> default) with the values ``arg`` gives them.

    Args:
      arg: ``"a,b,c"`` (positional, in the order of ``spec``), ``"name=value,name2=value"``, a mix with the
        positional values first, or None / ``""`` for the defaults.
      **spec: the fields and their defaults.

    Raises:
      ValueError: more values than fields, an unknown or repeated name, or a value of the wrong type.
    """
    out = dict(spec)
    names = list(spec)
    given, named = set(), False
    parts = [p.strip() for p in (arg or "").split(",")] if (arg or "").strip() else []
    for position, part in enumerate(parts):
        if "=" in part:
            named = True
            name, text = (s.strip() for s in part.split("=", 1))
            if name not in spec:
                raise ValueError(f"config argument {arg!r}: unknown field {name!r} (fields: {', '.join(names)})")
        else:
            if named or position >= len(names):
                raise ValueError(f"config argument {arg!r}: expected at most {len(names)} values "
                                 f"({', '.join(names)}), positional ones first")
            name, text = names[position], part
        if name in given:
            raise ValueError(f"config argument {arg!r}: {name} is given twice")
        given.add(name)
        out[name] = _typed(name, text, spec[name])
    return ml_collections.ConfigDict(out)

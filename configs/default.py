r"""Default configuration for cdsjax: ingestion (parse, notes, embedding, index store).

The configuration itself lives in the package (:mod:`cdsjax.config`, so an installed cdsjax has it); this
file re-exports it so ``--config configs/default.py`` and ``from configs.default import get_config`` keep
working. Usage::

    from configs.default import get_config
    config = get_config()
    config.ingest.parser = "mineru"

    cdsjax index docs/*.pdf --out runs/index            # uses these defaults
"""

from cdsjax.config import get_config as package_config
from configs import common

__all__ = ["get_config"]


def get_config(arg=None):
    """:func:`cdsjax.config.get_config` (this config takes no argument)."""
    common.parse_arg(arg)
    return package_config()

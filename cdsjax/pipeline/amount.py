"""How many of the selected notes go to the reader: all of them (the fixed amount), or as many as the selection
says the answer needs (the adaptive amount): the equilibrium's support (fill picks from outside it left out) and
the notes whose relevance stays within ``delta`` of the best selected note's (scores that fall off are cut). The
reader's token budget then fits what is left, as before. ``experiments/evidence_amount.py`` measures both.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np


def notes_to_read(relevance: Sequence[float], *, support: Optional[int] = None,
                  delta: Optional[float] = None) -> List[int]:
    """The positions (in the selection's order) of the selected notes to read; at least the first where any was
    selected.

    Args:
      relevance: ``[k]`` relevance of each selected note to the question, in the selection's order.
      support: the equilibrium's support size (CDS), or None: only the first ``max(1, support)`` notes.
      delta: or None: only the notes whose relevance is at least the best selected note's minus ``delta``.
    """
    rel = np.asarray(relevance, np.float64).reshape(-1)
    k = int(rel.shape[0])
    if support is not None:
        k = min(k, max(1, int(support)))
    keep = list(range(k))
    if delta is not None and k:
        keep = [i for i in keep if rel[i] >= rel.max() - float(delta)] or [0]
    return keep

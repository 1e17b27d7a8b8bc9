"""What a fit of the learned game is told: :class:`FitConfig`, its grid of starts and the read-outs its
surrogate can score (how :func:`cdsjax.learn.fit.fit` uses them is said there)."""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence

from cdsjax.core.batching import DEFAULT_BUCKETS
from cdsjax.core.games.learned import LearnedParams

# The coarse grid the fit starts from: beta (the surrogate is not concave in it), relevance-weighted repulsion,
# and the same-page weight at one coarse value. The structure needs grid points of its own: at beta ~ 1 a
# small page weight barely changes the selection, so its gradient at theta0 is too weak to find it.
DEFAULT_STARTS = ({"beta": 0.1}, {"beta": 0.3}, {"beta": 1.0}, {"beta": 3.0},
                  {"beta": 0.3, "rel_repulsion": 1.0}, {"beta": 1.0, "rel_repulsion": 1.0},
                  {"beta": 0.03, "w_page": -1.0}, {"beta": 0.3, "w_page": -1.0}, {"beta": 0.1, "w_page": -3.0})


# what the surrogate counts: the selection's top-B ("top", selector cds_learned), or the pages of its one-note-per-page
# read-out ("pages", selector cds_learned_pages): each page scored by its best note (cdsjax.core.surrogates.page_readout_scores)
READOUTS = ("top", "pages")


@dataclasses.dataclass
class FitConfig:
    """How :func:`cdsjax.learn.fit.fit` runs (see its module docstring); ``readout`` is the selection the
    surrogate scores (:data:`READOUTS`)."""

    budget: int = 5
    steps: int = 30
    learning_rate: float = 0.05
    l2: float = 1e-3
    temperature: float = 0.2
    slack_weight: float = 1.0
    starts: Sequence[dict] = DEFAULT_STARTS
    num_starts_fitted: int = 2
    eval_every: int = 1
    patience: int = 5
    solver: str = "active_set"  # a name (cdsjax.core.solver_from_name): the active-set Newton solver
    tol: Optional[float] = None
    max_iter: Optional[int] = None
    dtype: str = "float64"
    buckets: Sequence[int] = DEFAULT_BUCKETS
    max_batch: int = 32
    checkpoint_dir: Optional[str] = None
    stop_after: Optional[int] = None
    progress: bool = True
    seed: int = 0
    readout: str = "top"
    # parameters held at the paper game's value (their gradient zeroed; grid starts that set one are skipped),
    # e.g. ("rel_repulsion",): a note block that does not read the question, so a served corpus shares one block
    frozen: Sequence[str] = ()

    @classmethod
    def from_mapping(cls, values: Any) -> "FitConfig":
        """From a dict or ``ConfigDict``; unknown keys raise ``ValueError``."""
        if hasattr(values, "to_dict"):
            values = values.to_dict()
        values = dict(values or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown fit option(s) {unknown}; allowed: {sorted(names)}")
        values = {k: v for k, v in values.items() if v is not None or k in ("tol", "max_iter", "checkpoint_dir",
                                                                            "stop_after")}
        if "starts" in values:
            values["starts"] = tuple(dict(s) for s in values["starts"])
        if "buckets" in values:
            values["buckets"] = tuple(int(b) for b in values["buckets"])
        if "frozen" in values:  # a sequence of names, or one comma-separated string (a command-line flag)
            given = values["frozen"]
            values["frozen"] = tuple(n.strip() for n in (given.split(",") if isinstance(given, str) else given)
                                     if str(n).strip())
        cfg = cls(**values)
        if cfg.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {cfg.dtype!r}")
        if cfg.readout not in READOUTS:
            raise ValueError(f"readout must be one of {list(READOUTS)}, got {cfg.readout!r}")
        for s in cfg.starts:
            LearnedParams.from_dict(s)
        unknown = sorted(set(cfg.frozen) - set(LearnedParams.names()))
        if unknown:
            raise ValueError(f"frozen names unknown parameter(s) {unknown}; parameters: {list(LearnedParams.names())}")
        if not cfg.free_starts():
            raise ValueError(f"every grid start sets a frozen parameter {list(cfg.frozen)}")
        return cfg

    def free_starts(self) -> List[tuple]:
        """``[(index, start)]`` of the grid starts that leave every frozen parameter at its paper value."""
        return [(i, s) for i, s in enumerate(self.starts) if not set(s) & set(self.frozen)]

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["starts"] = [dict(s) for s in self.starts]
        out["buckets"] = list(self.buckets)
        out["frozen"] = list(self.frozen)
        return out

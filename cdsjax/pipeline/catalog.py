"""The selectors as the product offers them: the default, the roles reports give selectors, the names users see,
and a line of help each.

The core registry (:data:`cdsjax.core.registry.SPECS`) is the table of selectors: what each one is, by its
registry name. This module holds the choices made about them above the core, and is where a name becomes a
selector: code, configs and records name a selector by its registry name (``cds_learned_pages``); users may also
write its *display form* (``cds-learned-pages``), which the CLI, the server and ``ask --json`` show, and ``-`` and
``_`` are interchangeable in either (``cds_paper`` is ``cds-paper``).
:func:`selector_spec` (the one lookup of a name; :func:`resolve` for a name a user gave, an unknown one a
:class:`~cdsjax.pipeline.errors.PipelineError`) reads either; :func:`selector_names` lists every spelling;
:func:`display` gives the display form. A caller resolves a name once and passes the spec down: every function
here that takes a name takes its spec as well, without a second lookup.

:data:`DEFAULT_SELECTOR` is also read as ``cdsjax.catalog.DEFAULT_SELECTOR`` (the alias module
:mod:`cdsjax.catalog`, the path the design's checks read).
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple, Union

from cdsjax.catalog import DEFAULT_SELECTOR  # the selector used when none is named (named once, there)
from cdsjax.core import registry
from cdsjax.pipeline.errors import PipelineError

# The plain baseline that comparisons are reported against (demo, figures, pool and support reports).
REFERENCE_SELECTOR = "cosine"
# The paper's method as published (replicator dynamics, its step cap): what reproductions compare.
PAPER_SELECTOR = "cds"
# the learned game read as its top-B (its parameters from a `cdsjax tune` file: --params / Pipeline(params=...))
LEARNED_SELECTOR = "cds_learned"

# registry name -> (display form, one line saying what it selects: CLI help, listings)
SHOWN: Mapping[str, Tuple[str, str]] = {
    "cosine": ("cosine", "the B notes most similar to the question"),
    "cosine_pages": ("cosine-pages", "cosine, taking the best note of each page first (paragraph group on text "
                                     "corpora)"),
    "random": ("random", "B notes drawn at random (seeded by the question id)"),
    "mmr": ("mmr", "maximal marginal relevance: relevance minus redundancy, greedily (lam)"),
    "dpp": ("dpp", "k-DPP greedy MAP: relevant and mutually dissimilar notes (theta, quality)"),
    "ppr": ("ppr", "personalised PageRank over the note links, seeded by similarity"),
    "subgraph": ("subgraph", "G2-Reader's subgraph readout over the note links"),
    "cds": ("cds-paper", "CDS, paper mode: replicator dynamics with the paper's step cap (may stop short of "
                         "equilibrium)"),
    "cds_converged": ("cds-converged", "CDS, converged: the equilibrium itself, found by the serving solver "
                                       "(primal-dual active set)"),
    "cds_inimdyn": ("cds-inimdyn", "CDS, converged by infection-immunization dynamics"),
    "cds_support": ("cds-support", "CDS with beta chosen per question so the support holds about B notes"),
    "cds_learned": ("cds-learned", "CDS with a fitted game (cdsjax tune): structure features, relevance shaping; "
                                   "--params FILE"),
    "mmr_pages": ("mmr-pages", "MMR's ranking read at most notes_per_page notes per page per round (lam, "
                               "notes_per_page)"),
    "dpp_pages": ("dpp-pages", "k-DPP's ranking read at most notes_per_page notes per page per round (theta, "
                               "notes_per_page)"),
    "cds_learned_pages": ("cds-learned-pages", "the learned game's equilibrium ranking read at most notes_per_page "
                                               "notes per printed page per round"),
}

# every spelling a user may write -> its registry name
_BY_SPELLING: Dict[str, str] = {**{shown: name for name, (shown, _) in SHOWN.items()},
                                **{name: name for name in registry.SPECS}}


def selector_names() -> Tuple[str, ...]:
    """Every spelling a user may write (registry names and display forms), sorted."""
    return tuple(sorted(_BY_SPELLING))


def selector_spec(name: Union[str, registry.SelectorSpec]) -> registry.SelectorSpec:
    """The registry spec of a registry name or display form (``cds-converged`` -> the spec of ``cds_converged``);
    a spec is returned as it is (a name resolved before is not looked up again).

    Raises:
      ValueError: an unknown name, listing every spelling.
    """
    if isinstance(name, registry.SelectorSpec):
        return name
    spelled = spelling(name)
    if spelled is None:
        raise ValueError(f"unknown selector {name!r}; choose one of: {', '.join(selector_names())} "
                         "(- and _ are interchangeable)")
    return registry.SPECS[_BY_SPELLING[spelled]]


def spelling(name: str) -> Optional[str]:
    """The known spelling (a key of :func:`selector_names`) ``name`` is, with ``-`` and ``_`` interchangeable
    (``cds_learned_pages`` = ``cds-learned-pages``, ``cds_paper`` = ``cds-paper``); None if it is none."""
    for candidate in (name, str(name).replace("-", "_"), str(name).replace("_", "-")):
        if candidate in _BY_SPELLING:
            return candidate
    return None


def display(name: Union[str, registry.SelectorSpec]) -> str:
    """The display form of a registry name, display form or spec (``cds`` -> ``cds-paper``)."""
    return SHOWN[selector_spec(name).name][0]


def resolve(name: Union[str, registry.SelectorSpec]) -> registry.SelectorSpec:
    """:func:`selector_spec` for a name a user gave: an unknown one is a one-line :class:`PipelineError`."""
    try:
        return selector_spec(name)
    except ValueError as err:
        raise PipelineError(str(err)) from None


def selectors_help() -> str:
    """Every selector for a help text, the default first: ``display (also name): help; ...``."""
    parts = []
    for name in (DEFAULT_SELECTOR, *(n for n in registry.SPECS if n != DEFAULT_SELECTOR)):
        shown, line = SHOWN[name]
        also = f" (also {name})" if name != shown else ""
        parts.append(f"{shown}{also}{' [default]' if name == DEFAULT_SELECTOR else ''}: {line}")
    return "; ".join(parts)

r"""Shared definition of the ablation sweeps (used by the per-benchmark configs here).

Each ablation config is its benchmark's main config (``configs/<benchmark>.py``, so
records use the same notes, embeddings and run identity) with ``selectors`` replaced
by labelled variants. A variant's label is ``<selector>_<param>=<value>`` (dots in the value written ``p``) and its
options live in ``selector_options[label]`` (``"selector"`` names the registry
entry), so one run evaluates a whole sweep and ``cdsjax.eval.figures.parse_label``
recovers (param, value) from the label alone.

Sweeps (CDS defaults elsewhere: uniform start, dissimilarity coupling, tau=0, beta=1;
the default setting appears once per sweep under that sweep's label):

* ``mmr``: MMR lambda in {0.3, 0.5, 0.7, 0.9}.
* ``prior``: CDS start: uniform, softmax of cosine relevance with T in
  {0.05, 0.1, 0.2}, or a diffusion over the note links.
* ``coupling``: note--note block: dissimilarity, similarity, none.
* ``tau``: query-edge threshold in {0, 0.3, 0.5, 0.6}.
* ``beta``: diversification strength in {0.5, 1, 2, 5}.
* ``tau_converged``, ``beta_converged``: the tau and beta sweeps with
  ``cds_converged`` (the active-set solver run to its tolerance; see
  ``cdsjax.core.registry.SPECS``) instead of paper-mode ``cds``.
* ``budget``: cosine, MMR (lambda 0.5) and CDS at every budget of ``BUDGETS``.
* ``all``: the mmr, prior, coupling, tau and beta sweeps in one run at the main budget.
"""

import importlib

import ml_collections

# sweep -> (selector, option name, values); a value may be (label value, options).
SWEEPS = {
    "mmr": ("mmr", "lam", (0.3, 0.5, 0.7, 0.9)),
    "prior": ("cds", "prior", (
        ("uniform", {"init": "uniform"}),
        ("softmax_T0.05", {"init": "softmax", "prior_temperature": 0.05}),
        ("softmax_T0.1", {"init": "softmax", "prior_temperature": 0.1}),
        ("softmax_T0.2", {"init": "softmax", "prior_temperature": 0.2}),
        ("diffusion", {"init": "diffusion"}),
    )),
    "coupling": ("cds", "coupling", ("dissimilarity", "similarity", "none")),
    "tau": ("cds", "tau", (0.0, 0.3, 0.5, 0.6)),
    "beta": ("cds", "beta", (0.5, 1.0, 2.0, 5.0)),
    # The same two sweeps solved to convergence (cds_converged: the active-set solver): separates the effect of the
    # setting from paper-mode replicator runs that stop at max_iter unconverged.
    "tau_converged": ("cds_converged", "tau", (0.0, 0.3, 0.5, 0.6)),
    "beta_converged": ("cds_converged", "beta", (0.5, 1.0, 2.0, 5.0)),
}
IN_ALL = ("mmr", "prior", "coupling", "tau", "beta")
BUDGET_SELECTORS = ("cosine", "mmr", "cds")
BUDGETS = (3, 5, 10, 15, 20)
SWEEP_NAMES = tuple(SWEEPS) + ("budget", "all")


def base_config(benchmark: str) -> ml_collections.ConfigDict:
    """``configs/<benchmark>.py``'s ``get_config()``."""
    return importlib.import_module(f"configs.{benchmark}").get_config()


def encode_value(value) -> str:
    """A label-safe spelling of a swept value: ConfigDict keys cannot hold dots, so
    ``0.3`` is written ``0p3`` (``cdsjax.eval.figures.parse_label`` reverses it)."""
    return str(value).replace(".", "p")


def sweep_variants(sweep: str) -> dict:
    """``label -> options`` (with ``"selector"``) of one sweep."""
    selector, param, values = SWEEPS[sweep]
    out = {}
    for value in values:
        shown, opts = value if isinstance(value, tuple) else (value, {param: value})
        out[f"{selector}_{param}={encode_value(shown)}"] = {"selector": selector, **opts}
    return out


def ablation_config(benchmark: str, sweep: str, *, budgets=None, max_queries=None) -> ml_collections.ConfigDict:
    """The main config of ``benchmark`` set up to run ``sweep``.

    Args:
      benchmark: ``"hotpotqa"``, ``"qasper"`` or ``"mmlongbench"``.
      sweep: one of :data:`SWEEP_NAMES`.
      budgets: budgets of the ``budget`` sweep (default :data:`BUDGETS`).
      max_queries: questions kept (file order); None keeps the main config's.
    """
    if sweep not in SWEEP_NAMES:
        raise ValueError(f"sweep must be one of {SWEEP_NAMES}, got {sweep!r}")
    config = base_config(benchmark)
    if max_queries is not None:
        config.max_queries = max_queries
    config.output_dir = f"runs/ablations/{benchmark}_{sweep}"
    if sweep == "budget":
        config.selectors = ",".join(BUDGET_SELECTORS)
        config.selector_options = ml_collections.ConfigDict({"mmr": {"lam": 0.5}})
        config.budgets = tuple(budgets or BUDGETS)
        return config
    variants = {}
    for name in (IN_ALL if sweep == "all" else (sweep,)):
        variants.update(sweep_variants(name))
    config.selectors = ",".join(["cosine"] + list(variants))
    config.selector_options = ml_collections.ConfigDict(variants)
    config.budgets = (config.budget,)
    return config

"""What defines a CDS game and its payoff, one module per job.

* :mod:`~cdsjax.core.games.affinity`: the paper's game (:class:`CDSParams`), the query-augmented affinity and the
  spectral penalty;
* :mod:`~cdsjax.core.games.learned`: the fitted game (:class:`LearnedParams`) and its structure features;
* :mod:`~cdsjax.core.games.spectral`, :mod:`~cdsjax.core.games.certified`: the penalty's bound, per question or per
  corpus, and the certified Lanczos bound it may use;
* :mod:`~cdsjax.core.games.payoff`: how a solver sees a game (:class:`DensePayoff`, :class:`SharedPayoff`).

Import a name from its module; this package re-exports nothing.
"""

r"""What defines a CDS game and its payoff, one module per job.

* :mod:`~cdsjax.core.games.affinity`: the paper's game (:class:`CDSParams`), the query-augmented affinity and the
  spectral penalty;
* :mod:`~cdsjax.core.games.learned`: the fitted game (:class:`LearnedParams`) and its structure features;
* :mod:`~cdsjax.core.games.certified`: the certified Lanczos bound of the penalty (below: the penalty's bound,
  per question or per corpus);
* :mod:`~cdsjax.core.games.payoff`: how a solver sees a game (:class:`DensePayoff`, :class:`SharedPayoff`).

Import a name from its module; this package re-exports nothing.

The penalty :math:`\alpha \ge \lambda_{\max}` without a per-question eigendecomposition
------------------------------------------------------------------------------------

The penalty of a CDS game is :math:`\alpha = \lambda_{\max}(A|_F) + \varepsilon` over the free block
:math:`F` (:func:`cdsjax.core.games.affinity.spectral_penalty`, one ``eigvalsh`` of the padded
``[m+n, m+n]`` matrix: O(n³), 0.3-0.6 s at n = 1024 on two cores). Two ways to avoid paying it per
question:

* **Once per corpus, exactly.** With ``alpha_from="free"`` and no pinned notes the free block is
  the note block :math:`W`, and for the paper game (and the learned game when its
  relevance-weighted repulsion is 0) :math:`W` does not depend on the question: the query rows are
  masked out before ``eigvalsh``, so the matrix it sees is the same for every question.
  :func:`~cdsjax.core.games.affinity.corpus_bound` and :func:`~cdsjax.core.games.learned.learned_corpus_bound` build that same matrix once (the note block
  by the same functions, zero query rows, the same padded size) and return the same number, bit for
  bit; a problem carrying it (``bound=``) skips the eigendecomposition. Which bound a selection uses is
  its strategy's (``strategy.corpus_bound(problem, params)``: the game's, or at :math:`\beta = 1` for
  ``Support``, None for ``Shared``).
* **Per question, certified.** Where the block does depend on the question (``alpha_from="full"``,
  pinned notes, peeling rounds, a learned game with relevance-weighted repulsion),
  :func:`~cdsjax.core.games.certified.certified_bound` returns an upper bound of :math:`\lambda_{\max}` in O(k n²) (k Lanczos
  steps): for *any* unit vector :math:`v` with :math:`\theta = v^\top A v` and residual
  :math:`r = Av - \theta v`,

  .. math:: A = A' + \theta vv^\top + (rv^\top + vr^\top), \qquad A'v = 0,

  so by Weyl :math:`\lambda_{\max}(A) \le \max(\theta, \lambda_{\max}(A'|_{v^\perp})) + \|r\|` and
  :math:`\lambda_{\max}(A'|_{v^\perp}) \le` the Gershgorin bound of :math:`A'`. Lanczos only finds a good
  :math:`v` (the top Ritz vector); the certificate does not depend on how :math:`v` was found. When the
  top eigenvalue stands clear of the rest (the CDS note block's Perron eigenvalue does), the bound is
  :math:`\theta + \|r\|`, within :math:`\|r\|` of :math:`\lambda_{\max}`; otherwise it is never worse
  than Gershgorin's bound of :math:`A` itself. A margin of :math:`2 n u \|A\|_\infty` (u the unit
  roundoff) covers the rounding of the products.

The CDS guarantee needs only :math:`\alpha > \lambda_{\max}(A|_F)`: with a larger :math:`\alpha` the
query still stays in the support; the free notes are penalised a little more, so the equilibrium
(and where :math:`\alpha` moves, the picks) can change.
"""

"""cdsjax: Constrained Dominant Set evidence selection for long-document QA, in JAX."""

__version__ = "0.1.0"

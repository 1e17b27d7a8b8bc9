"""``cdsjax.catalog.DEFAULT_SELECTOR``: the default selector, named once, at the path the design's checks read it
(DESIGN §7.5, "the default selector is named once, ``cdsjax.catalog.DEFAULT_SELECTOR``").

The selector catalog itself (the other roles, display forms, help lines, name lookup) is
:mod:`cdsjax.pipeline.catalog`, which reads its default here. Plain values and no imports.
"""

# The selector used when none is named: ask, serve, the pipeline, the integrations and the planning agent: the
# learned game read one note per printed page (its own shipped fit; text without printed pages: its top-B).
DEFAULT_SELECTOR = "cds_learned_pages"

__all__ = ["DEFAULT_SELECTOR"]

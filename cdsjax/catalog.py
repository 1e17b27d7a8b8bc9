"""``cdsjax.catalog.DEFAULT_SELECTOR``: the default selector, at the path the design's checks read it (DESIGN
§7.5, "the default selector is named once, ``cdsjax.catalog.DEFAULT_SELECTOR``").

The selector catalog itself (the default and the other roles, display forms, help lines, name lookup) is
:mod:`cdsjax.pipeline.catalog`; this module only names its default here. Code imports from there.
"""

from cdsjax.pipeline.catalog import DEFAULT_SELECTOR

__all__ = ["DEFAULT_SELECTOR"]

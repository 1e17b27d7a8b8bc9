"""YAKE keywords of a text: the lite notes' keywords (:mod:`cdsjax.io.notes`), also computed by the layout
helper process (:func:`cdsjax.io.parse.layout_split.keywords_in_helper`)."""

from __future__ import annotations

from typing import List

from cdsjax.memo import PROCESS


def extract_keywords(text: str, *, top: int, language: str = "en") -> List[str]:
    """Keywords of ``text`` by YAKE (unsupervised, single-document), best first."""
    text = " ".join(text.split())
    if len(text) < 3 or top <= 0:
        return []
    extractor = PROCESS.keyword_extractors.get((language, top), lambda: _yake(language, top))
    try:
        pairs = extractor.extract_keywords(text[:6000])
    except Exception:  # YAKE fails on some degenerate inputs (only digits/punctuation)
        return []
    return [kw for kw, _ in pairs]


def _yake(language: str, top: int):
    import yake

    return yake.KeywordExtractor(lan=language, n=3, top=top, dedupLim=0.7)

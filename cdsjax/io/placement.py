"""Where a note sits in its document: the document's title and the section heading above it.

A note is embedded and matched with the words that place it (:func:`context_of`), so a paragraph of "4.2
Experimental setup" is found by a question about the experimental setup even when its own sentences never say
so. Both come from the parsed text, in reading order, with no model:

* a **heading** is a paragraph of a text chunk (the parser joins a page's regions with blank lines, a section
  header being a region of its own) that reads as one: at most :data:`MAX_HEADING_WORDS` words, no sentence
  punctuation at its end, a letter in it, and numbered (``3``, ``4.2``, ``IV.``, ``A.1``) or in title or upper
  case;
* a note's **section** is the last heading at or before its place in reading order (a visual's: the heading
  above where it sits);
* the **title** is the first heading-like paragraph of the document's first page (None found: none).

Heuristics on text, so they miss: a heading run into its paragraph, a title set as ordinary text. A miss leaves
the note as it was (its own text).
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence

# the form of the placed text (:func:`placed_text`): part of an index entry's embedding key
PLACEMENT_VERSION = "after-1"
MAX_HEADING_WORDS = 12
MAX_HEADING_CHARS = 100
MAX_TITLE_CHARS = 160
_NUMBERED = re.compile(r"^(?:\d+(?:\.\d+)*\.?|[IVXLC]+\.|[A-Z](?:\.\d+)+\.?|[A-Z]\.)\s+\S")
_SMALL_WORDS = {"a", "an", "and", "as", "at", "by", "for", "from", "in", "into", "of", "on", "or", "the", "to",
                "vs", "via", "with"}


def is_heading(paragraph: str) -> bool:
    """Whether a paragraph of a text chunk reads as a section heading (module docstring)."""
    text = " ".join(paragraph.split())
    words = text.split()
    if not words or len(words) > MAX_HEADING_WORDS or len(text) > MAX_HEADING_CHARS:
        return False
    if text[-1] in ".,;:!?" and not _NUMBERED.match(text + " x"):
        return False
    if not re.search(r"[A-Za-z]{2}", text):
        return False
    if _NUMBERED.match(text):
        return True
    if text.isupper():
        return True
    capitalised = [w for w in words if w.lower() not in _SMALL_WORDS]
    return bool(capitalised) and all(w[0].isupper() or not w[0].isalpha() for w in capitalised)


def paragraphs(text: str) -> List[str]:
    """The blank-line separated paragraphs of a text chunk."""
    return [p.strip() for p in re.split(r"\n\s*\n", text or "") if p.strip()]


def place(elements: Sequence) -> tuple:
    """``(title, sections)`` of one document's elements in reading order: its title ("" for none found) and each
    element's section heading ("" before the first)."""
    title = ""
    sections: List[str] = []
    current = ""
    for el in elements:
        kind, page, text = _get(el, "kind"), _get(el, "page"), _get(el, "text") or ""
        if kind == "text" and _get(el, "role") in ("body", None):
            found = [p for p in paragraphs(text) if is_heading(p)]
            if not title and page == 0:
                first = paragraphs(text)[:1]
                if first and len(first[0]) <= MAX_TITLE_CHARS and len(first[0].split()) >= 2 \
                        and first[0][-1] not in ".,;:":
                    title = " ".join(first[0].split())
            # a chunk that opens with a heading is in that section; one that holds a heading later is still in
            # the section it started in, and the heading governs what follows
            opens = paragraphs(text)[:1]
            if opens and is_heading(opens[0]):
                current = " ".join(opens[0].split())
            sections.append(current)
            if found:
                current = " ".join(found[-1].split())
        else:
            sections.append(current)
    return title, sections


def placed_text(text: str, title: Optional[str], section: Optional[str]) -> str:
    """``text`` followed by its place (``"<text> (in: <title> / <section>)"``), or ``text`` alone without one.

    After the text, not before: an encoder reads a bounded number of tokens (MiniLM 256), so the place fills what
    a short note (a caption, a heading's paragraph) leaves free and never pushes a long note's own words out."""
    parts = [p for p in (title or "", section or "") if p]
    if len(parts) == 2 and parts[0] == parts[1]:
        parts = parts[:1]
    return f"{text} (in: {' / '.join(parts)})" if parts else text


def _get(el, name):
    return el.get(name) if isinstance(el, dict) else getattr(el, name, None)

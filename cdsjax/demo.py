"""The demo: a generated report that restates one finding many times, and which facts each selector finds.

The report is written here from content this project generates. One finding (battery storage cut diesel
use by 38 percent) is restated in an executive summary, an introduction sentence, a chart, its caption, a
results section and a conclusion. Beside it stand the distinct facts a full answer to the demo question
needs: how the saving was measured, a footnote that qualifies the number, and what the battery cost.
Each block sits on its own page, so each becomes its own note and the page says which fact a note holds.

``cdsjax demo`` asks the question, and for each selector prints which of the four facts its top-B covers
and how many of its B slots went to restatements of the finding. A similarity ranker tends to spend the
budget on the restatements; constrained-dominant-set selection is meant not to. Whether it does on this
report is measured each run and printed as measured.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Dict, Sequence

import numpy as np

QUESTION = ("How much did battery storage cut diesel use in the Harbour Island pilot, how was the saving measured, "
            "what caveat applies to the number, and what did the battery cost?")

TITLE = "Harbour Island Microgrid Pilot: Annual Report 2025"

SUMMARY = (
    "Executive summary. Over twelve months the Harbour Island pilot paired the island's diesel generators with a "
    "2 MWh battery and rooftop solar. The headline result: battery storage cut diesel use by 38 percent. The "
    "battery, more than the solar array, delivered the saving, because it let the generators switch off at "
    "night instead of idling. Diesel use falling by 38 percent is the pilot's main outcome."
)

INTRO = (
    "1 Introduction. Harbour Island relies on imported diesel for electricity, delivered by barge every two "
    "weeks. The pilot asked whether battery storage could cut the island's diesel use. In short, yes: battery "
    "storage cut diesel use by 38 percent over the year. The sections below present the results, the "
    "measurement method, the costs and the operational issues."
)

CAPTION_FIG = (
    "Figure 1: Monthly diesel use in thousands of litres, 2024 without the battery versus 2025 with it. "
    "Battery storage cut diesel use by 38 percent over the year."
)

RESULTS = (
    "2 Results. Diesel use fell from 1.21 million litres in 2024 to 0.75 million litres in 2025: battery "
    "storage cut diesel use by 38 percent. The saving was largest in the dry season, when the battery charged "
    "fully by noon, and smallest in December. Figure 1 shows the monthly diesel use."
)

METHOD = (
    "3 Measurement method. Every generator carries a calibrated fuel-flow meter logging once a minute; the "
    "meters were read remotely and checked against barge delivery receipts each quarter. The 2024 baseline "
    "was corrected for 6 percent growth in electricity demand, so the comparison is like for like."
)

FOOTNOTE = (
    "Footnote 1. The annual figure leaves out 19 days in August when the battery was offline for a warranty "
    "repair of one inverter. Counting those days, the reduction over the full year is 34 percent rather than "
    "the headline figure; the shortfall is entirely due to the repair outage."
)

COST = (
    "4 Costs. The battery system cost 1.9 million dollars installed, including inverters and the enclosure. "
    "At 2025 fuel prices it saves about 440,000 dollars a year, a simple payback of 4.3 years; the "
    "levelised cost of electricity fell from 0.41 to 0.29 dollars per kilowatt-hour."
)

ISSUES = (
    "5 Operational issues. Salt-laden air corroded the ventilation louvres of two enclosures within eight "
    "weeks; they were replaced with marine-grade stainless steel and fitted with filters in May. Night "
    "operators were unsure when to override the controller, which a two-day course and a checklist resolved."
)

LESSONS = (
    "6 Lessons for the next islands. Specify marine-grade enclosures from the start, test inverter firmware "
    "against recorded cloud transients before shipping, and train operators before commissioning. The same "
    "design is planned for North Cay and Pelican Rock in 2026."
)

CONCLUSION = (
    "7 Conclusion. The pilot met its goal: battery storage cut diesel use by 38 percent, and the islands that "
    "follow will copy the design. Cutting diesel use by 38 percent with one battery is the result to remember."
)

# The distinct facts a full answer to QUESTION needs, with a phrase of each that the test finds on its page.
FACTS = {
    "finding": "cut diesel use by 38 percent",
    "method": "fuel-flow meter",
    "caveat": "leaves out 19 days in August",
    "cost": "1.9 million dollars",
}

# Page (0-based) -> (fact, role): the page layout write_report produces. Every page holding the finding
# counts toward it; all but the first such note a selector picks are restatements.
PAGES = {
    0: ("finding", "summary"),
    1: ("finding", "intro"),
    2: ("finding", "chart+caption"),
    3: ("finding", "results"),
    4: ("method", "method"),
    5: ("caveat", "footnote"),
    6: ("cost", "cost"),
    7: (None, "issues"),
    8: (None, "lessons"),
    9: ("finding", "conclusion"),
}


def coverage(pages: Sequence[int]) -> Dict[str, object]:
    """Which facts the notes on ``pages`` (one per selected note, best first) cover.

    Returns:
      ``{"covered": [fact, ...] in FACTS order, "restatements": int, "other": int}``: restatements count the
      notes on finding pages beyond the first; other counts notes on pages that hold none of the facts.
    """
    roles = [PAGES.get(int(p), (None, "?"))[0] for p in pages]
    covered = [f for f in FACTS if f in roles]
    finding_notes = sum(1 for r in roles if r == "finding")
    return dict(covered=covered, restatements=max(0, finding_notes - 1), other=sum(1 for r in roles if r is None))


def _chart_png() -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    months = ["J", "F", "M", "A", "M", "J", "J", "A", "S", "O", "N", "D"]
    base = np.array([104, 97, 103, 99, 101, 98, 102, 104, 100, 99, 101, 112])
    cut = np.array([0.70, 0.66, 0.62, 0.58, 0.55, 0.53, 0.56, 0.58, 0.62, 0.66, 0.70, 0.72])
    fig, ax = plt.subplots(figsize=(6.0, 3.0), dpi=120)
    x = np.arange(12)
    ax.bar(x - 0.2, base, 0.4, label="2024 baseline", color="#8c8c8c")
    ax.bar(x + 0.2, base * cut, 0.4, label="2025 with battery", color="#2a7ab0")
    ax.set_xticks(x, months)
    ax.set_ylabel("diesel (thousand litres)")
    ax.legend(frameon=False, fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def write_report(path: Path) -> Path:
    """Writes the demo report PDF (A4, 10 pages, laid out as :data:`PAGES` says) to ``path``."""
    from cdsjax.io.parse.layout import import_pymupdf

    pymupdf = import_pymupdf()  # heavy: it loads the layout models

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = pymupdf.open()
    width, height = pymupdf.paper_size("a4")
    margin = 56

    def page_with(blocks):
        page = doc.new_page(width=width, height=height)
        y = margin
        for kind, content in blocks:
            if kind == "title":
                rect = pymupdf.Rect(margin, y, width - margin, y + 40)
                page.insert_textbox(rect, content, fontsize=16, fontname="hebo")
                y += 44
            elif kind == "text":
                rect = pymupdf.Rect(margin, y, width - margin, height - margin)
                page.insert_textbox(rect, content, fontsize=10.5, fontname="helv", align=3)
                lines = _estimate_lines(content, width - 2 * margin, 10.5)
                y += lines * 10.5 * 1.25 + 14
            elif kind == "figure":
                rect = pymupdf.Rect(margin + 20, y, width - margin - 20, y + 220)
                page.insert_image(rect, stream=content)
                y += 226
            elif kind == "caption":
                rect = pymupdf.Rect(margin, y, width - margin, y + 40)
                page.insert_textbox(rect, content, fontsize=9, fontname="heit")
                y += 40
            elif kind == "footnote":  # small print at the foot of the page, above a rule
                top = height - margin - 70
                page.draw_line((margin, top - 6), (margin + 160, top - 6), width=0.5)
                page.insert_textbox(pymupdf.Rect(margin, top, width - margin, height - margin), content,
                                    fontsize=8, fontname="helv")
        return page

    # One block per page, so each statement of the finding and each fact is its own note (see PAGES).
    page_with([("title", TITLE), ("text", SUMMARY)])
    page_with([("text", INTRO)])
    page_with([("figure", _chart_png()), ("caption", CAPTION_FIG)])
    page_with([("text", RESULTS)])
    page_with([("text", METHOD)])
    page_with([("footnote", FOOTNOTE)])
    page_with([("text", COST)])
    page_with([("text", ISSUES)])
    page_with([("text", LESSONS)])
    page_with([("text", CONCLUSION)])
    doc.set_metadata({"title": TITLE, "author": "cdsjax demo", "creationDate": "D:20250101000000",
                      "modDate": "D:20250101000000"})
    tmp = path.with_suffix(".tmp.pdf")
    doc.save(tmp, garbage=3, deflate=True, no_new_id=True)
    doc.close()
    tmp.replace(path)
    return path


def _estimate_lines(text: str, box_width: float, fontsize: float) -> int:
    from cdsjax.io.parse.layout import import_pymupdf

    pymupdf = import_pymupdf()  # heavy: it loads the layout models

    words = text.split()
    lines, current = 1, 0.0
    space = pymupdf.get_text_length(" ", fontname="helv", fontsize=fontsize)
    for w in words:
        wl = pymupdf.get_text_length(w, fontname="helv", fontsize=fontsize)
        if current and current + space + wl > box_width:
            lines += 1
            current = wl
        else:
            current = current + space + wl if current else wl
    return lines

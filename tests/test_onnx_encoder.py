"""The note encoder on onnxruntime equals the JAX forward and sentence-transformers; its graph is cached beside
the compilation cache, a damaged cached graph is rebuilt, and the backends are chosen as configured."""

import copy
import threading

import numpy as np
import pytest

from cdsjax.io import onnx_encoder
from cdsjax.io.query_encoder import QueryEncoder

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

MINILM = dict(model="all-MiniLM-L6-v2", query_prefix="", document_prefix="", normalize=True)
DOCUMENTS = [
    "How much did battery storage reduce diesel use?",
    "a",
    "Ünïcode café naïve — 12.5% of $3,000 (FY2021)?",
    "word " * 400,  # longer than max_seq_length: truncated
] + [f"Note {i}: revenue in region {i} grew by {3 * i}% over fiscal year 20{10 + i}." * (1 + i % 5) for i in range(25)]


@pytest.fixture()
def encoder():
    fast = QueryEncoder.from_info(MINILM)
    assert fast is not None
    fresh = copy.copy(fast)  # from_info shares one encoder per model: a copy with its own onnxruntime session
    fresh._onnx = None
    fresh._lock = threading.Lock()
    return fresh


def test_onnx_equals_jax_on_padded_batches(encoder, monkeypatch):
    """Batches of several lengths (with padding) and of one text, in any order, give the JAX forward's vectors."""
    want = encoder.encode_documents(DOCUMENTS, backend="jax")
    got = encoder.encode_documents(DOCUMENTS, backend="onnx")
    assert got.shape == want.shape == (len(DOCUMENTS), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)
    monkeypatch.setattr(onnx_encoder, "TOKEN_BUDGET", 1)  # one text per call: no padding at all
    np.testing.assert_allclose(encoder.encode_documents(DOCUMENTS[::-1], backend="onnx"), got[::-1], atol=2e-6)
    ids = np.array([[101, 2054, 2003, 102, 0, 0]]), np.array([[True] * 4 + [False] * 2])
    padded = encoder.onnx_forward()(*ids)
    alone = encoder.onnx_forward()(ids[0][:, :4], ids[1][:, :4])
    np.testing.assert_allclose(padded, alone, atol=1e-6)  # padding is masked out of attention and pooling
    assert encoder.encode_documents([], backend="onnx").shape == (0, 384)


def test_onnx_equals_sentence_transformers():
    from cdsjax.io.embed import Embedder
    from cdsjax.io.index import default_config

    cfg = default_config()
    cfg.embedder.show_progress = False
    cfg.embedder.document_prefix = "search_document: "
    cfg.embedder.backend = "onnx"
    fast = Embedder(cfg)
    cfg.embedder.backend = "sentence-transformers"
    reference = Embedder(cfg)
    np.testing.assert_allclose(fast.encode_documents(DOCUMENTS), reference.encode_documents(DOCUMENTS), atol=2e-5)


def test_graph_is_cached_beside_the_compilation_cache(encoder, tmp_path, monkeypatch):
    """With a compilation cache directory set, the graph is written there once; a later session reads it without
    building (``onnx`` not needed), and a damaged file is built and written again."""
    monkeypatch.setattr(onnx_encoder, "graph_cache_dir", lambda: str(tmp_path))
    want = encoder.encode_documents(DOCUMENTS[:6], backend="onnx")
    files = list(tmp_path.glob("*" + onnx_encoder.GRAPH_SUFFIX))
    assert len(files) == 1 and files[0].stat().st_size < 100_000  # the weights are not in it

    def no_build(*args, **kwargs):
        raise AssertionError("built although cached")

    monkeypatch.setattr(onnx_encoder, "bert_graph", no_build)
    encoder._onnx = None
    np.testing.assert_allclose(encoder.encode_documents(DOCUMENTS[:6], backend="onnx"), want, atol=1e-7)

    monkeypatch.undo()
    monkeypatch.setattr(onnx_encoder, "graph_cache_dir", lambda: str(tmp_path))
    files[0].write_bytes(b"not an onnx model")
    encoder._onnx = None
    np.testing.assert_allclose(encoder.encode_documents(DOCUMENTS[:6], backend="onnx"), want, atol=1e-7)
    assert files[0].read_bytes() != b"not an onnx model"  # replaced by a good graph


def test_backends_are_chosen_as_configured(monkeypatch):
    from cdsjax.io.embed import Embedder, EmbedderError
    from cdsjax.io.index import default_config

    cfg = default_config()
    cfg.embedder.show_progress = False
    calls = []
    real = QueryEncoder.encode_documents

    def spy(self, texts, **kwargs):
        calls.append(kwargs.get("backend"))
        return real(self, texts, **kwargs)

    monkeypatch.setattr(QueryEncoder, "encode_documents", spy)
    for backend in ("auto", "onnx", "jax"):
        cfg.embedder.backend = backend
        Embedder(cfg).encode_documents(DOCUMENTS[:2])
    assert calls == ["auto", "onnx", "jax"]

    # without onnx / onnxruntime: "auto" encodes in JAX, "onnx" says what is missing
    monkeypatch.setattr(onnx_encoder, "onnx_available", lambda: False)
    encoder = QueryEncoder.from_info(MINILM)
    plain = copy.copy(encoder)
    plain._onnx, plain._lock = None, threading.Lock()
    assert plain.onnx_forward() is None
    np.testing.assert_allclose(plain.encode_documents(DOCUMENTS[:3]), encoder.encode_documents(DOCUMENTS[:3],
                                                                                                backend="jax"))
    with pytest.raises(RuntimeError, match="onnxruntime encoder is not available: onnxruntime or onnx is not"):
        plain.encode_documents(DOCUMENTS[:3], backend="onnx")
    with pytest.raises(ValueError, match="backend must be"):
        plain.encode_documents(DOCUMENTS[:3], backend="torch")
    monkeypatch.setattr(QueryEncoder, "from_info", classmethod(lambda cls, info: plain))
    cfg.embedder.backend = "onnx"
    with pytest.raises(EmbedderError, match="backend 'onnx' cannot encode: onnxruntime or onnx is not installed"):
        Embedder(cfg).jax_encoder()


def test_session_threads_follow_the_process_share(monkeypatch):
    """A process whose onnxruntime sessions cdsjax limited (a parsing worker's share) leaves the encoder's thread
    count to that limit; otherwise the encoder takes one thread per usable core; its threads never spin."""
    import onnxruntime as ort

    seen = []
    plain = getattr(ort.InferenceSession, "cdsjax_base", ort.InferenceSession)  # as no limit had been set

    class Recording(plain):
        def __init__(self, graph, options=None, providers=None, **kwargs):
            seen.append((options.intra_op_num_threads, options.get_session_config_entry(
                "session.intra_op.allow_spinning")))
            super().__init__(graph, options, providers, **kwargs)

    encoder = QueryEncoder.from_info(MINILM)
    monkeypatch.setattr(ort, "InferenceSession", Recording)
    onnx_encoder.OnnxForward(encoder._weights, encoder._heads, encoder._eps, True)
    Recording.cdsjax_base = plain  # what limit_layout_threads leaves on the class it installs
    onnx_encoder.OnnxForward(encoder._weights, encoder._heads, encoder._eps, True)
    onnx_encoder.OnnxForward(encoder._weights, encoder._heads, encoder._eps, True, threads=3)
    assert seen == [(onnx_encoder.usable_cores(), "0"), (0, "0"), (3, "0")]


def test_a_failing_session_falls_back_to_jax_and_says_why(monkeypatch):
    """An onnxruntime that cannot build the session (e.g. one without opset 20's Gelu): "auto" encodes in JAX,
    "onnx" raises with onnxruntime's reason in one line."""

    def broken(*args, **kwargs):
        raise RuntimeError("Could not find an implementation for Gelu(20) node")

    monkeypatch.setattr(onnx_encoder, "OnnxForward", broken)
    encoder = copy.copy(QueryEncoder.from_info(MINILM))
    encoder._onnx, encoder._lock = None, threading.Lock()
    np.testing.assert_allclose(encoder.encode_documents(DOCUMENTS[:3]),
                               encoder.encode_documents(DOCUMENTS[:3], backend="jax"))
    with pytest.raises(RuntimeError, match=r"session failed \(RuntimeError: Could not find an implementation"):
        encoder.encode_documents(DOCUMENTS[:3], backend="onnx")

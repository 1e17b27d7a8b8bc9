"""The torch-free encoder equals sentence-transformers on questions and notes, and asking (a new PDF too) does
not import torch."""

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cdsjax.io.query_encoder import QueryEncoder, supported_model_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MINILM = dict(model="all-MiniLM-L6-v2", query_prefix="", document_prefix="", normalize=True)

TEXTS = [
    "How much did battery storage reduce diesel use?",
    "a",
    "Ünïcode café naïve — 12.5% of $3,000 (FY2021)?",
    "word " * 400,  # longer than max_seq_length: truncated the same way
]


def test_matches_sentence_transformers():
    from cdsjax.io.embed import Embedder

    fast = QueryEncoder.from_info(MINILM)
    assert fast is not None
    reference = Embedder.from_info(MINILM).encode_queries(TEXTS)
    got = fast.encode_queries(TEXTS)
    assert got.shape == reference.shape == (len(TEXTS), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference, atol=2e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_prefix_is_applied():
    fast = QueryEncoder.from_info(MINILM)
    prefixed = QueryEncoder.from_info(dict(MINILM, query_prefix="search_query: "))
    a = fast.encode_queries(["search_query: what is it?"])
    b = prefixed.encode_queries(["what is it?"])
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_unsupported_models_fall_back():
    assert supported_model_dir(dict(MINILM, model="nomic-ai/nomic-embed-text-v1.5", trust_remote_code=True)) is None
    assert supported_model_dir(dict(MINILM, model="/nonexistent/model")) is None
    assert QueryEncoder.from_info(dict(MINILM, model="/nonexistent/model")) is None


DOCUMENTS = TEXTS + [f"Note {i}: revenue in region {i} grew by {3 * i}% over fiscal year 20{10 + i}." * (1 + i % 4)
                     for i in range(20)]  # two batches of 16 (one filled up with filler rows), two length buckets


def test_documents_match_sentence_transformers():
    """The JAX backend of Embedder (the default for MiniLM on the CPU) equals sentence-transformers on notes:
    batches, length buckets, filler rows and the order of the texts change nothing."""
    from cdsjax.io.embed import Embedder
    from cdsjax.io.index import default_config

    cfg = default_config()
    cfg.embedder.show_progress = False
    cfg.embedder.document_prefix = "search_document: "
    fast = Embedder(cfg)
    assert fast.jax_encoder() is not None
    cfg.embedder.backend = "sentence-transformers"
    reference = Embedder(cfg)
    assert reference.jax_encoder() is None
    want = reference.encode_documents(DOCUMENTS)
    got = fast.encode_documents(DOCUMENTS)
    assert got.shape == want.shape == (len(DOCUMENTS), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    np.testing.assert_allclose(fast.encode_documents(DOCUMENTS[::-1]), got[::-1], atol=1e-6)
    assert fast.encode_documents([]).shape == (0, 384) and fast.dim == 384
    np.testing.assert_allclose(fast.encode_queries(TEXTS[:1]), reference.encode_queries(TEXTS[:1]), atol=2e-5)


def test_compiler_options_change_nothing_and_fall_back(monkeypatch):
    """The encoder's XLA options (:data:`ENCODER_COMPILER_OPTIONS`) leave the vectors as a plain ``jax.jit``
    computes them (within float rounding), and an XLA that rejects an option gets the plain compile, once and
    for every later encoder."""
    import jax

    from cdsjax.io import query_encoder

    fast = QueryEncoder.from_info(MINILM)
    tuned = fast.encode_queries(TEXTS)
    monkeypatch.setattr(query_encoder._Jitted, "_plain_only", True)
    plain = copy.copy(fast)  # from_info shares one encoder per model: change a copy's forwards only
    plain._forward, plain._forward_batch = query_encoder._jit_forwards(12, 1e-12, True)
    np.testing.assert_allclose(plain.encode_queries(TEXTS), tuned, atol=1e-6, rtol=0)

    monkeypatch.setattr(query_encoder._Jitted, "_plain_only", False)
    monkeypatch.setattr(query_encoder, "ENCODER_COMPILER_OPTIONS", {"xla_no_such_option_here": ""})
    rejected = query_encoder._Jitted(lambda x: x * 2.0)
    assert float(rejected(jax.numpy.float32(1.5))) == 3.0
    assert query_encoder._Jitted._plain_only  # remembered: later encoders compile plainly at once
    with pytest.raises(TypeError):  # any other error is the caller's
        query_encoder._Jitted(lambda x: x * 2.0)("not an array")


def test_jax_backend_refuses_what_it_cannot_encode():
    from cdsjax.io.embed import Embedder, EmbedderError
    from cdsjax.io.index import default_config

    cfg = default_config()
    cfg.embedder.backend = "jax"
    cfg.embedder.device = "cuda"
    with pytest.raises(EmbedderError, match="backend 'jax'"):
        Embedder(cfg).jax_encoder()
    cfg.embedder.backend = "torch"
    with pytest.raises(EmbedderError, match="backend must be one of"):
        Embedder(cfg)


def test_ask_on_a_new_pdf_does_not_import_torch(data_root, tmp_path):
    """Indexing a PDF and asking it, in one fresh process, never imports torch (notes and question embedded in
    JAX), and fills the persistent compilation cache in the cdsjax cache directory."""
    pdf = data_root / "pdfs" / "multicolumn.pdf"
    code = (
        "import sys, io, contextlib, json\n"
        "from cdsjax import cli\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    rc = cli.main(['ask', {str(pdf)!r}, 'What is the document about?', '--json'])\n"
        "heavy = sorted(m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules)\n"
        "print(json.dumps(dict(rc=rc, heavy=heavy, n=len(json.loads(buf.getvalue())['evidence']))))\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT, CDSJAX_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == dict(rc=0, heavy=[], n=result["n"]) and result["n"] >= 1
    assert any((tmp_path / "cache" / "jax-compilation").iterdir())

"""The onnxruntime encoder (the model's own ONNX export, tokenizers, numpy pooling) equals sentence-transformers
within 1e-5 on questions and notes; its export is found by the weights' hash and replaced when damaged; the
backends are chosen as configured; asking a new PDF imports no torch."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from cdsjax.io import onnx_encoder
from cdsjax.io.model_files import resolve_model
from cdsjax.io.onnx_encoder import SentenceEncoder, supported_model_dir

pytest.importorskip("onnxruntime")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MINILM = dict(model="all-MiniLM-L6-v2", query_prefix="", document_prefix="", normalize=True)
TEXTS = [
    "How much did battery storage reduce diesel use?",
    "a",
    "",
    "Ünïcode café naïve — 12.5% of $3,000 (FY2021)?",
    "word " * 400,  # longer than max_seq_length: truncated the same way
]
# several onnxruntime calls of several padded lengths (TOKEN_BUDGET), one of a single long text
DOCUMENTS = TEXTS + [f"Note {i}: revenue in region {i} grew by {3 * i}% over fiscal year 20{10 + i}." * (1 + i % 5)
                     for i in range(30)]


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' own model of the shipped MiniLM (its modules.json: Transformer, Pooling, Normalize)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(resolve_model("all-MiniLM-L6-v2")[0], device="cpu")


@pytest.fixture(scope="module")
def encoder():
    fast, why = SentenceEncoder.try_from_info(MINILM)
    assert fast is not None, why
    return fast


@pytest.mark.slow
def test_questions_match_sentence_transformers(encoder, reference):
    want = reference.encode(TEXTS, convert_to_numpy=True)
    got = encoder.encode_queries(TEXTS)
    assert got.shape == want.shape == (len(TEXTS), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


@pytest.mark.slow
def test_notes_match_sentence_transformers(encoder, reference):
    """Padded batches of several lengths, in any order, give sentence-transformers' vectors; the prefix is
    applied (as the Embedder applies it)."""
    prefixed = SentenceEncoder.from_info(dict(MINILM, document_prefix="search_document: "))
    want = reference.encode(["search_document: " + t for t in DOCUMENTS], convert_to_numpy=True)
    got = prefixed.encode_documents(DOCUMENTS)
    assert got.shape == (len(DOCUMENTS), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(prefixed.encode_documents(DOCUMENTS[::-1]), got[::-1], atol=1e-6)
    np.testing.assert_allclose(encoder.encode_documents(["search_document: " + t for t in DOCUMENTS]), got,
                               atol=1e-6)
    assert encoder.encode_documents([]).shape == (0, 384) and encoder.encode_queries([]).shape == (0, 384)


def test_embedder_uses_it_and_matches_sentence_transformers():
    from cdsjax.io.embed import Embedder
    from cdsjax.io.index import default_config

    cfg = default_config()
    cfg.embedder.show_progress = False
    fast = Embedder(cfg)
    assert isinstance(fast.onnx_encoder(), SentenceEncoder) and fast.dim == 384
    cfg.embedder.backend = "sentence-transformers"
    slow = Embedder(cfg)
    assert slow.onnx_encoder() is None
    np.testing.assert_allclose(fast.encode_documents(DOCUMENTS), slow.encode_documents(DOCUMENTS), atol=1e-5)
    np.testing.assert_allclose(fast.encode_queries(TEXTS), slow.encode_queries(TEXTS), atol=1e-5)


def _model_copy(tmp_path, **replace):
    """A copy of the shipped model's directory (files linked), with ``replace``: relative path -> new text."""
    source = resolve_model("all-MiniLM-L6-v2")[0]
    target = tmp_path / "model"
    shutil.copytree(source, target, copy_function=os.symlink)
    for name, text in replace.items():
        (target / name).unlink()
        (target / name).write_text(text)
    return target


def test_only_supported_models(tmp_path):
    assert supported_model_dir(MINILM) is not None
    assert supported_model_dir(dict(MINILM, model="nomic-ai/nomic-embed-text-v1.5", trust_remote_code=True)) is None
    assert supported_model_dir(dict(MINILM, model=str(tmp_path / "nonexistent"))) is None
    assert SentenceEncoder.from_info(dict(MINILM, model=str(tmp_path / "nonexistent"))) is None
    missing, why = SentenceEncoder.try_from_info(dict(MINILM, model=str(tmp_path / "nonexistent")))
    assert missing is None and "not a local sentence-transformers model" in why
    cls = json.dumps(dict(word_embedding_dimension=384, pooling_mode_cls_token=True, pooling_mode_mean_tokens=False))
    assert supported_model_dir(dict(model=str(_model_copy(tmp_path, **{"1_Pooling/config.json": cls})))) is None


def test_export_is_found_by_the_weights_hash(encoder, tmp_path, monkeypatch):
    """``$CDSJAX_CACHE``'s export is looked for first, then the default cache's; a model whose weights differ has
    another name (no export found for it); a damaged export is written again."""
    root = supported_model_dir(MINILM)
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    dirs = onnx_encoder.export_dirs()
    assert dirs[0] == tmp_path / "cache" / "onnx" and len(dirs) == 2
    name = onnx_encoder.export_name(onnx_encoder.weights_sha256(root))
    assert encoder.path.name == name
    dirs[0].mkdir(parents=True)
    shutil.copyfile(encoder.path, dirs[0] / name)
    assert onnx_encoder.find_export(root, export=False) == dirs[0] / name

    other = _model_copy(tmp_path)
    (other / "model.safetensors").unlink()
    shutil.copyfile(root / "model.safetensors", other / "model.safetensors")
    with open(other / "model.safetensors", "ab") as f:
        f.write(b" ")  # other bytes: another hash
    assert onnx_encoder.find_export(other, export=False) is None

    exported = []

    def export(model_root, path):  # stands in for torch's export (seconds): the good file again
        exported.append((model_root, path))
        shutil.copyfile(encoder.path, path)
        return path

    monkeypatch.setattr(onnx_encoder, "export_model", export)
    (dirs[0] / name).write_bytes(b"not an onnx model")
    fresh = SentenceEncoder(root, MINILM)
    assert exported == [(root, dirs[0] / name)]
    np.testing.assert_allclose(fresh.encode_queries(TEXTS), encoder.encode_queries(TEXTS), atol=1e-7)


def test_export_model_writes_the_transformer(encoder, tmp_path):
    """torch's export of the model's transformer, made afresh, runs to the same vectors as the export in use; it
    is written whole under its name with no temporary file left beside it."""
    root = supported_model_dir(MINILM)
    path = onnx_encoder.export_model(root, tmp_path / "exports" / "model.onnx")
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx"]
    fresh = SentenceEncoder.__new__(SentenceEncoder)
    fresh.__dict__.update(encoder.__dict__, path=path, session=onnx_encoder.session(path))
    np.testing.assert_allclose(fresh.encode_documents(DOCUMENTS), encoder.encode_documents(DOCUMENTS), atol=1e-6)


def test_session_threads_follow_the_process_share(encoder, monkeypatch):
    """A process whose layout sessions cdsjax limited (a parsing worker's share) gives the encoder that share of
    threads; otherwise the encoder takes one thread per usable core; its threads never spin."""
    import onnxruntime as ort

    from cdsjax.io.parse import layout

    seen = []
    plain = ort.InferenceSession

    class Recording(plain):
        def __init__(self, path, options=None, providers=None, **kwargs):
            seen.append((options.intra_op_num_threads, options.get_session_config_entry(
                "session.intra_op.allow_spinning")))
            super().__init__(path, options, providers, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Recording)
    monkeypatch.setattr(layout.PROCESS, "limits", None)  # as no share had been chosen
    onnx_encoder.session(encoder.path)
    monkeypatch.setattr(layout.PROCESS, "limits", layout.SessionLimits(2))  # what limit_layout_threads(2) sets
    onnx_encoder.session(encoder.path)
    onnx_encoder.session(encoder.path, threads=3)
    assert seen == [(onnx_encoder.usable_cores(), "0"), (2, "0"), (3, "0")]


def test_backends_are_chosen_as_configured(monkeypatch):
    from cdsjax.io.embed import Embedder, EmbedderError
    from cdsjax.io.index import default_config

    cfg = default_config()
    cfg.embedder.backend = "jax"  # the JAX forward is gone
    with pytest.raises(EmbedderError, match="backend must be one of"):
        Embedder(cfg)
    cfg.embedder.backend = "onnx"
    cfg.embedder.device = "cuda"
    with pytest.raises(EmbedderError, match="backend 'onnx' cannot encode on 'cuda'"):
        Embedder(cfg).onnx_encoder()
    cfg.embedder.device = "cpu"

    def failing(cls, info):
        return None, "the ONNX export failed (ModuleNotFoundError: No module named 'torch')"

    monkeypatch.setattr(SentenceEncoder, "try_from_info", classmethod(failing))
    with pytest.raises(EmbedderError, match="backend 'onnx' cannot encode with 'all-MiniLM-L6-v2': the ONNX export"):
        Embedder(cfg).onnx_encoder()
    cfg.embedder.backend = "auto"
    assert Embedder(cfg).onnx_encoder() is None  # sentence-transformers encodes


@pytest.mark.slow
def test_ask_on_a_new_pdf_does_not_import_torch(encoder, data_root, tmp_path):
    """Indexing a PDF and asking it, in one fresh process whose cdsjax cache holds the export, never imports
    torch (notes and question on onnxruntime), and fills the persistent compilation cache there."""
    (tmp_path / "cache" / "onnx").mkdir(parents=True)
    shutil.copyfile(encoder.path, tmp_path / "cache" / "onnx" / encoder.path.name)
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
    env = dict(os.environ, PYTHONPATH=ROOT, CDSJAX_CACHE=str(tmp_path / "cache"), HOME=str(tmp_path / "home"))
    env.pop("CDSJAX_JAX_CACHE", None)  # the cache in the cdsjax cache directory, as users get it
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == dict(rc=0, heavy=[], n=result["n"]) and result["n"] >= 1
    assert any((tmp_path / "cache" / "jax-compilation").iterdir())

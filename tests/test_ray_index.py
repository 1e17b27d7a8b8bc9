"""`cdsjax index --ray`: documents built as Ray tasks on a local 2-CPU Ray give the local path's index, with a
worker killed mid-run (retried, nothing lost), and a document that cannot be built reported in one line."""

import numpy as np

from cdsjax.cli import main
from cdsjax.io.index import load_index
from cdsjax.io.index.on_ray import FAULT_ENV
from tests import ingest_pdfs as gen
from tests.conftest import require_module

ray = require_module("ray")  # cdsjax[ray]: make test installs it; fails under CI=true when missing


def _entries(cache):
    docs = cache / "docs"
    return sorted(p.name for sub in docs.iterdir() if not sub.name.startswith(".") for p in sub.iterdir())


def test_ray_index_equals_local_with_a_worker_killed(tmp_path, monkeypatch, capsys):
    pdfs = [gen.make_synthetic_pdf(tmp_path / "a.pdf"), gen.make_text_pdf(tmp_path / "b.pdf", pages=3),
            gen.make_image_only_pdf(tmp_path / "scan.pdf"), gen.make_corrupt_pdf(tmp_path / "bad.pdf")]
    paths = [str(p) for p in pdfs]

    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache-local"))
    rc = main(["index", *paths, "--out", str(tmp_path / "local"), "--workers", "1", "--no-progress"])
    local_out = capsys.readouterr()
    assert rc == 1 and "3 processed" in local_out.out, local_out.err  # bad.pdf: one line, skipped

    marker = tmp_path / "killed-once"
    monkeypatch.setenv(FAULT_ENV, str(marker))  # the first document task kills its own worker process
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache-ray"))
    # the shared test machine can run near its memory limit, where Ray's own memory monitor would kill (and
    # retry, again and again) tasks that the kernel lets run: off here, the test is about a killed worker
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _system_config={"memory_monitor_refresh_ms": 0})
    try:
        rc = main(["index", *paths, "--out", str(tmp_path / "on-ray"), "--no-progress", "--ray"])
        ray_out = capsys.readouterr()
    finally:
        ray.shutdown()
    assert marker.exists(), "no worker was killed: the test did not test the retry"
    assert rc == 1 and "3 processed, 0 from the cache; failed 1" in ray_out.out, ray_out.err
    errors = [line for line in ray_out.err.splitlines() if line.startswith("cdsjax index: error:")]
    assert len(errors) == 1 and "bad.pdf" in errors[0], ray_out.err  # the same one line as the local path
    assert "Traceback" not in ray_out.err

    local, on_ray = load_index(tmp_path / "local"), load_index(tmp_path / "on-ray")
    assert local.doc_ids == on_ray.doc_ids == ["a.pdf", "b.pdf", "scan.pdf"]
    strip = lambda n: {k: v for k, v in n.items() if k != "image_path"}  # absolute paths into each index
    assert [strip(n) for n in local.notes] == [strip(n) for n in on_ray.notes]
    assert [n.get("image_sha256") for n in local.notes] == [n.get("image_sha256") for n in on_ray.notes]
    assert local.elements() == on_ray.elements()
    np.testing.assert_allclose(local.embeddings, on_ray.embeddings, atol=1e-5)
    assert (local.links == on_ray.links).all()
    # every document was committed to the cache by the driver; same bytes, same hashes
    assert _entries(tmp_path / "cache-local") == _entries(tmp_path / "cache-ray")
    a, b = (load_index(tmp_path / d).manifest["documents"] for d in ("local", "on-ray"))
    assert [d["hashes"] for d in a] == [d["hashes"] for d in b]

    # a second run finds everything in the cache: nothing is built again (a killed run resumes the same way)
    rc = main(["index", *paths[:3], "--out", str(tmp_path / "again"), "--no-progress", "--ray"])
    again = capsys.readouterr()
    assert rc == 0 and "0 processed, 3 from the cache" in again.out, again.err

"""`cdsjax index --workers N`: documents built in a process pool give the same index as one worker."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cdsjax.cli import main
from cdsjax.io.index import load_index
from tests import ingest_pdfs as gen


@pytest.mark.slow
def test_two_workers_equal_one(tmp_path, monkeypatch, capsys):
    pdfs = [gen.make_synthetic_pdf(tmp_path / "a.pdf"), gen.make_text_pdf(tmp_path / "b.pdf", pages=3),
            gen.make_image_only_pdf(tmp_path / "scan.pdf")]
    indexes = {}
    for workers in (1, 2):
        monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / f"cache{workers}"))  # nothing shared between runs
        out = tmp_path / f"index{workers}"
        rc = main(["index", *map(str, pdfs), "--out", str(out), "--workers", str(workers), "--no-progress"])
        captured = capsys.readouterr()
        assert rc == 0, captured.err
        assert "3 processed, 0 from the cache" in captured.out
        # every document was committed to the cache (by the worker that built it)
        # (entries live under the first two hex digits of their key: two documents may share that directory)
        docs = tmp_path / f"cache{workers}" / "docs"
        assert len([e for d in docs.iterdir() if not d.name.startswith(".") for e in d.iterdir()]) == 3
        indexes[workers] = load_index(out)
    one, two = indexes[1], indexes[2]
    assert one.doc_ids == two.doc_ids == ["a.pdf", "b.pdf", "scan.pdf"]
    assert [n["note_id"] for n in one.notes] == [n["note_id"] for n in two.notes]
    strip = lambda n: {k: v for k, v in n.items() if k != "image_path"}  # absolute paths differ
    assert [strip(n) for n in one.notes] == [strip(n) for n in two.notes]
    assert [e["element_id"] if "element_id" in e else json.dumps(e, sort_keys=True) for e in one.elements()] == \
        [e["element_id"] if "element_id" in e else json.dumps(e, sort_keys=True) for e in two.elements()]
    np.testing.assert_allclose(one.embeddings, two.embeddings, atol=1e-5)
    assert (one.links == two.links).all()


def test_worker_failure_is_one_line(tmp_path, monkeypatch, capsys):
    """A document failing inside a worker (here: its MinerU content list is not JSON) is one line naming the
    file; the other documents still finish and are indexed."""
    from tests.test_parse import _write_mineru_output

    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    pdfs = [gen.make_synthetic_pdf(tmp_path / name) for name in ("a.pdf", "b.pdf")]
    pdfs.append(gen.make_text_pdf(tmp_path / "c.pdf", pages=2))
    for pdf in pdfs[:2]:
        _write_mineru_output(tmp_path / "mineru", pdf)
    broken = tmp_path / "mineru" / "c" / "auto" / "c_content_list.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("[{not json")
    out = tmp_path / "index"
    rc = main(["index", *map(str, pdfs), "--out", str(out), "--workers", "2", "--parser", "mineru",
               "--mineru-output", str(tmp_path / "mineru"), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 1
    errors = [line for line in captured.err.splitlines() if line.startswith("cdsjax index: error:")]
    assert len(errors) == 1 and str(broken) in errors[0] and "unreadable MinerU content list" in errors[0], \
        captured.err
    assert "Traceback" not in captured.err
    assert "2 processed" in captured.out and "failed 1" in captured.out
    assert load_index(out).doc_ids == ["a.pdf", "b.pdf"]


@pytest.mark.slow
def test_layout_sessions_take_the_thread_limit(tmp_path):
    """Inside ``SessionLimits.installed()``, onnxruntime sessions built the way PyMuPDF builds them (options left
    at their defaults) get the worker's share of threads and do not spin; options a caller set stay as set; on
    leaving, ``onnxruntime.InferenceSession`` is the original class again, also after an error inside."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import pathlib, onnxruntime as ort, pymupdf.layout
        from cdsjax.io.parse import limit_layout_threads
        model = next((pathlib.Path(pymupdf.layout.__file__).parent / "resources" / "onnx").glob("*.onnx"))
        original = ort.InferenceSession
        limits = limit_layout_threads(1)
        with limits.installed():
            plain = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 3
            opts.add_session_config_entry("session.intra_op.allow_spinning", "1")
            chosen = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
            inside = ort.InferenceSession.__mro__[1] is original
        try:
            with limits.installed():
                raise KeyError
        except KeyError:
            pass
        after = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).get_session_options()
        o = plain.get_session_options()
        print(o.intra_op_num_threads, o.inter_op_num_threads,
              o.get_session_config_entry("session.intra_op.allow_spinning"),
              chosen.get_session_options().intra_op_num_threads,
              chosen.get_session_options().get_session_config_entry("session.intra_op.allow_spinning"),
              inside, ort.InferenceSession is original, after.intra_op_num_threads)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1", "0", "3", "1", "True", "True", "0"]


@pytest.mark.slow
def test_fixed_shape_models_get_the_memory_arena_back(tmp_path):
    """PyMuPDF turns onnxruntime's memory arena off for every session; the layout models whose inputs have one
    fixed shape (the image network, the table grid model) get it back, those with inputs of varying size (the
    graph network) keep it off, and the outputs are the same bit for bit."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import pathlib, numpy as np, onnxruntime as ort, pymupdf.layout
        from cdsjax.io.parse.layout import SessionLimits, fixed_input_shapes
        models = pathlib.Path(pymupdf.layout.__file__).parent / "resources" / "onnx"
        def session(name):
            opts = ort.SessionOptions()
            opts.enable_cpu_mem_arena = False  # as PyMuPDF builds them
            with SessionLimits(1).installed():
                s = ort.InferenceSession(str(models / name), opts, providers=["CPUExecutionProvider"])
            return s, s.get_session_options().enable_cpu_mem_arena
        image, image_arena = session("feature_imf1.onnx")
        graph, graph_arena = session("layout_rf2.4.1+imf1.onnx")
        x = np.random.default_rng(0).random((1, 1, 300, 300), dtype=np.float32)
        off = ort.SessionOptions(); off.enable_cpu_mem_arena = False
        plain = ort.InferenceSession(str(models / "feature_imf1.onnx"), off, providers=["CPUExecutionProvider"])
        feed = {image.get_inputs()[0].name: x}
        same = all(np.array_equal(a, b) for a, b in zip(image.run(None, feed), plain.run(None, feed)))
        print(fixed_input_shapes(image), image_arena, fixed_input_shapes(graph), graph_arena, same)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "False", "False", "True"]


_LAYOUT_SESSIONS = """
import sys
if sys.argv[1] == "caller":
    import pymupdf  # the caller's own import: PyMuPDF loads its layout models on onnxruntime's defaults
from cdsjax.io.parse.layout import import_pymupdf, prepare_models
if sys.argv[1] == "cdsjax":
    import_pymupdf(1)  # as `cdsjax ask NEW.pdf` does first, to count the pages
prepare_models(1)
import pymupdf
model = pymupdf._get_layout.__closure__[0].cell_contents._model  # PyMuPDF's layout model, as it runs
image = model.feature_extractor._session
for s in (model.session, getattr(image, "session", image)):  # the image network's (a PageBatcher once run)
    o = s.get_session_options()
    print(o.intra_op_num_threads, o.get_session_config_entry("session.intra_op.allow_spinning"),
          o.enable_cpu_mem_arena, end=" ")
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_inference_collection import InferenceSession
print(ort.InferenceSession is InferenceSession)  # onnxruntime's own class again once the models are loaded
"""


@pytest.mark.slow
@pytest.mark.parametrize("first", ["cdsjax", "caller"])
def test_layout_models_run_on_limited_sessions_whoever_imports_pymupdf_first(first):
    """Importing PyMuPDF loads its layout models. Whether cdsjax imports it first (through ``import_pymupdf``)
    or the caller did before cdsjax could limit the sessions (then ``prepare_models`` loads them again), the
    graph network and the image network PyMuPDF runs have the limited threads, sleep when idle, and the image
    network has its memory arena; on onnxruntime's defaults they would have a spinning thread per core.
    Afterwards ``onnxruntime.InferenceSession`` is onnxruntime's own class again."""
    out = subprocess.run([sys.executable, "-c", _LAYOUT_SESSIONS, first], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "0", "False", "1", "0", "True", "True"]


@pytest.mark.slow  # ~15 s (each worker loads the model); the default, the parent, is tested above
def test_embedding_in_workers_equals_embedding_in_parent(tmp_path):
    """Both places to embed (``embed_in``) give the same index; the parent is the default."""
    import inspect

    from cdsjax.io.index import build_index

    assert inspect.signature(build_index).parameters["embed_in"].default == "parent"
    pdfs = [gen.make_synthetic_pdf(tmp_path / "a.pdf"), gen.make_text_pdf(tmp_path / "b.pdf", pages=2)]
    got = {}
    for where in ("parent", "worker"):
        s = build_index(pdfs, tmp_path / f"index-{where}", cache_dir=tmp_path / f"cache-{where}", workers=2,
                        embed_in=where)
        assert s.processed == 2 and not s.failures
        got[where] = load_index(tmp_path / f"index-{where}")
        assert len([p for p in (tmp_path / f"cache-{where}").iterdir() if not p.name.startswith(".")]) == 2
        assert not [p for p in (tmp_path / f"cache-{where}").rglob(".tmp-*")]  # no staging left behind
    assert [n["text"] for n in got["parent"].notes] == [n["text"] for n in got["worker"].notes]
    np.testing.assert_allclose(got["parent"].embeddings, got["worker"].embeddings, atol=1e-5)


_ALLOC_CYCLES = r"""
import ctypes, resource, sys
from cdsjax.io.memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] in ("keep", "stop") else False
if sys.argv[1] == "stop":  # kept, then no longer: as in a process whose workers are done and that parses next
    from cdsjax.io.memory import stop_keeping_freed_memory
    stop_keeping_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
size = 64 << 20  # above glibc's largest dynamic mmap threshold (32 MB)
def cycle():
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    cycle()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
from cdsjax.io.memory import release_freed_memory
resident = lambda: int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() >> 20
held = resident()
release_freed_memory()
print(kept, faults, held - resident())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_keep_freed_memory_reuses_large_blocks():
    """A freed 64 MB block is reused without page faults once ``keep_freed_memory`` ran, and
    ``release_freed_memory`` hands it back to the kernel; with ``CDSJAX_KEEP_FREED_MEMORY=0`` the allocator is
    left alone: each new block is faulted in again, and there is nothing held to release."""

    def run(flag):
        env = dict(os.environ, CDSJAX_KEEP_FREED_MEMORY=flag)
        out = subprocess.run([sys.executable, "-c", _ALLOC_CYCLES, "keep"], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0], int(out[1]), int(out[2])

    kept, faults_kept, released_kept = run("1")
    left, faults_left, released_left = run("0")
    assert (kept, left) == ("True", "False")
    assert faults_left > 3 * (64 << 20) // (2 << 20)  # at least one fault per 2 MB page, cycle after cycle
    assert faults_kept * 20 < faults_left
    assert released_kept >= 48 and released_left < 16  # MB back to the kernel


_KEPT_BLOCK = r"""
import ctypes, resource
from cdsjax.io.memory import freed_memory_kept
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
def cycle():
    block = libc.malloc(64 << 20)
    ctypes.memset(block, 1, 64 << 20)
    libc.free(block)
def faults():
    cycle()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        cycle()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
with freed_memory_kept():
    inside = faults()
print(inside, faults())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_freed_memory_kept_only_inside_the_block():
    """``freed_memory_kept`` (the last document's embedding, nothing parsing): large blocks are reused inside
    the block, and faulted in anew after it, as before (the allocator is left as a parsing process needs it)."""
    out = subprocess.run([sys.executable, "-c", _KEPT_BLOCK], capture_output=True, text=True, check=True,
                         env=dict(os.environ, CDSJAX_KEEP_FREED_MEMORY="1")).stdout.split()
    inside, after = int(out[0]), int(out[1])
    assert inside * 20 < after and after > 3 * (64 << 20) // (2 << 20)


def _huge_pages_possible() -> bool:
    try:
        return "[never]" not in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False


@pytest.mark.skipif(not _huge_pages_possible(), reason="no transparent huge pages on this machine")
def test_worker_environment_faults_large_blocks_in_huge_pages(monkeypatch):
    """A process started with :func:`worker_environment` (as every parsing worker is) faults a new 64 MB block
    in 2 MB pages; without it, in 4 KB pages. ``CDSJAX_KEEP_FREED_MEMORY=0`` gives an empty environment."""
    from cdsjax.io.memory import worker_environment

    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)

    def faults(extra):
        env = dict(os.environ, **extra)
        env.pop("CDSJAX_KEEP_FREED_MEMORY", None)
        out = subprocess.run([sys.executable, "-c", _ALLOC_CYCLES, "plain"], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
        return int(out[1])

    extra = worker_environment()
    assert extra == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    huge, small = faults(extra), faults({})
    assert huge * 10 < small  # (the ends of a block that are not 2 MB aligned still take 4 KB pages)
    monkeypatch.setenv("CDSJAX_KEEP_FREED_MEMORY", "0")
    assert worker_environment() == {}
    monkeypatch.setenv("CDSJAX_KEEP_FREED_MEMORY", "1")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert worker_environment() == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_stop_keeping_freed_memory_gives_large_blocks_back_again():
    """After ``stop_keeping_freed_memory`` (the end of every pooled ``build_documents``), a 64 MB block is
    handed back on ``free`` again, so a process that parses next does not grow its heap."""
    env = dict(os.environ, CDSJAX_KEEP_FREED_MEMORY="1")
    env.pop("GLIBC_TUNABLES", None)
    out = subprocess.run([sys.executable, "-c", _ALLOC_CYCLES, "stop"], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "True" and int(out[1]) > 3 * (64 << 20) // (2 << 20)

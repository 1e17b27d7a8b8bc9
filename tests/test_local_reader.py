"""The local reader (cdsjax.io.reading.local.reader, cdsjax.io.reading.local.model): the model's assembly from its parts, one-line start failures, and —
with the real llama.cpp server and the default 1.5B model — answers through `ask` and the evaluation."""

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import zipfile

import pytest

from cdsjax.io.reading.local import launch as local_launch
from cdsjax.io.reading.local import model as M
from cdsjax.io.reading.local import reader as L
from tests.conftest import ROOT, run_command


@pytest.fixture(scope="module")
def demo_index(demo_run):
    return demo_run[0] / "index"


def _wheels(tmp_path, chunks):
    """Wheels shaped like the preset's packages: each holds ``<pkg>/data/partNN.bin``."""
    out = []
    for i, chunk in enumerate(chunks, start=1):
        path = tmp_path / f"fake_part{i}-0.1-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"fake_part{i}/__init__.py", "")
            z.writestr(f"fake_part{i}/data/part{i:02d}.bin", chunk)
        out.append(path)
    return out


def _preset(chunks, *, sha=None):
    data = b"".join(chunks)
    return M.Preset(name="fake-model", packages=tuple(f"fake-part{i}" for i in range(1, len(chunks) + 1)),
                    version="0.1", sha256=sha or hashlib.sha256(data).hexdigest(), size=len(data),
                    upstream="made by the test", licence="none")


def test_assembly_concatenates_checks_and_reuses(tmp_path, monkeypatch):
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    chunks = [b"GGUF" + os.urandom(5000), os.urandom(3000), os.urandom(7)]
    preset = _preset(chunks)
    calls = []

    def fetch(p, folder):
        calls.append(folder)
        return _wheels(tmp_path, chunks)

    path = M.assemble(preset, progress=False, fetch=fetch)
    assert path == M.model_path(preset) and path.read_bytes() == b"".join(chunks)
    assert path.with_name(path.name + ".sha256").read_text().strip() == preset.sha256
    assert M.assemble(preset, progress=False, fetch=fetch) == path and len(calls) == 1  # assembled once
    assert not calls[0].exists()  # the fetched wheels went with their temporary folder
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake-model.gguf", "fake-model.gguf.lock",
                                                             "fake-model.gguf.sha256"]


def test_assembly_with_a_wrong_hash_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    chunks = [b"GGUF" + os.urandom(100), os.urandom(100)]
    preset = _preset(chunks, sha="0" * 64)
    with pytest.raises(L.LocalReaderError) as err:
        M.assemble(preset, progress=False, fetch=lambda p, folder: _wheels(tmp_path, chunks))
    assert err.value.kind == "model" and "sha256" in str(err.value) and "\n" not in str(err.value)
    assert [p.name for p in M.model_path(preset).parent.iterdir()] == ["fake-model.gguf.lock"]


def _assembled(tmp_path, monkeypatch, chunks):
    """A fake preset assembled in ``tmp_path/cache``; ``(preset, its path, the fetch calls)``."""
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    preset = _preset(chunks)
    calls = []

    def fetch(p, folder):
        calls.append(folder)
        return _wheels(tmp_path, chunks)

    return preset, M.assemble(preset, progress=False, fetch=fetch), calls, fetch


def test_a_model_file_is_taken_unhashed_only_from_the_users_own_cache(tmp_path, monkeypatch):
    chunks = [b"GGUF" + os.urandom(3000), os.urandom(2000)]
    preset, path, calls, fetch = _assembled(tmp_path, monkeypatch, chunks)
    good = path.read_bytes()
    forged = b"GGUF" + os.urandom(len(good) - 4)  # same size; the note beside it still names the right hash
    # a second name of a file elsewhere (a hard link) is hashed: the forged content is replaced, not used
    elsewhere = tmp_path / "forged.gguf"
    elsewhere.write_bytes(forged)
    path.unlink()
    os.link(elsewhere, path)
    assert M.assemble(preset, progress=False, fetch=fetch) == path and path.read_bytes() == good
    assert len(calls) == 2 and elsewhere.read_bytes() == forged
    if os.getuid() == 0:  # a file another user owns, in the user's own cache (only root can make one here)
        path.write_bytes(forged)  # (the note still names the right hash)
        os.chown(path, 12345, 12345)
        assert M.assemble(preset, progress=False, fetch=fetch) == path and path.read_bytes() == good
        assert len(calls) == 3
    # a cache others may write: its file is hashed; the right one is used, a forged one refused in one line
    cache, fetched = tmp_path / "cache", len(calls)
    cache.chmod(0o777)
    assert M.assemble(preset, progress=False, fetch=fetch) == path and len(calls) == fetched
    before = path.stat()
    path.write_bytes(forged)  # in place, its modification time then set back: not the file hashed before
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    for call in (lambda: M.assemble(preset, progress=False, fetch=fetch),
                 lambda: M.resolve_model(preset.name, progress=False)):
        monkeypatch.setitem(M.PRESETS, preset.name, preset)
        with pytest.raises(M.LocalReaderError) as err:
            call()
        assert err.value.kind == "model" and "refusing the model file" in str(err.value)
        assert "\n" not in str(err.value)
    assert path.read_bytes() == forged and len(calls) == fetched  # neither used nor replaced
    cache.chmod(0o700)
    (cache / "models").chmod(0o777)  # the models folder alone, open to others
    with pytest.raises(M.LocalReaderError, match="refusing the model file"):
        M.assemble(preset, progress=False, fetch=fetch)


def test_a_cache_that_is_not_the_users_own_gets_no_assembly(tmp_path, monkeypatch):
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setenv("CDSJAX_CACHE", str(cache))
    chunks = [b"GGUF" + os.urandom(100), os.urandom(100)]
    with pytest.raises(M.LocalReaderError) as err:
        M.assemble(_preset(chunks), progress=False, fetch=lambda p, folder: _wheels(tmp_path, chunks))
    assert err.value.kind == "model" and "refusing the cdsjax cache directory" in str(err.value)
    assert "\n" not in str(err.value) and list(cache.iterdir()) == []


def _read_only(monkeypatch, directory):
    """``directory`` takes no new entry: its mode when not root; as root (whom modes do not stop), creating a
    file or folder in it fails with EROFS, as on a read-only mount."""
    import errno

    if os.geteuid() != 0:
        directory.chmod(0o500)
        return
    real_open, real_mkdir = os.open, os.mkdir

    def refuse(path):
        if os.path.dirname(os.path.abspath(path)) == str(directory):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def fake_open(path, flags, mode=0o777, *, dir_fd=None):
        if dir_fd is None and flags & os.O_CREAT:
            refuse(path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def fake_mkdir(path, mode=0o777, *, dir_fd=None):
        if dir_fd is None:
            refuse(path)
        return real_mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)


@pytest.mark.parametrize("case", ["read-only cache", "read-only models", "linked lock", "full disk"])
def test_filesystem_errors_while_assembling_are_one_line(case, tmp_path, monkeypatch, capsys):
    import errno

    cache = tmp_path / "cache"
    models = cache / "models"
    models.mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("CDSJAX_CACHE", str(cache))
    chunks = [b"GGUF" + os.urandom(5000), os.urandom(5000)]
    preset = _preset(chunks)
    monkeypatch.setitem(M.PRESETS, preset.name, preset)
    monkeypatch.setattr(M, "_pip_download", lambda p, folder: _wheels(tmp_path, chunks))
    victim = tmp_path / "victim"
    victim.write_text("the user's own file")
    if case == "read-only cache":
        models.rmdir()
        _read_only(monkeypatch, cache)
    elif case == "read-only models":
        _read_only(monkeypatch, models)
    elif case == "linked lock":
        (models / f"{preset.name}.gguf.lock").symlink_to(victim)
    else:
        real_fdopen = os.fdopen

        class Full:  # the model's temporary file, on a disk that fills after its first write (the first part)
            def __init__(self, f):
                self.f, self.writes = f, 0

            def write(self, data):
                self.writes += 1
                if self.writes > 1:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return self.f.write(data)

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self.f.__exit__(*exc)

        monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: (
            Full(real_fdopen(fd, mode, *a, **k)) if mode == "wb" else real_fdopen(fd, mode, *a, **k)))
    assert M.main([preset.name]) == 1
    out, err = capsys.readouterr()
    words = {"read-only cache": ("cannot", str(cache)), "read-only models": ("cannot assemble", str(models)),
             "linked lock": ("symbolic link",), "full disk": ("No space left on device",)}[case]
    assert out == "" and err.startswith("cdsjax: error: ") and err.count("\n") == 1, err
    assert all(w in err for w in words), err
    assert victim.read_text() == "the user's own file"
    left = sorted(p.name for p in models.iterdir()) if models.exists() else []
    assert not [name for name in left if name.endswith(".part") or name.startswith(".parts-")], left
    assert not (models / f"{preset.name}.gguf").exists()


def test_model_names_and_files_give_one_line(tmp_path):
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a model")
    cases = {"no-such-preset": "unknown local reader model", str(tmp_path / "missing.gguf"): "not found",
             str(not_gguf): "not a GGUF model file", "hf:just-a-name.gguf": "expected hf:OWNER/REPO/FILE.gguf"}
    for spec, words in cases.items():
        with pytest.raises(L.LocalReaderError) as err:
            M.resolve_model(spec, progress=False)
        assert words in str(err.value) and "\n" not in str(err.value), spec
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF" + b"\0" * 16)
    assert M.resolve_model(str(good)) == good


def test_start_failures_are_one_line(tmp_path, monkeypatch):
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setattr(L, "runtime_installed", lambda: False)
    with pytest.raises(L.LocalReaderError) as err:
        L.LocalReader(model=str(good)).start()
    assert err.value.kind == "runtime" and "cdsjax[reader]" in str(err.value)
    monkeypatch.setattr(L, "runtime_installed", lambda: True)
    monkeypatch.setattr(local_launch, "available_memory", lambda: 50 << 20)
    with pytest.raises(L.LocalReaderError) as err:
        L.LocalReader(model=str(good), log_dir=str(tmp_path)).start()
    assert err.value.kind == "memory" and "not enough memory" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="slots"):
        L.LocalReaderConfig(slots=0)


@pytest.mark.skipif(not L.runtime_installed(), reason="xllamacpp is not installed")
def test_a_damaged_model_file_is_one_line_and_leaves_no_process(tmp_path):
    bad = tmp_path / "damaged.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))  # the magic, then noise
    reader = L.LocalReader(model=str(bad), log_dir=str(tmp_path), startup_timeout=60)
    with pytest.raises(L.LocalReaderError) as err:
        reader.start()
    assert err.value.kind in ("model", "start") and "\n" not in str(err.value)
    assert reader.process is None and reader.base_url is None
    assert (tmp_path / next(p.name for p in tmp_path.glob("reader-*.log"))).stat().st_size > 0  # the log is kept


@pytest.mark.local_reader
def test_ask_answers_with_the_local_model_and_cites_its_evidence(demo_index, with_local_reader, tmp_path):
    code, out, err = run_command(tmp_path, "ask", str(demo_index), "What did the battery system cost?", "--budget",
                                 "2", "--json", "--reader-threads", "1", timeout=300)
    assert code == 0, err[-2000:]
    result = json.loads(out)
    assert result["answer"] and result["answer"].strip() and result["error"] is None
    reader = result["reader"]
    assert reader["model"] == M.DEFAULT_PRESET and reader["local"]["runtime"].startswith("llama.cpp server")
    ranks = [e["rank"] for e in result["evidence"]]
    assert reader["cited"] and set(reader["cited"]) <= set(ranks)
    if any("1.9 million" in e["text"] for e in result["evidence"]):  # a 1.5B model reads the cost off its note
        assert "1.9 million" in result["answer"]
    assert not list((tmp_path / "cache" / "logs").glob("*")) or all(  # the server is gone after the command
        f"--port {p.stem.split('-')[-1]}" not in _processes() for p in (tmp_path / "cache" / "logs").glob("*.log"))


def _processes() -> str:
    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_reader_url_wins_over_the_local_reader(demo_index, tmp_path, monkeypatch):
    from tests.scripted_server import OpenAIServer

    monkeypatch.setenv("CDSJAX_LOCAL_READER", "default")
    with OpenAIServer(lambda req: "1.9 million dollars [1]", models=("remote",)) as srv:
        code, out, err = run_command(tmp_path, "ask", str(demo_index), "What did it cost?", "--budget", "2",
                                     "--json", "--reader-url", srv.base_url)
    assert code == 0, err[-2000:]
    result = json.loads(out)
    assert result["answer"] == "1.9 million dollars [1]" and result["reader"]["model"] == "remote"
    assert "local" not in result["reader"] and len(srv.requests) == 1


@pytest.mark.local_reader
@pytest.mark.needs_data
def test_evaluation_with_the_local_reader_and_its_rerun_from_the_cache(with_local_reader, data_root, tmp_path):
    out_dir = tmp_path / "run"
    # small on purpose (one thread, one note of 300 characters, short answers, no judge): the real model on 2 cores
    cmd = [sys.executable, "experiments/run_eval.py", "--config", "configs/qasper.py", f"--config.data_root={data_root}",
           "--config.reader.local=default", "--config.reader.local_threads=1", "--config.reader.local_slots=1",
           "--config.selectors=cosine,none", "--config.max_queries=3", "--config.loader.max_papers=2",
           "--config.budgets=(1,)", "--config.budget=1", "--config.reader.max_tokens=48",
           "--config.reader.max_text_chars=300", "--config.judge.enabled=False", "--config.num_resamples=200",
           f"--config.output_dir={out_dir}", "--noprogress"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), CDSJAX_CACHE=str(tmp_path / "cache"))
    t0 = time.perf_counter()
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    answers = [json.loads(line) for line in (out_dir / "answers.jsonl").read_text().splitlines()]
    assert {a["selector"] for a in answers} == {"cosine", "none"} and len(answers) == 6
    assert all("error" not in a for a in answers), [a.get("error") for a in answers]
    assert all(a["reply"].strip() for a in answers)
    assert all(a["metrics"]["reader_error"] == 0 and a["metrics"]["accuracy"] is None for a in answers)  # no judge
    summary = (out_dir / "summary.csv").read_text()
    assert all(f"{m}@1" in summary for m in ("answer_f1", "markers_only", "cites_gold", "reader_error"))
    first_s = time.perf_counter() - t0
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    again = [json.loads(line) for line in (out_dir / "answers.jsonl").read_text().splitlines()]
    assert all(a["cached"] for a in again) and [a["reply"] for a in again] == [a["reply"] for a in answers]
    assert "6 answers (6 from the reply cache)" in second.stdout + second.stderr, first_s


@pytest.mark.local_reader
def test_a_text_only_local_server_reads_a_figure_note_as_text(with_local_reader, tmp_path):
    """The default model takes no images: auto learns that from one refusal and sends the figure's caption."""
    import io

    from PIL import Image

    from cdsjax.io.reading.reader import Reader
    from cdsjax.io.reading.prompt import EvidenceItem

    png = tmp_path / "chart.png"
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), "white").save(buf, format="PNG")
    png.write_bytes(buf.getvalue())
    figure = EvidenceItem(note_id="r#3", doc_id="report.pdf", page=2, kind="figure", image_path=str(png),
                          caption="Figure 1: Monthly diesel use fell by 38 percent with the battery.",
                          text="Figure 1 shows monthly diesel use in 2024 and 2025.")
    with L.LocalReader(threads=1, ctx_per_slot=2048, log_dir=str(tmp_path)) as local:
        reader = Reader(local.reader_config(max_tokens=48, images="auto"))
        first = reader.answer("By how much did diesel use fall according to Figure 1?", [figure])
        second = reader.answer("What does Figure 1 show?", [figure])
    assert first.image_mode == second.image_mode == "text" and first.text.strip() and second.text.strip()
    assert "38" in first.text
    assert local.process is None  # stopped on leaving the block


@pytest.mark.skipif(not L.runtime_installed(), reason="xllamacpp is not installed")
def test_a_server_that_does_not_answer_in_time_is_stopped(tmp_path, monkeypatch):
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setattr(local_launch, "answers", lambda socket: False)  # as if the server never came up
    reader = L.LocalReader(model=str(good), log_dir=str(tmp_path), startup_timeout=0.5)
    with pytest.raises(L.LocalReaderError) as err:
        reader.start()
    assert err.value.kind in ("start", "model") and "\n" not in str(err.value)
    assert reader.process is None and reader.socket is None
    assert not list(pathlib.Path(tempfile.gettempdir()).glob(f"cdsjax-reader-*/reader-{os.getpid()}-*.sock"))


def test_model_sources_that_fail_give_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network for the hub here: its own offline error
    with pytest.raises(M.LocalReaderError) as err:
        M.resolve_model("hf:no-owner/no-repo/model.gguf")
    assert err.value.kind == "model" and "model hub" in str(err.value) and "\n" not in str(err.value)
    missing = M.Preset(name="absent", packages=("cdsjax-test-no-such-package-3f9a1c",), version="0.0.1",
                       sha256="0" * 64, size=1, upstream="none", licence="none")
    with pytest.raises(M.LocalReaderError) as err:
        M.assemble(missing, progress=False)  # pip finds no such package in the registry
    assert "could not fetch" in str(err.value) and "\n" not in str(err.value)
    assert not list((tmp_path / "cache" / "models").glob("absent.gguf*[!k]"))  # nothing but the lock file


def test_demo_answers_side_by_side_with_a_reader(demo_run, tmp_path):
    from tests.scripted_server import OpenAIServer

    root, _ = demo_run
    with OpenAIServer(lambda req: "It cost 1.9 million dollars [1].", models=("scripted",)) as srv:
        code, out, err = run_command(root, "demo", "--dir", str(root), "--reader-url", srv.base_url, "--json")
        asked = len(srv.requests)
    assert code == 0, err[-2000:]
    result = json.loads(out)
    answers = result["answers"]
    assert [a["selector"] for a in answers] == ["cds-learned-pages", "cosine"] and asked == 2
    for a in answers:
        # the reader cited its prompt's first note, the first in reading order: the answer numbers it by rank
        k = int(re.fullmatch(r"It cost 1\.9 million dollars \[(\d+)\]\.", a["answer"]).group(1))
        assert a["error"] is None and [c["n"] for c in a["cited"]] == [k]
        assert a["cited"][0]["page"] == a["evidence_pages"][k - 1] == min(a["evidence_pages"])
    assert result["reader"]["model"] == "scripted"
    with OpenAIServer(lambda req: "It cost 1.9 million dollars [1].", models=("scripted",)) as srv:
        code, out, err = run_command(root, "demo", "--dir", str(root), "--reader-url", srv.base_url)
    text = " ".join(out.split())
    assert code == 0 and "Answers from each selector's evidence" in text and re.search(r"cites: \[\d+\] page", text)

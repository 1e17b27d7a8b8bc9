"""Where the benchmark data comes from: the public sources ``cdsjax data fetch`` downloads and how it lays them
out under a data root (the layout :mod:`cdsjax.io.datasets` reads, as in ../shared/data).

Each :class:`Source` is one upstream dataset, with its URL and licence as its own documentation states them
(cited at each). Its files are either placed as downloaded (a PDF) or *derived*: a larger upstream file
is downloaded, the development subset is taken from it (the documents, papers and questions of the project's
shared data, listed in :mod:`cdsjax.io.datasets.recorded`; the rest of each benchmark is kept aside for
independent evaluation) and written in the layout's form. Every download is checked against the size and
sha256 (or git blob id) recorded for it, and every derived file against the figures of the shared data's
copy; where a figure comes from is said in :mod:`cdsjax.io.datasets.recorded`.

URLs are pinned to a commit where the host allows it, so the bytes cannot change under the recorded figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

from cdsjax.io.datasets import recorded as R
from cdsjax.io.datasets.common import (
    HOTPOTQA_FILE,
    MMLONGBENCH_DOCS,
    MMLONGBENCH_MMDOCIR,
    MMLONGBENCH_SAMPLES,
    QASPER_FILE,
)

__all__ = ["Download", "Derived", "Source", "SOURCES", "source_names"]


@dataclass(frozen=True)
class Download:
    """One file to download: from ``url`` to ``dest`` (a path under the data root; for a derived file's input,
    under the root's ``.downloads/``), checked against ``size`` and ``sha256`` or ``git_blob`` when recorded.
    ``member``: the download is an archive (.tgz, .tar.gz or .zip) and a derived file is built from this file
    in it (found by its name in any folder of the archive)."""

    url: str
    dest: str
    size: Optional[int] = None
    sha256: Optional[str] = None
    git_blob: Optional[str] = None  # sha1 of b"blob <size>\\0" + content, as in a git tree
    member: Optional[str] = None


@dataclass(frozen=True)
class Derived:
    """A laid-out file made from downloaded ones: ``build(inputs)`` gets ``{dest: bytes}`` of ``inputs`` and
    returns the file's bytes, checked against ``size`` and ``sha256`` before it is written to ``dest``."""

    dest: str
    inputs: Tuple[Download, ...]
    build: Callable[[Dict[str, bytes]], bytes]
    size: Optional[int] = None
    sha256: Optional[str] = None


@dataclass(frozen=True)
class Source:
    name: str
    title: str
    licence: str
    homepage: str
    files: Tuple[Download, ...] = ()
    derived: Tuple[Derived, ...] = ()
    note: str = ""
    extra: Dict[str, str] = field(default_factory=dict)

    def total_size(self) -> Optional[int]:
        """Bytes to download, when every download's size is recorded (else None)."""
        sizes = [d.size for d in self.files] + [i.size for d in self.derived for i in d.inputs]
        return None if any(s is None for s in sizes) else sum(sizes)


# ---- the layout's forms of the upstream files (each checked against the shared data's copy) ----------------

def _json_list_subset(key: str, keep, **dump) -> Callable[[Dict[str, bytes]], bytes]:
    """The entries of a JSON list whose ``key`` is in ``keep``, in upstream order."""
    def build(inputs: Dict[str, bytes]) -> bytes:
        (raw,) = inputs.values()
        wanted = set(keep)
        return json.dumps([e for e in json.loads(raw) if e[key] in wanted], **dump).encode("utf-8")
    return build


def _jsonl_subset(key: str, keep) -> Callable[[Dict[str, bytes]], bytes]:
    """The lines of a JSON-lines file whose ``key`` is in ``keep``, as they are, in upstream order."""
    def build(inputs: Dict[str, bytes]) -> bytes:
        (raw,) = inputs.values()
        wanted = set(keep)
        lines = [ln for ln in raw.decode("utf-8").splitlines() if ln.strip() and json.loads(ln)[key] in wanted]
        return "".join(ln + "\n" for ln in lines).encode("utf-8")
    return build


def _json_by_id(ids, key: Optional[str] = None, **dump):
    """Entries of a JSON object (``key`` None: keyed by id) or list (``key``: each entry's id field) in the
    order of ``ids``."""
    def build(inputs: Dict[str, bytes]) -> bytes:
        (raw,) = inputs.values()
        data = json.loads(raw)
        table = data if key is None else {e[key]: e for e in data}
        missing = [i for i in ids if i not in table]
        if missing:
            raise ValueError(f"{len(missing)} of the {len(ids)} expected entries are missing (e.g. {missing[0]})")
        subset = {i: table[i] for i in ids} if key is None else [table[i] for i in ids]
        return json.dumps(subset, **dump).encode("utf-8")
    return build


def _derived(dest: str, inputs: Tuple[Download, ...], build) -> Derived:
    size, sha = R.LAID_OUT[dest]
    return Derived(dest=dest, inputs=inputs, build=build, size=size, sha256=sha)


# ---- the sources ---------------------------------------------------------------------------------------------

# MMLongBench-Doc (Ma et al., NeurIPS 2024 Datasets and Benchmarks). Its README (github.com/mayubo2333/
# MMLongBench-Doc, "License"): code Apache 2.0, data CC BY-NC 4.0, for research use only. The questions are
# data/samples.json and the PDFs data/documents/ in that repository (also on huggingface.co/datasets/
# yubo2333/MMLongBench-Doc); pinned to the commit the recorded figures were read at.
MMLB_COMMIT = "d73f0dc0be7e0a2ff6a403d5fe65fcd96461f384"
MMLB_RAW = f"https://raw.githubusercontent.com/mayubo2333/MMLongBench-Doc/{MMLB_COMMIT}/data"
_MMLB_SAMPLES = Download(f"{MMLB_RAW}/samples.json", ".downloads/mmlongbench/samples.json",
                         *R.MMLONGBENCH_SAMPLES_UPSTREAM)

# MMDocIR (Dong et al. 2025): MMDocIR_annotations.jsonl in github.com/MMDocRAG/MMDocIR (dataset/README.md:
# one line per long document; the MMLongBench-Doc documents are among them), the layout boxes cdsjax reads.
# Licence: the dataset card of huggingface.co/datasets/MMDocIR/MMDocIR_Evaluation_Dataset says Apache 2.0; the
# questions and documents are MMLongBench-Doc's (CC BY-NC 4.0 above).
MMDOCIR_COMMIT = "394d84dbda393a1abbdddddc265d60b74f52dcc3"
_MMDOCIR = Download(f"https://raw.githubusercontent.com/MMDocRAG/MMDocIR/{MMDOCIR_COMMIT}/dataset/"
                    "MMDocIR_annotations.jsonl", ".downloads/mmdocir/MMDocIR_annotations.jsonl", *R.MMDOCIR_UPSTREAM)

# QASPER (Dasigi et al. 2021, AllenAI): homepage allenai.org/data/qasper, CC BY 4.0 (dataset card
# huggingface.co/datasets/allenai/qasper). Test set v0.3 with its evaluator, as the homepage links it. Nothing is
# recorded for the archive (see recorded.py): `data fetch` asks for --allow-unrecorded before downloading it.
QASPER_URL = "https://qasper-dataset.s3.us-west-2.amazonaws.com/qasper-test-and-evaluator-v0.3.tgz"
_QASPER = Download(QASPER_URL, ".downloads/qasper/qasper-test-and-evaluator-v0.3.tgz",
                   member="qasper-test-v0.3.json")

# HotpotQA (Yang et al. 2018; hotpotqa.github.io: CC BY-SA 4.0) as sampled by HippoRAG 2 (github.com/
# OSU-NLP-Group/HippoRAG, MIT licence; reproduce/dataset/hotpotqa.json, 1000 questions in HotpotQA's format).
HIPPORAG_COMMIT = "c617143f01477243992a63b2e2151cc003dd3b21"
_HOTPOT = Download(f"https://raw.githubusercontent.com/OSU-NLP-Group/HippoRAG/{HIPPORAG_COMMIT}/reproduce/dataset/"
                   "hotpotqa.json", ".downloads/hotpotqa/hotpotqa.json", git_blob=R.HOTPOTQA_UPSTREAM_GIT_BLOB)

# py-pdf/sample-files (github.com/py-pdf/sample-files; README "Licenses": CC BY-SA 4.0): PDFs the parsing
# and indexing tests use.
PY_PDF_COMMIT = "6921079eb3e1ed0944db5ec75016910d59da7fdb"

SOURCES: Dict[str, Source] = {s.name: s for s in (
    Source("mmlongbench", "MMLongBench-Doc: questions and PDFs", "CC BY-NC 4.0 (research use only)",
           "https://github.com/mayubo2333/MMLongBench-Doc",
           files=tuple(Download(f"{MMLB_RAW}/documents/{name}", f"{MMLONGBENCH_DOCS}/{name}", size, sha)
                       for name, (size, sha) in R.MMLONGBENCH_PDFS.items()),
           derived=(_derived(MMLONGBENCH_SAMPLES, (_MMLB_SAMPLES,),
                             _json_list_subset("doc_id", R.MMLONGBENCH_PDFS, indent=1, ensure_ascii=False)),)),
    Source("mmdocir", "MMDocIR: page and layout annotations of the MMLongBench-Doc documents",
           "Apache 2.0 (annotations); the documents' own CC BY-NC 4.0", "https://github.com/MMDocRAG/MMDocIR",
           derived=(_derived(MMLONGBENCH_MMDOCIR, (_MMDOCIR,), _jsonl_subset("doc_name", R.MMLONGBENCH_PDFS)),)),
    Source("qasper", "QASPER test set v0.3", "CC BY 4.0", "https://allenai.org/data/qasper",
           derived=(_derived(QASPER_FILE, (_QASPER,), _json_by_id(R.QASPER_PAPERS)),)),
    Source("hotpotqa", "HotpotQA questions as sampled by HippoRAG", "CC BY-SA 4.0 (HotpotQA); MIT (HippoRAG)",
           "https://github.com/OSU-NLP-Group/HippoRAG",
           derived=(_derived(HOTPOTQA_FILE, (_HOTPOT,),
                             _json_by_id(R.HOTPOTQA_IDS, key="_id", indent=1, ensure_ascii=False)),)),
    Source("pdfs", "py-pdf sample files (parsing tests)", "CC BY-SA 4.0", "https://github.com/py-pdf/sample-files",
           files=tuple(Download(f"https://raw.githubusercontent.com/py-pdf/sample-files/{PY_PDF_COMMIT}/{path}",
                                f"pdfs/{path.rsplit('/', 1)[-1]}", size, sha)
                       for path, (size, sha) in R.PY_PDF_FILES.items())),
)}


def source_names() -> Tuple[str, ...]:
    return tuple(SOURCES)

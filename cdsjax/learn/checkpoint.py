"""A fit's state on disk, so that a later call resumes it (``FitConfig.checkpoint_dir``): the arrays
(parameters, Adam state, best parameters) with orbax, the rest as JSON, and the identity a checkpoint must
match to be resumed."""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Optional, Sequence

import numpy as np

from cdsjax.core.games.learned import LearnedParams
from cdsjax.learn.data import Example
from cdsjax.learn.fit_config import FitConfig


def fit_identity(cfg: FitConfig, train: Sequence[Example], val: Sequence[Example]) -> str:
    """What a checkpoint must match to be resumed: the settings that shape the fit and the questions."""
    import hashlib

    settings = {k: v for k, v in cfg.to_dict().items() if k not in ("checkpoint_dir", "stop_after", "progress")}
    if settings.get("readout") == "top":  # the defaults: checkpoints written before the options still resume
        del settings["readout"]
    if settings.get("solver") == "active_set":  # written as "converged" before the solver had its own name
        settings["solver"] = "converged"
    if not settings.get("frozen"):
        settings.pop("frozen", None)
    tag = lambda e: e.qid if e.weight == 1.0 else f"{e.qid}*{e.weight:.9g}"
    body = json.dumps({"settings": settings, "train": [tag(e) for e in train], "val": [tag(e) for e in val]},
                      sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]



class FitCheckpoint:
    """The fit's state on disk: arrays (parameters, Adam state, best parameters) with orbax, the rest JSON."""

    def __init__(self, directory: str, theta0: LearnedParams, optimizer):
        self.dir = pathlib.Path(directory)
        self.theta0 = theta0
        self.optimizer = optimizer

    def save(self, state: dict, elapsed: float, final: bool = False) -> None:
        import jax
        import orbax.checkpoint as ocp

        self.dir.mkdir(parents=True, exist_ok=True)
        arrays = {}
        if state.get("theta") is not None:
            arrays["theta"] = state["theta"].to_dict()
            arrays["opt"] = {str(i): np.asarray(v) for i, v in
                             enumerate(jax.tree_util.tree_leaves(state["opt"]))}
        if state.get("best_theta") is not None:
            arrays["best_theta"] = state["best_theta"].to_dict()
        arrays = jax.tree_util.tree_map(lambda v: np.asarray(v, np.float64) if np.ndim(v) == 0 else np.asarray(v),
                                        arrays)
        tmp = self.dir / "arrays.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        if arrays:
            with ocp.StandardCheckpointer() as ck:
                ck.save(tmp.absolute(), arrays)
                ck.wait_until_finished()
        meta = {k: v for k, v in state.items() if k not in ("theta", "opt", "best_theta")}
        meta["seconds_so_far"] = state.get("seconds", 0.0) + elapsed
        meta["has"] = sorted(arrays)
        final_dir = self.dir / "arrays"
        if final_dir.exists():
            shutil.rmtree(final_dir)
        if arrays:
            tmp.rename(final_dir)
        part = self.dir / "state.json.tmp"
        part.write_text(json.dumps(meta, default=float))
        part.replace(self.dir / "state.json")

    def load(self) -> Optional[dict]:
        import jax
        import jax.numpy as jnp
        import orbax.checkpoint as ocp

        path = self.dir / "state.json"
        if not path.is_file():
            return None
        meta = json.loads(path.read_text())
        state = dict(meta)
        state["seconds"] = meta.pop("seconds_so_far", meta.get("seconds", 0.0))
        state["theta"] = state["opt"] = state["best_theta"] = None
        if meta.get("has"):
            with ocp.StandardCheckpointer() as ck:
                arrays = ck.restore((self.dir / "arrays").absolute())
            dtype = self.theta0.beta.dtype
            if "theta" in arrays:
                theta = LearnedParams.from_dict({k: float(v) for k, v in arrays["theta"].items()}).astype(dtype)
                template = self.optimizer.init(theta)
                leaves, treedef = jax.tree_util.tree_flatten(template)
                restored = [jnp.asarray(arrays["opt"][str(i)], leaf.dtype) for i, leaf in enumerate(leaves)]
                state["theta"] = theta
                state["opt"] = jax.tree_util.tree_unflatten(treedef, restored)
            if "best_theta" in arrays:
                state["best_theta"] = LearnedParams.from_dict(
                    {k: float(v) for k, v in arrays["best_theta"].items()}).astype(dtype)
        return state

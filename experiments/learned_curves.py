r"""Learning curves of a learned-CDS fit, from the history in its parameter file.

    python experiments/learned_curves.py                      # the shipped file -> results/learned_curves.png
    python experiments/learned_curves.py --params runs/tune/dev/params.json --out results/learned_curves.png

Left: the training and validation surrogate (soft recall@B) per Adam step, one line per start of the
multi-start; the dotted line is the paper's game (theta_0) on the validation split. Right: validation
recall@B of the selection itself. The fitted parameters are those of the best validation surrogate (marked).
"""

from __future__ import annotations

import argparse
import pathlib
import sys


def plot(params_path, out: pathlib.Path) -> pathlib.Path:
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    from cdsjax.learn import load_params

    theta, prov = load_params(params_path)
    history = prov.get("history") or []
    if not history:
        raise ValueError(f"{params_path}: the provenance holds no history to plot")
    fig = Figure(figsize=(10, 3.8))
    left, right = fig.subplots(1, 2)
    starts = sorted({h["start"] for h in history})
    for s in starts:
        rows = [h for h in history if h["start"] == s]
        steps = [h["step"] for h in rows]
        label = f"start {s}: " + ", ".join(f"{k}={v:g}" for k, v in _start_of(prov, s).items())
        left.plot(steps, [h["train_surrogate"] for h in rows], "-", label=f"train ({label})")
        if any("val_surrogate" in h for h in rows):
            left.plot(steps, [h.get("val_surrogate") for h in rows], "--", label=f"validation ({label})")
            right.plot(steps, [h.get("val_recall") for h in rows], "-o", ms=3, label=label)
    ref = (prov.get("figures") or {}).get("paper_theta0") or {}
    if ref.get("val"):
        left.axhline(ref["val"]["surrogate"], ls=":", c="k", label="paper game, validation")
        right.axhline(ref["val"]["recall"], ls=":", c="k", label="paper game")
    best = prov.get("best") or {}
    if best.get("start") is not None:
        hit = [h for h in history if h["start"] == best["start"] and h["step"] == best["step"]]
        if hit and "val_recall" in hit[0]:
            right.plot([best["step"]], [hit[0]["val_recall"]], "k*", ms=12, label="returned parameters")
    left.set(xlabel="Adam step", ylabel="soft recall@B (surrogate)", title="surrogate")
    right.set(xlabel="Adam step", ylabel="recall@B", title="validation recall of the selection")
    left.legend(fontsize=6)
    right.legend(fontsize=6)
    fig.suptitle(f"learned CDS fit ({_data_line(prov)})", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    return out


def _start_of(prov: dict, start: int) -> dict:
    from cdsjax.core.games.learned import LearnedParams

    grid = prov.get("grid") or []
    theta = grid[start]["theta"] if start < len(grid) else {}
    paper = LearnedParams.paper().to_dict()
    return {k: v for k, v in theta.items() if abs(v - paper[k]) > 1e-6 * max(1.0, abs(paper[k]))}


def _data_line(prov: dict) -> str:
    data = prov.get("data") or {}
    return "; ".join(f"{k}: {v.get('questions_with_gold')} questions" for k, v in data.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", default=None, help="a parameter file (default: the shipped one)")
    p.add_argument("--out", default="results/learned_curves.png")
    args = p.parse_args(argv)
    try:
        path = plot(args.params, pathlib.Path(args.out))
    except ValueError as err:
        print(f"learned_curves: error: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

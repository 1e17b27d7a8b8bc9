r"""Why the default's game spends its slots on restatements in ``cdsjax demo`` (issue 78, item 6): measured.

The demo report (:mod:`cdsjax.demo`) states one finding on six notes beside three other facts. This script builds
the demo's index (as ``cdsjax demo`` does, in the cache), poses the demo question to the default selector's game
(``cds-learned-pages``, its shipped parameters) and prints, all measured on this run:

1. per note: its role, its relevance (the cosine of the question to the note, and the game's query edge), its
   equilibrium weight, and the similarity to the most relevant note;
2. the sizes that decide the equilibrium: the spread of the query edges against the spread of the note block's
   diversity term :math:`\beta(1 - z_i^\top z_j)` and of its structure terms, the penalty :math:`\alpha`, the
   query's weight and the support;
3. what the default game covers as its shipped parameters move: :math:`\beta` times ``alpha_factor``, and
   :math:`\beta` with the relevance-weighted repulsion (``rel_repulsion`` = 1, the game's own term against paying
   irrelevant notes for being unlike);
4. the question's asked parts as several query vertices (split by a general rule: at a comma or "and" before a
   question word), the per-part cosine of each note, and what cosine, MMR and the default game pick from them.

    python experiments/demo_game.py                 # prints Markdown; --out FILE writes it too

Nothing here changes the shipped game; the lead can rerun it after the relevance changes (it reads the relevance
the pipeline gives the game, whatever that is).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

QUESTION_WORDS = r"(?:how|what|which|who|whom|when|where|why|whether)"


def question_parts(question: str) -> list:
    """The asked parts of a question: split at a comma or an "and" that comes before a question word (a general
    rule; a question with one part is returned whole)."""
    parts = re.split(rf",\s*(?:and\s+)?(?={QUESTION_WORDS}\b)|\s+and\s+(?={QUESTION_WORDS}\b)", question,
                     flags=re.IGNORECASE)
    return [p.strip(" ,") for p in parts if p.strip(" ,")]


def picks(pipe, selector, query, budget, params=None):
    """The pages a selector picks for an encoded ``query`` ([d] or [m, d]) at ``budget``."""
    options = {"params": params} if params is not None else None
    sel = pipe.select(query, selector=selector, budget=budget, options=options)
    return [int(e["page"]) for e in pipe.evidence(sel)], sel


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=int, default=4)
    p.add_argument("--out", default=None, help="also write the Markdown to this file")
    args = p.parse_args(argv)

    from cdsjax import demo
    from cdsjax.io.index import build_index, cache_root, default_config, load_index
    from cdsjax.learn import default_params
    from cdsjax.pipeline import Corpus, Pipeline
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, selector_spec

    config = default_config()
    root = cache_root(config) / "demo"
    pdf = demo.write_report(root / "harbour_island_report.pdf")
    config.embedder.show_progress = False
    build_index([pdf], root / "index", config=config, strict=True, progress=False, log=lambda line: None)
    corpus = load_index(root / "index")
    pipe = Pipeline(Corpus.merge([corpus]))
    theta = default_params(selector_spec(DEFAULT_SELECTOR).readout)
    q = pipe.encode([demo.QUESTION])[0]
    n = pipe.candidates.count
    z = np.asarray(pipe.candidates.notes[:n])
    problem = pipe.candidates.problem(q, selector_spec(DEFAULT_SELECTOR))
    affinity = theta.affinity(problem)
    matrix = np.asarray(affinity.matrix)
    edges, block = matrix[0, 1:n + 1], matrix[1:n + 1, 1:n + 1]
    _, full = picks(pipe, "cds_learned", q, n, theta)
    weight = np.asarray(full.result.x)[1:n + 1]
    cos = z @ q
    top = int(np.argmax(cos))
    lines = []
    out = lines.append
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    out(f"# The demo's game, measured (`python experiments/demo_game.py`, commit {commit})\n")
    out(f"Question: {demo.QUESTION}\n")
    out(f"Default selector `{DEFAULT_SELECTOR}`, shipped parameters: "
        + ", ".join(f"{k} {v:.3g}" for k, v in theta.to_dict().items()) + "\n")
    out("## 1. Each note\n")
    out("| note | page | role | fact | cosine to question | query edge | equilibrium weight | cosine to best note |")
    out("|---|---|---|---|---|---|---|---|")
    for i, note in enumerate(corpus.notes):
        fact, role = demo.PAGES.get(int(note["page"]), (None, "?"))
        out(f"| {i} | {int(note['page']) + 1} | {role} ({note.get('kind')}) | {fact or '-'} | {cos[i]:.3f} | "
            f"{edges[i]:.3f} | {weight[i]:.3f} | {float(z[i] @ z[top]):.3f} |")
    pair = ~np.eye(n, dtype=bool)
    diversity = float(theta.beta) * (1.0 - z @ z.T)
    structure = block - diversity
    out("\n## 2. The sizes that decide the equilibrium\n")
    out(f"- query edges: {edges.min():.3f} .. {edges.max():.3f} (spread {np.ptp(edges):.3f})")
    out(f"- diversity term beta (1 - z_i z_j) over note pairs: {diversity[pair].min():.4f} .. "
        f"{diversity[pair].max():.4f} (spread {np.ptp(diversity[pair]):.4f}; "
        f"{np.ptp(edges) / max(np.ptp(diversity[pair]), 1e-12):.0f}x smaller than the query edges' spread)")
    out(f"- structure terms over note pairs: {structure[pair].min():.3f} .. {structure[pair].max():.3f} "
        f"(mean {structure[pair].mean():.3f})")
    out(f"- penalty alpha {float(affinity.alpha):.3f}; query weight {float(np.asarray(full.result.x)[0]):.3f}; "
        f"support {int(full.support_size)} of {n} notes")

    def row(label, pages):
        cov = demo.coverage(pages)
        return f"| {label} | {', '.join(str(p + 1) for p in pages)} | {len(cov['covered'])}/4 | {cov['restatements']} |"

    out("\n## 3. The default game as its parameters move (budget %d)\n" % args.budget)
    out("| parameters | pages | facts | restated |")
    out("|---|---|---|---|")
    for name in ("cosine_pages", "mmr_pages", "dpp_pages"):
        out(row(name, picks(pipe, name, q, args.budget)[0]))
    out(row("shipped", picks(pipe, DEFAULT_SELECTOR, q, args.budget, theta)[0]))
    for beta in (0.1, 0.3, 1.0, 2.0, 3.0, 5.0):
        for factor in (float(theta.alpha_factor), 2.0):
            params = theta.replace(beta=beta, alpha_factor=factor)
            out(row(f"beta {beta:g}, alpha_factor {factor:.3g}", picks(pipe, DEFAULT_SELECTOR, q, args.budget,
                                                                     params)[0]))
    for beta in (0.3, 1.0, 3.0, 10.0, 20.0):
        params = theta.replace(beta=beta, rel_repulsion=1.0)
        out(row(f"beta {beta:g}, rel_repulsion 1", picks(pipe, DEFAULT_SELECTOR, q, args.budget, params)[0]))

    parts = question_parts(demo.QUESTION)
    out(f"\n## 4. The question's {len(parts)} asked parts as query vertices\n")
    qs = pipe.encode(parts)
    out("| part | " + " | ".join(f"p{int(nt['page']) + 1}" for nt in corpus.notes) + " |")
    out("|---|" + "---|" * n)
    for part, v in zip(parts, qs):
        out(f"| {part} | " + " | ".join(f"{s:.2f}" for s in z @ v) + " |")
    out("\n| selector (all parts as query rows) | pages | facts | restated |")
    out("|---|---|---|---|")
    for name in ("cosine_pages", "mmr_pages", DEFAULT_SELECTOR):
        pages, sel = picks(pipe, name, qs, args.budget, theta if name == DEFAULT_SELECTOR else None)
        out(row(name, pages))
    _, sel = picks(pipe, "cds_learned", qs, n, theta)
    out(f"\nQuery-vertex weights at the default game's equilibrium: "
        f"{np.round(np.asarray(sel.result.x)[:len(parts)], 3).tolist()}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

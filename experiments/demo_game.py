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
4. the question's asked parts as several query vertices (split by a general rule: a question that starts with a
   question word, cut at a comma or "and" before another), the per-part cosine of each note, and what cosine, MMR
   and the default game pick from them;
5. a redundancy term (not shipped): the note block less :math:`\gamma \max(z_i^\top z_j, 0)`, whose limit is the
   non-negative least-squares reconstruction of the question by the notes;
6. each part ranked on its own (cosine, and the default game's equilibrium) and the rankings read in turn, one
   note per page (a prototype, not shipped);
7. how many development questions (QASPER, MMLongBench-Doc, HotpotQA) the rule splits, which bounds how many
   records of the reader-free tables a per-part read-out could change.

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
    """The asked parts of a question: where it starts with a question word, split at a comma or an "and" that comes
    before a question word (a general rule; any other question is returned whole: "According to the report, how
    ..." is one question)."""
    if not re.match(rf"\s*{QUESTION_WORDS}\b", question, flags=re.IGNORECASE):
        return [question.strip()]
    parts = re.split(rf",\s*(?:and\s+)?(?={QUESTION_WORDS}\b)|\s+and\s+(?={QUESTION_WORDS}\b)", question,
                     flags=re.IGNORECASE)
    return [p.strip(" ,") for p in parts if p.strip(" ,")]


def first_per_page(ranking, pages_of, budget):
    """The first ``budget`` distinct pages of a ranking of notes (the per-page read-out's first round)."""
    out = []
    for i in ranking:
        if pages_of[i] not in out:
            out.append(pages_of[i])
        if len(out) == budget:
            break
    return out


def redundant_ranking(problem, theta, gamma, n):
    """The default game's equilibrium ranking with ``gamma max(z_i z_j, 0)`` taken off its note block (its penalty
    recomputed by the game's own rule): ``(ranking of the notes, support size, query weight)``."""
    import jax.numpy as jnp

    from cdsjax.core.games.affinity import assemble_affinity
    from cdsjax.core.games.learned import learned_note_block, learned_relevance
    from cdsjax.core.equilibrium import equilibrium
    from cdsjax.core.solvers.active_set import ActiveSet

    notes, valid = problem.notes, problem.valid
    rel = learned_relevance(notes, problem.queries, valid, theta)
    block = learned_note_block(notes, valid, theta, links=problem.links, pages=problem.pages,
                               doc_ids=problem.doc_ids, kinds=problem.kinds)
    size = notes.shape[0]
    pair = valid[:, None] & valid[None, :] & ~jnp.eye(size, dtype=bool)
    block = block - jnp.where(pair, gamma * jnp.maximum(notes @ notes.T, 0.0), 0.0).astype(block.dtype)
    result = equilibrium(assemble_affinity(rel, block, valid, theta), ActiveSet())
    x = np.asarray(result.x)
    m = rel.shape[0]
    weights = x[m:m + n]
    ranking = sorted(range(n), key=lambda i: (-weights[i], -float(np.asarray(rel)[:, i].max()), i))
    return ranking, int((weights > 1e-6).sum()), float(x[:m].sum())


def dev_questions() -> dict:
    """The development questions of the three reader-free tables, by benchmark (from the shared data)."""
    import json

    from cdsjax.io.datasets.common import resolve_data_root

    root = resolve_data_root()
    qasper = json.loads((root / "qasper" / "qasper-test-v0.3.json").read_text())
    return {"qasper": [qa["question"] for paper in qasper.values() for qa in paper["qas"]],
            "mmlongbench": [s["question"] for s in json.loads((root / "mmlongbench" / "samples.json").read_text())],
            "hotpotqa": [q["question"] for q in json.loads((root / "hotpotqa" / "hotpotqa_100.json").read_text())]}


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
    from cdsjax.core import registry
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, LEARNED_SELECTOR, REFERENCE_SELECTOR, selector_spec

    # the baselines read one note per page (every registered page read-out that plays no game)
    page_baselines = tuple(n for n in registry.SPECS if n.endswith("_pages") and selector_spec(n).solver is None)

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
    _, full = picks(pipe, LEARNED_SELECTOR, q, n, theta)
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
    for name in page_baselines:
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
    for name in (*page_baselines[:2], DEFAULT_SELECTOR):
        pages, sel = picks(pipe, name, qs, args.budget, theta if name == DEFAULT_SELECTOR else None)
        out(row(name, pages))
    _, sel = picks(pipe, LEARNED_SELECTOR, qs, n, theta)
    out(f"\nQuery-vertex weights at the default game's equilibrium: "
        f"{np.round(np.asarray(sel.result.x)[:len(parts)], 3).tolist()}")
    out("\n## 5. A redundancy term in the game (not shipped): the note block less gamma max(z_i z_j, 0)\n")
    out("As gamma grows the game's note part tends to minus gamma ||sum_i x_i z_i||^2 and the equilibrium to the "
        "non-negative least-squares reconstruction of the question by the notes.\n")
    out("| gamma | pages (one per page, by equilibrium rank) | facts | restated | support | query weight |")
    out("|---|---|---|---|---|---|")
    pages_of = [int(nt["page"]) for nt in corpus.notes]
    for gamma in (0.0, 0.5, 2.0, 10.0, 100.0):
        ranking, support, xq = redundant_ranking(problem, theta, gamma, n)
        first = first_per_page(ranking, pages_of, args.budget)
        cov = demo.coverage(first)
        out(f"| {gamma:g} | {', '.join(str(p + 1) for p in first)} | {len(cov['covered'])}/4 | "
            f"{cov['restatements']} | {support} | {xq:.3f} |")

    out("\n## 6. Each part ranked on its own, the rankings read in turn (a prototype, not shipped)\n")
    out("| selector per part | pages | facts | restated |")
    out("|---|---|---|---|")
    for name in (REFERENCE_SELECTOR, LEARNED_SELECTOR):
        rankings = []
        for v in qs:
            options = {"params": theta} if name == LEARNED_SELECTOR else None
            sel = pipe.select(v, selector=name, budget=n, options=options)
            ok = np.asarray(sel.selected_valid)
            rankings.append([int(i) for i in np.asarray(sel.indices)[ok]])
        turns = [r[k] for k in range(n) for r in rankings if k < len(r)]
        out(row(f"{name}, parts in turn", first_per_page(turns, pages_of, args.budget)))
    out("\n## 7. How many development questions the rule splits into parts\n")
    for bench, questions in dev_questions().items():
        split = sum(len(question_parts(q)) > 1 for q in questions)
        out(f"- {bench}: {split} of {len(questions)} ({split / max(len(questions), 1):.1%})")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

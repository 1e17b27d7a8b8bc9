"""QASPER: questions over NLP papers; the notes are the papers' paragraphs and captions."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from cdsjax.io.datasets.common import (
    QASPER_FILE,
    FLOAT_PREFIX,
    Query,
    TextCorpus,
    Benchmark,
    resolve_data_root,
    read_json_file,
    norm_text,
    take,
)


def _qasper_answer_text(answer: dict) -> str:
    if answer.get("unanswerable"):
        return "Unanswerable"
    if answer.get("extractive_spans"):
        return ", ".join(s.strip() for s in answer["extractive_spans"])
    if answer.get("free_form_answer"):
        return str(answer["free_form_answer"]).strip()
    if answer.get("yes_no") is not None:
        return "Yes" if answer["yes_no"] else "No"
    return ""


class _TextMatcher:
    """Maps evidence strings to note ids: exact, then whitespace-normalised, then a
    unique containing note."""

    def __init__(self, note_ids: Sequence[str], texts: Sequence[str]):
        self.ids = list(note_ids)
        self.texts = list(texts)
        self.exact = {}
        self.norm = {}
        for nid, t in zip(note_ids, texts):
            self.exact.setdefault(t, nid)
            self.norm.setdefault(norm_text(t), nid)
        self.norm_texts = [norm_text(t) for t in texts]

    def match(self, text: str) -> Optional[str]:
        if text in self.exact:
            return self.exact[text]
        key = norm_text(text)
        if not key:
            return None
        if key in self.norm:
            return self.norm[key]
        hits = [nid for nid, t in zip(self.ids, self.norm_texts) if key in t]
        return hits[0] if len(hits) == 1 else None


def _qasper_corpus(paper_id: str, paper: dict) -> Tuple[TextCorpus, _TextMatcher, _TextMatcher]:
    ids, texts, kinds, sections = [], [], [], []
    seen = set()
    for section in paper.get("full_text", []):
        for para in section.get("paragraphs", []):
            key = norm_text(para)
            if not key or key in seen:  # empty and repeated paragraphs are not notes
                continue
            seen.add(key)
            ids.append(f"{paper_id}/p{len(ids)}")
            texts.append(para.strip())
            kinds.append("paragraph")
            sections.append(section.get("section_name"))
    n_par = len(ids)
    for j, fig in enumerate(paper.get("figures_and_tables", [])):
        caption = str(fig.get("caption", "")).strip()
        if not caption or norm_text(caption) in seen:
            continue
        seen.add(norm_text(caption))
        ids.append(f"{paper_id}/f{j}")
        texts.append(caption)
        kinds.append("caption")
        sections.append(fig.get("file"))
    corpus = TextCorpus(paper_id, tuple(ids), tuple(texts), tuple(kinds),
                    meta={"title": paper.get("title"), "sections": sections})
    return (corpus, _TextMatcher(ids[:n_par], texts[:n_par]),
            _TextMatcher(ids[n_par:], texts[n_par:]))


def load_qasper(data_root=None, max_queries: Optional[int] = None, *,
                max_papers: Optional[int] = None) -> Benchmark:
    """QASPER: one corpus per paper (paragraphs, then figure/table captions).

    Gold notes are the union over annotators of the cited evidence: a paragraph
    string is matched to its paragraph note (exactly, else whitespace-normalised,
    else the single paragraph containing it); ``"FLOAT SELECTED: <caption>"`` to the
    caption note. Evidence that names no note (QASPER sometimes cites a section
    heading) is listed in ``meta["unmatched_evidence"]``. Questions whose evidence
    maps to no note keep empty gold (excluded from recall).

    Args:
      data_root: directory with ``qasper/`` (default ``../shared/data``).
      max_queries: keep the first ``max_queries`` questions (paper order, then
        question order); None keeps all.
      max_papers: keep the first ``max_papers`` papers.

    Returns:
      A Benchmark with ``corpora`` keyed by arXiv id; each query's ``meta`` holds
      ``answers`` (one per annotator), ``extractive_spans`` (one list per annotator, empty unless that
      annotator's answer is extractive), ``gold_per_annotator`` (sorted id lists),
      ``answerable`` (some annotator answered) and ``unmatched_evidence``.
    """
    root = resolve_data_root(data_root)
    path = root / QASPER_FILE
    papers = read_json_file(path, "QASPER file", dict, "object keyed by paper id")
    corpora: Dict[str, TextCorpus] = {}
    queries: List[Query] = []
    for paper_id, paper in take(list(papers.items()), max_papers):
        if max_queries is not None and len(queries) >= max_queries:
            break
        corpus, par_match, cap_match = _qasper_corpus(paper_id, paper)
        if not len(corpus):
            raise ValueError(f"{path}: paper {paper_id} has no paragraphs or captions")
        used = False
        for qi, qa in enumerate(paper.get("qas", [])):
            if max_queries is not None and len(queries) >= max_queries:
                break
            per_annotator, unmatched, answers, spans = [], [], [], []
            for ann in qa.get("answers", []):
                a = ann.get("answer", {})
                answers.append(_qasper_answer_text(a))
                extractive = not a.get("unanswerable") and a.get("extractive_spans")
                spans.append([str(x).strip() for x in a["extractive_spans"] if str(x).strip()] if extractive else [])
                gold = set()
                for ev in a.get("evidence", []):
                    if ev.startswith(FLOAT_PREFIX):
                        nid = cap_match.match(ev[len(FLOAT_PREFIX):])
                    else:
                        nid = par_match.match(ev)
                    if nid is None:
                        unmatched.append(ev)
                    else:
                        gold.add(nid)
                per_annotator.append(sorted(gold))
            gold_ids = frozenset(n for g in per_annotator for n in g)
            queries.append(Query(
                qid=str(qa.get("question_id") or f"{paper_id}/q{qi}"),
                question=str(qa["question"]).strip(),
                answer=answers[0] if answers else None,
                doc_ids=(paper_id,),
                gold_note_ids=gold_ids,
                meta={
                    "answers": answers,
                    "extractive_spans": spans,
                    "answerable": any(a != "Unanswerable" for a in answers),
                    "gold_per_annotator": per_annotator,
                    "unmatched_evidence": unmatched,
                    "title": paper.get("title"),
                },
            ))
            used = True
        if used:
            corpora[paper_id] = corpus
    return Benchmark("qasper", queries, corpora=corpora)

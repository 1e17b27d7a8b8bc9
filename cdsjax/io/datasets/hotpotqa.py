"""HotpotQA (distractor setting): each question searches its own ten paragraphs."""

from __future__ import annotations

from typing import Dict, List, Optional

from cdsjax.io.datasets.common import (
    HOTPOTQA_FILE,
    Query,
    TextCorpus,
    Benchmark,
    resolve_data_root,
    read_json_file,
    take,
)


def load_hotpotqa(data_root=None, max_queries: Optional[int] = None) -> Benchmark:
    """HotpotQA (distractor setting): one corpus per question, one note per context
    paragraph (``"<title>\\n<sentences>"``); gold = the paragraphs whose titles appear
    in ``supporting_facts``.

    Args:
      data_root: directory with ``hotpotqa/`` (default ``../shared/data``).
      max_queries: keep the first ``max_queries`` questions; None keeps all.

    Returns:
      A Benchmark with ``corpora`` keyed by the question id; ``meta`` holds ``type``,
      ``level`` and the raw ``supporting_facts``.
    """
    root = resolve_data_root(data_root)
    path = root / HOTPOTQA_FILE
    items = read_json_file(path, "HotpotQA file", list, "list of questions")
    corpora: Dict[str, TextCorpus] = {}
    queries: List[Query] = []
    for i, item in take(list(enumerate(items)), max_queries):
        qid = str(item.get("_id") or item.get("id") or f"hotpotqa-{i:04d}")
        if qid in corpora:
            raise ValueError(f"{path}: duplicate question id {qid!r}")
        ids, texts, title_to_id = [], [], {}
        for j, (title, sentences) in enumerate(item["context"]):
            nid = f"{qid}/{j}"
            ids.append(nid)
            texts.append(f"{title}\n{''.join(sentences).strip()}")
            title_to_id.setdefault(title, nid)
        support_titles = {t for t, _ in item.get("supporting_facts", [])}
        missing = sorted(support_titles - set(title_to_id))
        if missing:
            raise ValueError(f"{path}: question {qid}: supporting titles {missing} "
                             "are not in its context")
        corpora[qid] = TextCorpus(qid, tuple(ids), tuple(texts), ("paragraph",) * len(ids),
                              meta={"titles": [t for t, _ in item["context"]]})
        queries.append(Query(
            qid=qid,
            question=item["question"],
            answer=None if item.get("answer") is None else str(item["answer"]),
            doc_ids=(qid,),
            gold_note_ids=frozenset(title_to_id[t] for t in support_titles),
            meta={"type": item.get("type"), "level": item.get("level"),
                  "supporting_facts": [list(sf) for sf in item.get("supporting_facts", [])]},
        ))
    return Benchmark("hotpotqa", queries, corpora=corpora)

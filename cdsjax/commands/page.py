"""The web page of ``cdsjax serve`` and what the server computes for it.

The page (``GET /``) asks one question of two selectors side by side (by default cosine and the server's
default, learned CDS): the notes both chose share a row, the notes only one chose are marked, and within
each list the near-duplicates (cosine >= a threshold shown on the page) are marked. Each note links to its PDF
at its page (``GET /pdf?document=DOC_ID#page=N``). The right selector's answer streams (``POST /ask`` with
``"stream": true``): its evidence is shown as soon as it is selected and the answer grows as it is written; the
page's ``<body>`` records ``data-evidence-shown``, ``data-tokens-before-evidence`` (pieces of the answer that
arrived before the evidence was on the page: 0), ``data-tokens`` and ``data-answer-done`` for tests. The page
renders every value with ``textContent``; no data reaches ``innerHTML``.

The server side lives here too: :func:`near_duplicates` (the pairs within one evidence list, computed from the
index's embeddings, so no embedding goes to the browser). Which PDFs ``/pdf`` serves is
:class:`cdsjax.commands.policy.PdfFiles`.
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

DEFAULT_THRESHOLD = 0.9


def near_duplicates(pipe, evidence: Sequence[dict], threshold: float = DEFAULT_THRESHOLD) -> dict:
    """The near-duplicate pairs within one evidence list.

    Args:
      pipe: the loaded :class:`cdsjax.pipeline.Pipeline` (its corpus holds the notes' embeddings).
      evidence: the evidence dicts of one answer (``rank``, ``note_id``).
      threshold: pairs with cosine similarity >= this are near-duplicates.

    Returns:
      ``{"threshold": t, "pairs": [[rank_i, rank_j, cosine], ...]}`` with ``rank_i < rank_j``, most similar
      first.
    """
    corpus = pipe.corpus
    rows = [corpus.note_index(e["note_id"]) for e in evidence]
    vectors = np.asarray(corpus.embeddings[rows], np.float32) if rows else np.zeros((0, 1), np.float32)
    sims = vectors @ vectors.T
    pairs = [[int(evidence[i]["rank"]), int(evidence[j]["rank"]), round(float(sims[i, j]), 4)]
             for i in range(len(rows)) for j in range(i + 1, len(rows)) if sims[i, j] >= threshold]
    pairs.sort(key=lambda p: -p[2])
    return dict(threshold=float(threshold), pairs=pairs)


def selector_options_html(displays: List[str]) -> str:
    """The ``<option>`` list of the selector menus (registry names only: no request data)."""
    return "".join(f'<option value="{d}">{d}</option>' for d in displays)


def render(*, default_selector: str, default_budget: int, selector_displays: List[str]) -> str:
    """The page, with the server's defaults filled in."""
    return (PAGE.replace("__DEFAULT_SELECTOR__", default_selector)
            .replace("__SELECTOR_OPTIONS__", selector_options_html(selector_displays))
            .replace("__DEFAULT_BUDGET__", str(default_budget))
            .replace("__DEFAULT_THRESHOLD__", str(DEFAULT_THRESHOLD)))


PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cdsjax</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem auto; max-width: 78rem; padding: 0 1rem; color: #222; }
 form { display: flex; gap: .5rem; flex-wrap: wrap; align-items: center; } input[name=q] { flex: 1 1 28rem; padding: .45rem; }
 select, input, button { font: inherit; padding: .35rem; } .muted { color: #666; font-size: 12px; }
 .warn { color: #8a4b00; } .err { color: #a00; } #answer { margin: .8rem 0; white-space: pre-wrap; }
 table { border-collapse: collapse; width: 100%; margin-top: .5rem; table-layout: fixed; }
 th { text-align: left; padding: .3rem .4rem; border-bottom: 2px solid #bbb; }
 td { border-top: 1px solid #ddd; padding: .4rem; vertical-align: top; width: 50%; }
 tr.both td { background: #f3f8f3; } td.only { background: #fff7e6; } td.empty { background: #fafafa; }
 .tag { display: inline-block; font-size: 11px; padding: 0 .35rem; border-radius: .6rem; margin-right: .25rem; }
 .tag.both { background: #d6ecd6; } .tag.only { background: #ffe0a3; } .tag.dup { background: #f6c9c9; }
 .head { font-size: 12px; color: #444; margin-bottom: .2rem; } .text { font-size: 13px; }
 img { max-width: 100%; max-height: 12rem; display: block; margin-top: .3rem; border: 1px solid #ccc; }
</style></head><body>
<h1>cdsjax: two selectors, one question</h1>
<form id="ask"><input name="q" placeholder="Ask a question of the indexed documents" required>
 <label>left <select name="a">__SELECTOR_OPTIONS__</select></label>
 <label>right <select name="b">__SELECTOR_OPTIONS__</select></label>
 <label>budget <input name="budget" type="number" min="1" max="512" value="__DEFAULT_BUDGET__" style="width:4.5rem"></label>
 <label>near-duplicate if cosine &ge; <input name="threshold" type="number" min="-1" max="1" step="0.01"
   value="__DEFAULT_THRESHOLD__" style="width:4.5rem"></label>
 <button>Ask</button></form>
<p id="status" class="muted"></p>
<p id="legend" class="muted" hidden><span class="tag both">both</span>chosen by both selectors (same row)
 <span class="tag only">only</span>chosen by one selector <span class="tag dup">&asymp; #k</span>near-duplicate
 of note #k in the same list (cosine &ge; <span id="thr"></span>)</p>
<div id="answer"></div><div id="warnings" class="warn"></div>
<table id="compare" hidden><thead><tr><th id="ha"></th><th id="hb"></th></tr></thead><tbody></tbody></table>
<script>
const form = document.getElementById("ask"), status = document.getElementById("status");
form.a.value = "cosine"; form.b.value = "__DEFAULT_SELECTOR__";
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls; return e; }
async function post(path, body) {
  const reply = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                                   body: JSON.stringify(body)});
  let data = await reply.json();
  if (!reply.ok) { if (!data.result) throw new Error("error " + reply.status + ": " + data.error);
                   data = Object.assign(data.result, {answer: null, read_error: data.error}); }
  return data;
}
function summary(r) {
  const d = r.diagnostics || {};
  return r.selector + (d.mode ? " (" + d.mode + " mode, " + (d.converged ? "converged" : "NOT converged") +
    ", support " + d.support_size + ")" : "") + " · " + (1000 * r.timings.total).toFixed(0) + " ms";
}
function dupMarks(r) {  // rank -> [[other rank, cosine], ...]
  const m = new Map();
  for (const [i, j, c] of r.near_duplicates.pairs) {
    if (!m.has(i)) m.set(i, []); if (!m.has(j)) m.set(j, []);
    m.get(i).push([j, c]); m.get(j).push([i, c]);
  }
  return m;
}
function noteCell(row, e, side, shared, dups, label) {
  const td = row.insertCell();
  if (!e) { td.className = "empty"; return td; }
  td.className = "note " + side + (shared ? " shared" : " only");
  td.dataset.note = e.note_id; td.dataset.rank = e.rank;
  const head = el("div", undefined, "head");
  head.appendChild(el("span", shared ? "both" : "only " + label, "tag " + (shared ? "both" : "only")));
  for (const [k, c] of (dups.get(e.rank) || []))
    head.appendChild(el("span", "\u2248 #" + k + " (" + c.toFixed(2) + ")", "tag dup"));
  head.appendChild(el("b", "#" + e.rank)); head.appendChild(document.createTextNode(
    " · " + e.score.toFixed(4) + " · " + e.document + " · " + e.kind + " · "));
  const link = el("a", "page " + (e.page + 1), "pdf");
  const index = e.index ? "&index=" + encodeURIComponent(e.index) : "";
  link.href = "/pdf?document=" + encodeURIComponent(e.document) + index + "#page=" + (e.page + 1);
  link.target = "_blank"; head.appendChild(link);
  td.appendChild(head);
  td.appendChild(el("div", e.text.replace(/\s+/g, " ").slice(0, 320), "text"));
  if (e.image_path) { const img = document.createElement("img");
    img.src = "/crop?note=" + encodeURIComponent(e.note_id) + index; img.alt = e.caption || e.kind; td.appendChild(img); }
  return td;
}
async function stream(path, body, onEvidence, onToken, onRetry) {  // JSON lines: evidence, token..., done
  const reply = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                                   body: JSON.stringify(Object.assign({stream: true}, body))});
  if (!reply.ok || !reply.body) { const data = await reply.json();
    if (!data.result) throw new Error("error " + reply.status + ": " + data.error);
    return Object.assign(data.result, {answer: null, read_error: data.error}); }
  const lines = reply.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "", last = null;
  for (;;) {
    const {value, done} = await lines.read();
    if (done) break;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const event = JSON.parse(buffer.slice(0, cut)); buffer = buffer.slice(cut + 1);
      if (event.event === "evidence") await onEvidence(event.result);
      else if (event.event === "token") onToken(event.text);
      else if (event.event === "retry") onRetry(event.reason);
      else if (event.event === "done") last = event.result;
      else if (event.event === "error") last = Object.assign(event.result, {answer: null, read_error: event.error});
    }
  }
  if (!last) throw new Error("the answer stream ended early");
  return last;
}
function showEvidence(left, right, threshold) {
  document.getElementById("ha").textContent = "left: " + left.selector;
  document.getElementById("hb").textContent = "right: " + right.selector;
  document.getElementById("thr").textContent = Number(threshold).toFixed(2);
  const inRight = new Map(right.evidence.map(e => [e.note_id, e]));
  const inLeft = new Set(left.evidence.map(e => e.note_id));
  const dl = dupMarks(left), dr = dupMarks(right);
  const tbody = document.getElementById("compare").tBodies[0];
  tbody.replaceChildren();
  for (const e of left.evidence) if (inRight.has(e.note_id)) {  // chosen by both: one row, in the left order
    const row = tbody.insertRow(); row.className = "pair both";
    noteCell(row, e, "left", true, dl, left.selector); noteCell(row, inRight.get(e.note_id), "right", true, dr, right.selector);
  }
  const onlyL = left.evidence.filter(e => !inRight.has(e.note_id));
  const onlyR = right.evidence.filter(e => !inLeft.has(e.note_id));
  for (let i = 0; i < Math.max(onlyL.length, onlyR.length); i++) {
    const row = tbody.insertRow(); row.className = "pair differ";
    noteCell(row, onlyL[i], "left", false, dl, left.selector); noteCell(row, onlyR[i], "right", false, dr, right.selector);
  }
  document.getElementById("compare").hidden = false; document.getElementById("legend").hidden = false;
}
async function ask(q, a, b, budget, threshold) {
  status.className = "muted"; status.textContent = "asking...";
  const answer = document.getElementById("answer"), page = document.body.dataset;
  answer.textContent = ""; document.getElementById("warnings").textContent = "";
  delete page.evidenceShown; delete page.answerDone; delete page.tokensBeforeEvidence; delete page.tokens;
  let left, right, tokens = 0, label = "";
  const body = {question: q, budget: budget, near_duplicates: threshold};
  try {
    const leftReply = post("/select", Object.assign({selector: a}, body));
    right = await stream("/ask", Object.assign({selector: b}, body), async evidence => {
      left = await leftReply;  // the evidence is shown as soon as both selections are in, the answer still coming
      showEvidence(left, evidence, threshold);
      page.evidenceShown = "yes"; page.tokensBeforeEvidence = String(tokens);
      label = "Answer (from " + evidence.selector + "'s evidence): "; answer.textContent = label;
      status.textContent = "left: " + summary(left) + "   |   right: " + summary(evidence) + "   |   reading...";
    }, text => { tokens += 1; answer.textContent += text; },
       reason => { answer.textContent = label; });  // that reply was no answer: it is asked again
    left = left || await leftReply;
  } catch (e) { status.className = "err"; status.textContent = String(e.message || e); return; }
  page.answerDone = "yes"; page.tokens = String(tokens);
  status.textContent = "left: " + summary(left) + "   |   right: " + summary(right);
  if (right.read_error) { status.className = "err"; status.textContent += "   |   " + right.read_error; }
  answer.textContent = right.answer === null || right.answer === undefined ? "" :
    "Answer (from " + right.selector + "'s evidence): " + right.answer;
  document.getElementById("warnings").textContent = [...(left.warnings || []), ...(right.warnings || [])].join(" ");
  showEvidence(left, right, threshold);
}
form.addEventListener("submit", ev => { ev.preventDefault();
  ask(form.q.value, form.a.value, form.b.value, parseInt(form.budget.value, 10), parseFloat(form.threshold.value)); });
const params = new URLSearchParams(location.search);
if (params.get("q")) {
  form.q.value = params.get("q");
  if (params.get("a")) form.a.value = params.get("a");
  if (params.get("b") || params.get("selector")) form.b.value = params.get("b") || params.get("selector");
  if (params.get("budget")) form.budget.value = params.get("budget");
  if (params.get("threshold")) form.threshold.value = params.get("threshold");
  form.requestSubmit();
}
</script></body></html>
"""

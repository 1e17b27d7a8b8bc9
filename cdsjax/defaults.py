"""The product's defaults, each defined once: ``ask``, ``serve``, the web page, the demo, the pipeline, the
evaluation and the integrations read them here. Plain values and no imports, so that a command's flags can name
them before JAX loads.
"""

# Evidence notes selected per question when the caller names no budget.
DEFAULT_BUDGET = 10

# The local CPU reader's evidence, in estimated tokens (cdsjax.io.reading.evidence_fit): the selected notes fill it in
# rank order, the one that does not fit whole keeps its sentences nearest the question. Chosen by measurement so
# that a warm answer on 2 cores takes about 15 s or less (RESULTS, "Evidence sized for the reader"); a remote
# server's budget is derived from its context window instead (cdsjax.io.reading.reader.Reader.evidence_tokens).
LOCAL_EVIDENCE_TOKENS = 500

# New tokens a local answer may take: a small model's answers are short, and a runaway one costs ~40 ms a token.
LOCAL_MAX_TOKENS = 384

# What ranks the notes for every selector (cdsjax.io.relevance): "hybrid" (the cosine mixed with a BM25 match of the
# question's words) or "dense" (the cosine alone), and the weight of the lexical half. Chosen on development
# questions, the weight by cross-validation (RESULTS, "Lexical and dense relevance"; experiments/relevance_table.py).
DEFAULT_RELEVANCE = "hybrid"
DEFAULT_LEXICAL_WEIGHT = 0.3
# Whether a note is embedded and matched with the words that place it (its document's title, the section heading
# above it; cdsjax.io.placement). Off: measured, it did not raise has-answer on either development table.
DEFAULT_NOTE_CONTEXT = False

# How long the warm cdsjax server (cdsjax.commands.warm: the one process that holds the indexes, the encoder, the
# compiled selectors and the local reader for `cdsjax ask`) stays up after a command's last use, in seconds; a
# command may ask for 0 (nothing kept: it loads and reads in its own process) or a value between the floor and the
# ceiling. A command's keep-alive only ever lengthens what the server already promised others.
DEFAULT_KEEP_ALIVE = 300.0
KEEP_ALIVE_FLOOR = 5.0
KEEP_ALIVE_CEILING = 86400.0
# Sets of indexes the warm server keeps loaded at once (the least recently used is dropped first).
WARM_MAX_INDEXES = 4

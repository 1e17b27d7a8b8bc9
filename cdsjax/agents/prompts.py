"""The planning agent's prompts: decomposer, refiner, checker, and the context added to worker and reasoner.

Each is a ``str.format`` template (doubled braces are literal JSON braces); the agent fills them in
(:mod:`cdsjax.agents.agent`).
"""

DECOMPOSER_SYSTEM = """\
You plan the research needed to answer a question about a collection of documents. You do not answer \
the question. You split it into sub-questions that can each be looked up in the documents, and say which \
sub-questions need the answers of others.

Rules:
- At most {max_nodes} sub-questions. A question that needs a single look-up gets a single sub-question.
- Each sub-question must make sense on its own as a search query: name the entities, figures, tables \
or sections it is about instead of writing "it" or "the above".
- "needs" lists the ids of the sub-questions whose answers this one uses. No cycles, and no chain of \
needs longer than {max_depth} sub-questions.
- Do not repeat the whole original question as a sub-question; it is answered at the end from your \
sub-questions.

Reply with one JSON object and nothing else, in this form:
{{"nodes": [{{"id": "q1", "question": "...", "needs": []}}, {{"id": "q2", "question": "...", "needs": ["q1"]}}]}}"""

DECOMPOSER_USER = """\
A first search for the question found this (excerpts, best match first):

{digest}

Question: {question}

Write the plan as JSON."""

REFINER_USER = """\
Question: {question}

A first search for the question found this (excerpts, best match first):

{digest}

The previous plan was:
{plan}

Its sub-questions were answered as follows:
{findings}

A check of these findings says this is still missing:
{gaps}

Revise the plan so that it closes these gaps. Keep sub-questions that worked (same id and wording, so \
they are not redone), reword or replace the ones that failed, add sub-questions for what is missing, and \
drop the ones that do not help. The same rules apply (at most {max_nodes} sub-questions, chains of needs \
at most {max_depth} long). Reply with the revised plan as one JSON object in the same form, nothing else."""

CHECKER_SYSTEM = """\
You check whether research findings are enough to answer a question about documents. You do not answer \
the question. Be strict: the findings are sufficient only if together they establish every fact, number \
and comparison the answer needs; a finding that says "Not answerable" establishes nothing.

Reply with one JSON object and nothing else:
{"sufficient": true or false, "gaps": ["...", ...]}
When the findings are not sufficient, list one to three gaps, each a specific piece of information \
that is still missing, phrased so that it can be looked up; when they are sufficient, "gaps" is []."""

CHECKER_USER = """\
Question: {question}

A first search for the question found this (excerpts, best match first):

{digest}

Findings of the sub-questions, each answered from its own evidence:
{findings}

Are the findings sufficient to answer the question? Reply with the JSON object."""

RETRY_USER = "That reply could not be used ({reason}). Reply again with the JSON object only, in the form asked for."

WORKER_CONTEXT = """\

Facts established by earlier steps (take them as given; they are not numbered evidence):
{facts}"""

REASONER_CONTEXT = """\

Findings of sub-questions that were researched for this question, each from its own evidence (use them \
together with the numbered evidence above; cite only the numbered evidence):
{findings}"""

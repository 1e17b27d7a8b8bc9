r"""The planning-graph agent (G²-Reader §3.3): decompose, retrieve per sub-question, check, refine, answer.

One question runs like this:

1. **Probe.** Retrieve for the question itself; a short digest of that evidence tells the decomposer
   what the documents hold.
2. **Decompose.** The model writes a DAG of at most 6 sub-questions, dependency chains at most 3 long
   (:mod:`cdsjax.agents.plan` reads and repairs it).
3. **Execute.** Sub-questions run in a topological order (Kahn's algorithm). Each one retrieves its own
   evidence (any selector; or, in combined mode, one selection for all sub-questions at once, every
   sub-question a query vertex of one constrained dominant set), and a worker (the reader) answers it
   from that evidence plus the answers of the nodes it needs.
4. **Check.** An evidence checker reads the findings and replies ``{"sufficient": bool, "gaps": [...]}``.
5. **Refine.** While the checker finds gaps and fewer than ``tau_max`` refinements were made, the model
   revises the DAG for the gaps and steps 3-4 run again (unchanged nodes are not recomputed).
6. **Answer.** A reasoner (the reader) answers the question from the union of the evidence and the
   sub-question findings.

Every step is recorded: :meth:`PlanningResult.to_dict` holds the answer, the final evidence in the format
of ``cdsjax ask --json``, and the trace (the DAG of each round, each node's evidence and answer, the
checker's verdicts, every repair made to a model reply, raw replies that could not be used).

Model replies are never trusted to be well formed: an unreadable plan is asked for once more, then
replaced by a one-node plan (the question itself) or, in a refinement, by the previous plan; an
unreadable verdict ends refinement. The reason is recorded each time. Server failures that every later
call would hit too (unreachable, unknown model, refused key) are raised as :class:`ReaderError`.

    agent = PlanningAgent(ReaderConfig(base_url=...), retrieve)
    result = agent.run("Which of the two systems has the larger Table 3 score?")
    result.answer, result.to_dict()["trace"]["rounds"][0]["plan"]

The parts, one module each: :mod:`~cdsjax.agents.prompts` (the prompts), :mod:`~cdsjax.agents.trace`
(what a run records), :mod:`~cdsjax.agents.agent` (the agent), :mod:`~cdsjax.agents.retrieval` (retrieval
from a corpus and :func:`~cdsjax.agents.retrieval.run_planning`); this module is the walk-through, and the
names are imported from their own modules (or from :mod:`cdsjax.agents`).
"""

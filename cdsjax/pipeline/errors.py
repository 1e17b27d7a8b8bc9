"""The error a user of the product layer sees: one line, no traceback (the commands print it as it is)."""


class PipelineError(Exception):
    """A user-facing error of the pipeline (one line)."""

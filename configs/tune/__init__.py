"""Configs of ``cdsjax tune``: ``small`` (the default test run) and ``dev`` (the shipped fit, built on ``small``)."""

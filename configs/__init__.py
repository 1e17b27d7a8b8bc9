"""Evaluation configs, one ``get_config(arg=None)`` per file (big_vision's layout).

A file is loaded by path (``--config configs/qasper.py[:ARG]``, ml_collections ``config_flags``) and reaches
its siblings through this package (``from configs import common``; ``from configs.qasper import
get_config``). Entry points make the package importable: ``experiments/*.py`` put the repository root on
``sys.path``; ``cdsjax eval`` does the same for the package a config file belongs to
(:func:`cdsjax.config.import_config_package`).
"""

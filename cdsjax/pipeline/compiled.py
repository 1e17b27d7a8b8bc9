"""A selector chosen for a question and its jitted functions.

A question names its selector once (a registry name, a display form, or the spec itself); the pipeline resolves
it into a :class:`Choice` (the spec, the budget, the options split into those that shape the compilation and
those passed as arguments, and the key of the compiled selector), and everything below takes the choice, never
the name again. :func:`compile_selector` builds the choice's jitted :class:`~cdsjax.core.Selector` (its
programs kept beside the compilation cache, :class:`~cdsjax.io.compilation_cache.ExportedJit`), and
:func:`bind` gives a compiled entry its traced option values.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Union

import jax.numpy as jnp

from cdsjax import core
from cdsjax.core.registry import SelectorSpec
from cdsjax.core.types import as_selector
from cdsjax.io.compilation_cache import CompileCache, ExportedJit
from cdsjax.pipeline import catalog
from cdsjax.pipeline.errors import PipelineError
from cdsjax.pipeline.selection import resolve_options, resolve_selector, selector_key

# The options that are array leaves of the game's parameters (CDSParams.beta, .tau): a value given for one is an
# argument of the compiled selector, so a new value reuses its program; every other option shapes the
# compilation (a static field, a loop limit, a Python-level choice) and is part of the selector's key, so each
# of its values is one entry of the pipeline's capped SelectorCache (``--max-compiled``).
TRACED_OPTIONS = ("beta", "tau")
TRACED = "<argument>"  # a traced option's place in a selector key


def split_options(selector: Union[str, SelectorSpec], options: Optional[dict]) -> tuple:
    """``(static, traced)``: ``options`` of ``selector`` (a name or its spec) that key its compilation, and those
    passed to it as array arguments (:data:`TRACED_OPTIONS` given as real numbers)."""
    static, traced = {}, {}
    accepted = catalog.selector_spec(selector).options
    for name, value in dict(options or {}).items():
        if (name in TRACED_OPTIONS and name in accepted and isinstance(value, (int, float))
                and not isinstance(value, bool)):
            traced[name] = float(value)
        else:
            static[name] = value
    return static, traced


@dataclasses.dataclass(frozen=True)
class Choice:
    """A selector chosen for one question, its name resolved once (:meth:`make`).

    Attributes:
      spec: the selector's registry spec.
      budget: the number of notes to select, as the caller gave it.
      static: the options that shape the compilation (part of ``key``).
      traced: the :data:`TRACED_OPTIONS` given as real numbers: arguments of the compiled programs.
      key: the compiled selector's key (:func:`cdsjax.pipeline.selection.selector_key`: registry name, budget,
        options, a parameter value by its content, a traced option by its name only, so its values share one
        compiled selector).
    """

    spec: SelectorSpec
    budget: int
    static: Dict[str, Any]
    traced: Dict[str, float]
    key: tuple

    @classmethod
    def make(cls, selector: Union[str, SelectorSpec], budget: int, options: Optional[dict] = None,
             params=None) -> "Choice":
        """``selector`` (a name as users write it, or its spec: then no lookup) at ``budget`` with ``options``;
        ``params``: the learned game's parameters when ``options`` names none. Unknown names and bad options or
        parameter files are a one-line :class:`PipelineError`."""
        spec = catalog.resolve(selector)
        try:
            static, traced = split_options(spec, options)
            key = selector_key(spec, budget, resolve_options(spec, {**static, **dict.fromkeys(traced, TRACED)},
                                                             params))
        except ValueError as err:
            raise PipelineError(str(err)) from None
        return cls(spec=spec, budget=budget, static=static, traced=traced, key=key)


def compile_selector(choice: Choice, params=None, compile_cache: Optional[CompileCache] = None) -> core.Selector:
    """The jitted :class:`~cdsjax.core.Selector` of ``choice`` (``params``: the learned game's parameters when its
    options name none), its programs named by ``choice.key`` and kept beside ``compile_cache`` (None: plain
    ``jax.jit``). With traced options its functions take their values as a last argument (:func:`bind`)."""

    def build(leaves):
        try:
            _, fn = resolve_selector(choice.spec, choice.budget, {**choice.static, **leaves}, params)
        except ValueError as err:
            raise PipelineError(str(err)) from None
        return as_selector(fn)

    sel = build(choice.traced)  # (a bad static option is one line here, whatever the traced values)
    if choice.traced:  # the functions take the traced options as an argument, built into the game when traced
        sel = core.Selector(lambda problem, k, leaves: build(leaves)(problem, k),
                            corpus_bound=None if sel.corpus_bound is None else (
                                lambda problem, leaves: build(leaves).corpus_bound(problem)),
                            corpus_block=None if sel.corpus_block is None else (
                                lambda problem, leaves: build(leaves).corpus_block(problem)),
                            solver=sel.solver)
    # jitted, its traced program kept beside the compilation cache (when the command turned it on): a fresh process
    # neither traces nor lowers a selector it met before; the spectral bound and note block of the selector's game
    # are computed once per corpus (the pipeline keeps them)
    suffix = {"select": "", "bound": ":bound", "block": ":block"}
    return sel.wrapped(lambda f, role: ExportedJit(f, repr(choice.key) + suffix[role], compile_cache))


def bind(entry: core.Selector, leaves: dict) -> core.Selector:
    """A selector of ``entry``'s compiled functions (which take the traced options as their last argument)
    with ``leaves`` given."""
    args = {k: jnp.asarray(v) for k, v in sorted(leaves.items())}  # weak-typed, as the Python number was
    return core.Selector(lambda problem, key=None: entry.select(problem, key, args),
                         corpus_bound=None if entry.corpus_bound is None else (
                             lambda problem: entry.corpus_bound(problem, args)),
                         corpus_block=None if entry.corpus_block is None else (
                             lambda problem: entry.corpus_block(problem, args)), solver=entry.solver)

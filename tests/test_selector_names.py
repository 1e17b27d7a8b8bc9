"""A selector's registry name lives in the selector registry (cdsjax/core/registry.py); its display form, help
line and the default in the catalog above it (cdsjax/pipeline/catalog.py).

Elsewhere code reads them from :data:`cdsjax.core.registry.SPECS` and the catalog's ``DEFAULT_SELECTOR``,
``REFERENCE_SELECTOR``, ``PAPER_SELECTOR`` and :func:`~cdsjax.pipeline.catalog.display`. Docs, docstrings, comments and
tests may name selectors, and so may ``configs/`` (a config choosing what to evaluate is configuration, like a
command line). The check is static: no string literal other than a docstring or an ``__all__`` entry, in
``cdsjax/`` or ``experiments/``, is a selector name, a comma-separated list of them, or holds one after ``--selector``.
``random`` is left out: it is also the distractor kind of candidate pools (``io.datasets.DISTRACTORS``).
Files listed in :data:`OTHER_LIBRARIES` label another library's methods with the same words; they are not
registry names.
"""

import ast
import re
from pathlib import Path

from cdsjax.pipeline.catalog import selector_names

ROOT = Path(__file__).resolve().parents[1]
HOMES = (ROOT / "cdsjax" / "core" / "registry.py", ROOT / "cdsjax" / "pipeline" / "catalog.py",
         ROOT / "cdsjax" / "catalog.py")  # the default selector is named in cdsjax.catalog (DESIGN 7.5)
NAMES = set(selector_names()) - {"random"}  # registry names and display forms
FLAG = re.compile(r"--selector[ =]([A-Za-z_-]+)")
OTHER_LIBRARIES = {
    "experiments/compare_langchain.py": "rows of LangChain's similarity order and MMR beside the CDS adapter",
}


def names_in(text: str) -> list:
    """Selector names a string spells: the whole string, every part of a comma list, or ``--selector X``."""
    parts = [p.strip() for p in text.split(",")]
    if all(p in NAMES for p in parts):
        return parts
    return [m for m in FLAG.findall(text) if m in NAMES]


def _defined(tree: ast.AST) -> set:
    """Names the module itself binds at top level (functions, classes, assigned names): ``cds_support`` is a
    function of core.cds as well as a registry name, and a wrapper naming itself is not a selector name."""
    names = set()
    for node in getattr(tree, "body", ()):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _exempt(tree: ast.AST) -> set:
    """ids of the string nodes that are docstrings, ``__all__`` entries, or the name of something the module
    binds (see :func:`_defined`)."""
    out = set()
    own = _defined(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in own:
            out.add(id(node))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            out.update(id(n) for n in ast.walk(node.value))
    return out


def selector_literals(path: Path) -> list:
    """``"line: 'literal'"`` for each string literal of ``path`` that spells a selector name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    exempt = _exempt(tree)
    return [f"{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in exempt
            and names_in(node.value)]


def test_the_check_finds_names_lists_and_flags_but_not_prose_or_docstrings(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""cosine and cds-paper in a docstring are documentation."""\n'
                   '__all__ = ["cds_support"]\n'
                   'A = "cds-converged"\nB = "cosine,mmr"\nC = f"use --selector cds-paper now"\n'
                   'D = "exact cosine similarity"\nE = "random"\n'
                   'cds_support = make("cds_support")\n')
    assert selector_literals(src) == ["3: 'cds-converged'", "4: 'cosine,mmr'", "5: 'use --selector cds-paper now'"]


def test_selector_names_live_only_in_the_registry_and_the_catalog():
    bad = [f"{path.relative_to(ROOT)}:{hit}" for top in ("cdsjax", "experiments")
           for path in sorted((ROOT / top).rglob("*.py"))
           if path not in HOMES and str(path.relative_to(ROOT)) not in OTHER_LIBRARIES
           for hit in selector_literals(path)]
    assert not bad, ("selector names spelled outside the registry and the catalog:\n"
                     + "\n".join(bad))


def test_the_core_registry_holds_no_product_choices():
    """The default, the display forms and the help lines are the catalog's: the core registry's specs say what a
    selector is, and the core names no default."""
    import dataclasses

    from cdsjax.core import registry

    fields = {f.name for f in dataclasses.fields(registry.SelectorSpec)}
    assert not fields & {"display", "help", "aliases"}, fields
    assert not [n for n in dir(registry) if n.endswith("_SELECTOR") or n == "selectors_help"]
    text = "\n".join(p.read_text() for p in sorted((ROOT / "cdsjax" / "core").rglob("*.py")))
    assert "DEFAULT_SELECTOR" not in text


def test_the_checks_read_the_default_selector_at_cdsjax_catalog():
    """DESIGN 7.5: ``cdsjax.catalog.DEFAULT_SELECTOR`` is the default selector, named there once; the catalog
    itself is :mod:`cdsjax.pipeline.catalog`, which reads it there."""
    import cdsjax.catalog
    from cdsjax.pipeline import catalog

    assert cdsjax.catalog.DEFAULT_SELECTOR == catalog.DEFAULT_SELECTOR in catalog.SHOWN
    assert cdsjax.catalog.__all__ == ["DEFAULT_SELECTOR"]


def test_every_name_is_accepted_with_dash_or_underscore():
    """DESIGN 7.7: ``cds-learned-pages`` = ``cds_learned_pages`` wherever a name is read (catalog, core, eval)."""
    import ml_collections

    from cdsjax import core
    from cdsjax.eval.settings import selector_specs
    from cdsjax.pipeline.catalog import selector_spec

    for name in selector_names():
        for spelled in (name.replace("-", "_"), name.replace("_", "-")):
            assert selector_spec(spelled) is selector_spec(name)
    assert core.make_selector("cds-converged", budget=2) is not None
    config = ml_collections.ConfigDict({"selectors": "cds-learned-pages,cds_paper",
                                        "selector_options": {"cds_learned_pages": {"notes_per_page": 2}}})
    specs = selector_specs(config)
    assert [(s[1], s[2]) for s in specs] == [("cds_learned_pages", {"notes_per_page": 2}), ("cds", {})]

"""Checks that keep the layout honest (LAYOUT.md): files of one job, configs as a package, tests kept apart."""

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imported_modules(source: str, filename: str) -> list:
    out = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def _sources(top: str):
    """``(label, python source)`` of every .py file and every notebook code cell under ``top``."""
    for path in sorted((ROOT / top).rglob("*.py")):
        yield str(path.relative_to(ROOT)), path.read_text()
    for path in sorted((ROOT / top).rglob("*.ipynb")):
        cells = json.loads(path.read_text()).get("cells", [])
        for k, cell in enumerate(cells):
            if cell.get("cell_type") == "code":
                text = "".join(cell.get("source", []))
                lines = [line for line in text.splitlines() if not line.lstrip().startswith(("%", "!"))]
                yield f"{path.relative_to(ROOT)}[cell {k}]", "\n".join(lines)


def test_nothing_outside_tests_imports_tests():
    bad = [f"{label}:{line}: {module}" for top in ("cdsjax", "experiments", "configs", "notebooks")
           if (ROOT / top).is_dir() for label, source in _sources(top)
           for line, module in _imported_modules(source, label) if module == "tests" or module.startswith("tests.")]
    assert not bad, "modules outside tests/ import the tests package:\n" + "\n".join(bad)


def private_imports(root) -> list:
    """``file:line: module import _name`` for every name starting with one underscore that a module of ``root``
    imports from another cdsjax module (a private submodule of the importer's own package excepted)."""
    import ast

    out = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        package = ".".join(parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "cdsjax"):
                continue
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                submodule = root.parent.joinpath(*node.module.split("."), name + ".py")
                if node.module == package and submodule.is_file():
                    continue
                out.append(f"{path.relative_to(root.parent)}:{node.lineno}: {node.module} import {name}")
    return out


def test_no_module_imports_another_modules_private_names():
    """Files are grouped by job, not cut at a line count; what one module uses of another is that module's public
    interface, so a split never leaves a module leaning on its sibling's private names."""
    bad = private_imports(ROOT / "cdsjax")
    assert not bad, "private names imported from another module (make them public or move the code):\n" + \
        "\n".join(bad)


def test_the_private_import_check_finds_one(tmp_path):
    pkg = tmp_path / "cdsjax" / "io"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from cdsjax.io.b import _hidden, shown\nfrom cdsjax.io import _sub\n")
    (pkg / "_sub.py").write_text("")
    assert private_imports(tmp_path / "cdsjax") == ["cdsjax/io/a.py:1: cdsjax.io.b import _hidden"]


def test_configs_load_no_sibling_by_file_path():
    bad = [str(p.relative_to(ROOT)) for top in ("configs", "experiments") for p in sorted((ROOT / top).rglob("*.py"))
           if "spec_from_file_location" in p.read_text()]
    assert not bad, f"configs loaded by file path (import them through the configs package): {bad}"


def _selector_default_claims(text: str, names: list, phrases: list) -> list:
    """Phrases of ``text`` that call a selector of ``names`` (exact spellings) or ``phrases`` (any case) the default
    (``default: cds-converged``, ``the default selector is converged CDS``, ``converged CDS (the default)``,
    ``the server's default, converged CDS)``, ``default selector (cds-paper)``)."""
    import re

    spelled = [rf"(?<![\w-]){re.escape(n)}(?![\w-])" for n in sorted(names, key=len, reverse=True)]
    alt = "|".join(spelled + [rf"(?i:{re.escape(p)})" for p in phrases])
    q = r"[`*\"']*"
    patterns = (rf"(?i:\bdefault(?:\s+selector)?\s*(?:is|:))\s*(?:the\s+)?{q}(?:{alt}){q}",
                rf"(?i:\bdefault),\s*{q}(?:{alt}){q}\s*[).]",
                rf"(?:{alt}){q}\s*(?i:\(\s*(?:the\s+)?default\b)",
                rf"(?i:\bdefault\s+selector)\s*\(\s*{q}(?:{alt}){q}\s*[),]")
    return [m.group(0) for p in patterns for m in re.finditer(p, text)]


def test_docs_name_the_registry_default_selector():
    """A docstring, comment, config or README sentence that calls a selector the default names the registry's
    DEFAULT_SELECTOR (its names or "learned CDS"), never another selector."""
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, display
    from cdsjax.core.registry import SPECS

    others = [n for s in SPECS.values() if s.name != DEFAULT_SELECTOR for n in {s.name, display(s.name)}]
    phrases = ["converged CDS", "paper mode", "the paper's game"]  # how the other CDS selectors are described
    files = [p for top in ("cdsjax", "experiments", "configs") for p in sorted((ROOT / top).rglob("*.py"))]
    bad = [f"{p.relative_to(ROOT)}: {claim!r}" for p in [*files, ROOT / "README.md"]
           for claim in _selector_default_claims(p.read_text(), others, phrases)]
    assert not bad, "sentences naming a default other than the registry's:\n" + "\n".join(bad)
    # the check can fail: the stale sentences issue 33 lists are caught
    for stale in ("(default: ``cds-converged``, as ``cdsjax ask``)", "The default selector is converged CDS",
                  "converged CDS (the default)", "the server's default, converged CDS)", "default selector (cds-paper)"):
        assert _selector_default_claims(stale, others, phrases), stale
    assert not _selector_default_claims("the default selector is learned CDS (``cds-learned``)", others, phrases)


def test_core_opens_no_file():
    """The pure core receives values: no file is opened, read or named there (parameter files: cdsjax.learn)."""
    import re

    calls = re.compile(r"\bopen\(|\.read_text\(|\.read_bytes\(|\.write_text\(|\bimport (?:pathlib|json|os)\b|__file__")
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "cdsjax" / "core").rglob("*.py"))
           for i, line in enumerate(p.read_text().splitlines(), 1) if calls.search(line)]
    assert not bad, f"file access in cdsjax/core: {bad}"

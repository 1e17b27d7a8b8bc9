"""Checks that keep the layout honest (LAYOUT.md): files of one job, configs as a package, tests kept apart."""

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600


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


def test_no_file_in_the_package_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "cdsjax").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them by job): {long}"


def test_configs_load_no_sibling_by_file_path():
    bad = [str(p.relative_to(ROOT)) for top in ("configs", "experiments") for p in sorted((ROOT / top).rglob("*.py"))
           if "spec_from_file_location" in p.read_text()]
    assert not bad, f"configs loaded by file path (import them through the configs package): {bad}"

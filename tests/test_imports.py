"""The import structure of ``cdsjax``, read from the source with ``ast`` (nothing is imported).

The graph. Every ``.py`` file under ``cdsjax/`` is a module (``__init__.py`` is its package). Its edges are
all its imports, at module level and inside functions, classes and ``try`` blocks, because a function-level
import that closes a loop is still a loop (it only moves the failure to whichever module a caller happens to
load first); ``importlib.import_module`` / ``__import__`` with a constant name count too, and one whose name is
an f-string with a constant ``"pkg."`` prefix counts as an import of every module of that package. Imports
under ``if TYPE_CHECKING:`` never run and are skipped. Resolution: ``import a.b.c`` and ``from a.b.c import y``
point at module ``a.b.c``, or at ``a.b.c.y`` when ``y`` is a submodule; relative imports are resolved against
the importing module; a name that is not a module of ours (``a.b.c.attr``) points at its longest module
prefix.

How a package's ``__init__`` counts. A package is a node of its own whose edges are the imports of its
``__init__.py``, and a module points at it only when it imports the package itself (``import cdsjax.core``)
or a name the ``__init__`` defines or re-exports (``from cdsjax.core import cds``). Importing a
submodule (``from cdsjax.core.types import Affinity``) does not add an edge to the parent package, although
Python runs the parent's ``__init__`` first: that is package initialisation, not a dependency, and counting it
would put every submodule of a re-exporting package (``cdsjax.core``, whose ``__init__`` imports all of
``cdsjax.core.*``) into one meaningless cycle with its package. A submodule that reaches back to its package's
re-exports (``from cdsjax.core import X`` inside ``cdsjax/core/``) does close a real cycle, and is reported.

Two more checks read the same imports: ``cdsjax.core`` imports nothing but the standard library, jax, numpy,
flax and itself (also inside functions); and no module uses a ``_private`` name of a module in another package
(``from cdsjax.eval.runner import _x`` or ``runner._x`` from ``cdsjax.agents``), as LAYOUT.md asks.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "cdsjax"
# What cdsjax.core may import besides the standard library and itself (STYLE.md: pure JAX).
CORE_ALLOWED = ("jax", "jaxlib", "numpy", "flax")

Graph = Dict[str, Dict[str, List[int]]]  # module -> {imported module: [line numbers]}


def find_modules(package_dir: Path, package: str) -> Dict[str, Path]:
    """Module name -> file for every ``.py`` file under ``package_dir`` (``pkg/__init__.py`` -> ``pkg``)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` except the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _walk(other)
            continue
        yield child
        yield from _walk(child)


def _dynamic_name(call: ast.Call) -> Optional[Tuple[str, bool]]:
    """(name, is_prefix) of ``importlib.import_module(...)`` / ``__import__(...)``, when it can be read."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value, False
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = arg.values[0].value
        if isinstance(prefix, str) and prefix.endswith("."):
            return prefix, True
    return None


def raw_imports_of(node: ast.ImportFrom, module: str, is_package: bool) -> List[Tuple[str, str, int]]:
    """``(absolute source, name, line)`` of one ``from ... import ...`` statement."""
    package = module if is_package else module.rpartition(".")[0]
    if node.level:
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module
    return [(source, alias.name, node.lineno) for alias in node.names]


def raw_imports(path: Path, module: str, is_package: bool) -> List[Tuple[str, Optional[str], int]]:
    """``(module, name, line)`` for every import in a file: ``name`` is the imported name of a
    ``from module import name`` (None for ``import module``); relative imports made absolute; a dynamic
    import with a prefix gives ``(prefix, "*prefix", line)``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in _walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, None, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.extend(raw_imports_of(node, module, is_package))
        elif isinstance(node, ast.Call):
            dynamic = _dynamic_name(node)
            if dynamic is not None:
                name, is_prefix = dynamic
                out.append((name, "*prefix" if is_prefix else None, node.lineno))
    return out


def _longest_module(name: str, modules) -> Optional[str]:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def resolve(source: str, name: Optional[str], modules) -> List[str]:
    """The modules of ours that one import statement's name points at (see the module docstring)."""
    if name == "*prefix":
        return [m for m in modules if m.startswith(source)]
    if name is not None and name != "*" and f"{source}.{name}" in modules:
        return [f"{source}.{name}"]
    target = _longest_module(source, modules)
    return [target] if target is not None else []


def import_graph(package_dir: Path, package: str = PACKAGE) -> Graph:
    """The import graph of a package's modules (edges only between its own modules, no self-loops)."""
    modules = find_modules(package_dir, package)
    graph: Graph = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for source, name, line in raw_imports(path, module, path.name == "__init__.py"):
            for target in resolve(source, name, modules):
                if target != module:
                    edges.setdefault(target, []).append(line)
    return graph


def strongly_connected(graph: Graph) -> List[List[str]]:
    """Tarjan's strongly connected components with more than one module, each sorted, sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def shortest_cycle(graph: Graph, component: List[str]) -> List[str]:
    """A shortest cycle through the first module of a component, as ``[a, b, ..., a]``."""
    start, members = component[0], set(component)
    parents = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]  # v, its parent, ..., start
                    while parents[path[-1]] is not None:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if w in members and w not in parents:
                    parents[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")


def describe(graph: Graph, component: List[str], modules: Dict[str, Path], root: Path) -> str:
    """The modules of a component and a shortest cycle among them, with the import lines."""
    cycle = shortest_cycle(graph, component)
    steps = [f"{a} -> {b} ({modules[a].relative_to(root)}:{','.join(map(str, sorted(set(graph[a][b]))))})"
             for a, b in zip(cycle, cycle[1:])]
    return f"{len(component)} modules: {', '.join(component)}; e.g.\n      " + "\n      ".join(steps)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _package_of(module: str, modules: Dict[str, Path]) -> str:
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def private_uses(path: Path, module: str, modules: Dict[str, Path]) -> List[Tuple[int, str]]:
    """``(line, "module._name")`` for each private name of another package's module that a file imports
    (``from m import _name``) or reads through a module it imported (``import m as r; r._name``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _package_of(module, modules)
    is_package = path.name == "__init__.py"
    aliases: Dict[str, str] = {}  # local name -> module of ours
    out = []

    def foreign(target: str) -> bool:
        return _package_of(target, modules) != package

    for node in _walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = raw_imports_of(node, module, is_package)[0][0]
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                elif source in modules and _private(alias.name) and foreign(source):
                    out.append((node.lineno, f"{source}.{alias.name}"))
    for node in _walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and _private(node.attr) and foreign(aliases[node.value.id])):
            out.append((node.lineno, f"{aliases[node.value.id]}.{node.attr}"))
    return sorted(out)


# --------------------------------------------------------------------------- the walker itself


def _write(root: Path, files: Dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_walker_on_a_package_with_known_cycles(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "from pkg.core import thing\n",
        "pkg/core/__init__.py": "from pkg.core.a import f\nfrom pkg.core.b import g\n",
        # a -> b at module level, b -> a inside a function: a cycle
        "pkg/core/a.py": "from pkg.core import b\n",
        "pkg/core/b.py": "def g():\n    from .a import f\n    return f\n",
        # c imports a submodule and a sibling's name: no edge to the package, no cycle
        "pkg/core/c.py": "from pkg.core.types import T\nimport pkg.core.a as alias\n",
        "pkg/core/types.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.core.c import x\nT = 1\n",
        # d takes a name its package re-exports; the package does not import d: an edge, no cycle
        "pkg/core/d.py": "from pkg.core import f\n",
        "pkg/io/__init__.py": "",
        "pkg/io/x.py": "import importlib\ndef load(n):\n    return importlib.import_module(f'pkg.io.plugins.{n}')\n",
        "pkg/io/plugins/__init__.py": "",
        "pkg/io/plugins/p.py": "from pkg.io.x import load\nfrom pkg.io import nothing\n",
        "pkg/io/y.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.io import z\nelse:\n    z = None\n",
        "pkg/io/z.py": "from ..io import y\nimport pkg.io.y.attr\n",
    })
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.core.c"] == {"pkg.core.types": [1], "pkg.core.a": [2]}
    assert graph["pkg.core.types"] == {}, "TYPE_CHECKING imports are skipped"
    assert graph["pkg.core.d"] == {"pkg.core": [1]}, "a re-exported name points at the package"
    assert graph["pkg.core.b"] == {"pkg.core.a": [2]}, "function-level relative import"
    assert graph["pkg.io.x"] == {"pkg.io.plugins.p": [3]}, "f-string import_module"
    assert graph["pkg.io.plugins.p"] == {"pkg.io.x": [1], "pkg.io": [2]}
    assert graph["pkg.io.z"] == {"pkg.io.y": [1, 2]}
    assert graph["pkg.io.y"] == {}
    assert strongly_connected(graph) == [
        ["pkg.core.a", "pkg.core.b"],
        ["pkg.io.plugins.p", "pkg.io.x"],
    ]
    assert shortest_cycle(graph, ["pkg.core.a", "pkg.core.b"]) == ["pkg.core.a", "pkg.core.b", "pkg.core.a"]


def test_walker_reports_a_package_reaching_back_to_its_reexports(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/core/__init__.py": "from pkg.core.select import select\nfrom pkg.core.rank import top\n",
        "pkg/core/rank.py": "def top():\n    pass\n",
        "pkg/core/select.py": "from pkg.core import top\n",
    })
    graph = import_graph(pkg, "pkg")
    (component,) = strongly_connected(graph)
    assert component == ["pkg.core", "pkg.core.select"]
    assert shortest_cycle(graph, component) == ["pkg.core", "pkg.core.select", "pkg.core"]


def test_walker_finds_private_names_used_across_packages(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/eval/__init__.py": "",
        "pkg/eval/runner.py": "def _kind():\n    pass\n",
        "pkg/eval/report.py": "from pkg.eval.runner import _kind\n",  # same package: allowed
        "pkg/agents/__init__.py": "",
        "pkg/agents/a.py": "from pkg.eval import runner\nfrom pkg.eval.runner import _kind as k\n"
                           "def f():\n    return runner._kind(), runner.__name__\n",
        "pkg/agents/b.py": "import pkg.eval.runner as r\nx = r._kind\n",
    })
    modules = find_modules(pkg, "pkg")
    found = {m: private_uses(p, m, modules) for m, p in modules.items()}
    assert found["pkg.eval.report"] == []
    assert found["pkg.agents.a"] == [(2, "pkg.eval.runner._kind"), (4, "pkg.eval.runner._kind")]
    assert found["pkg.agents.b"] == [(2, "pkg.eval.runner._kind")]


# --------------------------------------------------------------------------- cdsjax


@pytest.fixture(scope="module")
def cdsjax_graph() -> Graph:
    return import_graph(ROOT / PACKAGE)


@pytest.mark.slow
def test_cdsjax_has_no_import_cycle(cdsjax_graph):
    assert "cdsjax.core.strategies.select" in cdsjax_graph and "cdsjax.io.index" in cdsjax_graph
    modules = find_modules(ROOT / PACKAGE, PACKAGE)
    cycles = [describe(cdsjax_graph, c, modules, ROOT) for c in strongly_connected(cdsjax_graph)]
    assert not cycles, "import cycles (module -> imported module (file:lines)):\n  - " + "\n  - ".join(cycles)


def test_core_imports_only_jax_numpy_flax_and_itself():
    """Static twin of test_core.py's run-time check: also sees imports inside functions."""
    modules = find_modules(ROOT / PACKAGE, PACKAGE)
    bad = []
    for module, path in modules.items():
        if module != "cdsjax.core" and not module.startswith("cdsjax.core."):
            continue
        for source, name, line in raw_imports(path, module, path.name == "__init__.py"):
            top = source.split(".")[0]
            ok = (top in sys.stdlib_module_names or top in CORE_ALLOWED
                  or source == "cdsjax.core" or source.startswith("cdsjax.core."))
            if not ok:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {source}")
    assert not bad, "cdsjax.core imports beyond jax/numpy/flax/stdlib:\n" + "\n".join(bad)


@pytest.mark.slow
def test_no_private_names_across_packages():
    """No module reaches for a ``_private`` name of a module in another package (LAYOUT.md's check)."""
    modules = find_modules(ROOT / PACKAGE, PACKAGE)
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}"
           for module, path in modules.items() for line, name in private_uses(path, module, modules)]
    assert not bad, "private names used from another package:\n" + "\n".join(bad)


# The layers of cdsjax, lowest first: a module may import only from its own layer's package or a lower layer
# (commands -> agents / integrations -> eval -> pipeline, the product layer -> learn -> io -> core). The product's
# defaults (cdsjax.defaults, and cdsjax.catalog's default selector: plain values, no imports) stand at the bottom:
# every layer may read them (``cdsjax tune``'s budget is the product's; the configuration's relevance is the
# product's), and nothing climbs back up to them.
LAYERS = {
    "defaults": -1,
    "core": 0, "config": 0, "cdsjax": 0, "memo": 0, "catalog": 0,
    "io": 1,
    "learn": 2, "demo": 2,
    "pipeline": 3,
    "eval": 4,
    "agents": 6, "integrations": 6,
    "commands": 7,
    "cli": 8,
}


def _part(module: str) -> str:
    """The part of cdsjax a module belongs to: its top-level module or package, or a submodule ranked apart in
    :data:`LAYERS`."""
    parts = module.split(".")
    if len(parts) > 2 and ".".join(parts[1:3]) in LAYERS:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_import_points_down_the_layers(cdsjax_graph):
    """No arrow runs back up (LAYOUT.md): in particular learn never imports eval (``cdsjax tune`` hands the
    evaluation's loader to the fit)."""
    unranked = sorted({_part(m) for m in cdsjax_graph} - set(LAYERS))
    assert not unranked, f"top-level parts of cdsjax without a layer in LAYERS: {unranked}"
    up = [f"{a} -> {b} (lines {lines})" for a, targets in cdsjax_graph.items() for b, lines in targets.items()
          if _part(a) != _part(b) and LAYERS[_part(a)] <= LAYERS[_part(b)]]
    assert not up, "imports that do not point down the layers:\n  - " + "\n  - ".join(sorted(up))

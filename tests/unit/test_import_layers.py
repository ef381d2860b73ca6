"""The package's import graph: no cycles, nothing but the console script reaches into the CLI,
and imports only go down the layers that docs/architecture.md documents (its table is read here,
so the doc and this test cannot drift apart)."""

from __future__ import annotations

import ast
import graphlib
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: Path) -> dict[str, Path]:
    """Every module of the package (the simulator included), by dotted name."""
    return {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """All nodes that run at import or call time: function bodies included, `if TYPE_CHECKING:` bodies not."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield child
        yield from _runtime_nodes(child)


def imported(source: str, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The package modules one module imports at run time (an imported module's parent packages too)."""
    found: set[str] = set()
    here = name.split(".") if is_package else name.split(".")[:-1]
    for node in _runtime_nodes(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
                mod = ".".join(parts[:i])
                if mod in known and mod != name and not name.startswith(mod + "."):
                    found.add(mod)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    mods = modules(package)
    known = set(mods)
    return {m: imported(p.read_text(), m, p.name == "__init__.py", known) for m, p in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def layer_table(text: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """(module prefix -> layer, layer -> layers it may import) from the `| Layer | Modules | May import |` table."""
    prefixes: dict[str, str] = {}
    may: dict[str, set[str]] = {}
    lines = text.splitlines()
    start = next(i for i, r in enumerate(lines) if re.match(r"\|\s*Layer\s*\|\s*Modules\s*\|\s*May import", r))
    for row in lines[start + 2 :]:
        if not row.startswith("|"):
            break  # the table ends at its first non-row line
        cells = [c.strip() for c in row.strip("|").split("|")]
        layer = cells[0].strip("*` ")
        for prefix in re.findall(r"`([\w.]+)`", cells[1]):
            prefixes[prefix] = layer
        may[layer] = set(re.findall(r"\w+", cells[2])) - {"nothing"}
    return prefixes, may


def layer_of(module: str, prefixes: dict[str, str]) -> str | None:
    """The layer of the longest matching prefix; a root package (no dot) matches only itself."""
    best = max((p for p in prefixes if module == p or ("." in p and module.startswith(p + "."))), key=len, default=None)
    return prefixes[best] if best else None


# -- the package ------------------------------------------------------------------------------------------


GRAPH = import_graph(PACKAGE)
PREFIXES, MAY_IMPORT = layer_table(ARCHITECTURE.read_text())


def test_the_graph_is_real() -> None:
    """Guards the guards: the walk sees the package's modules and their imports."""
    assert len(GRAPH) > 40
    assert "gateway.core.config" in GRAPH["gateway.app"]
    assert "gateway.components" in GRAPH["gateway.pipeline"]


def test_no_import_cycles() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_only_the_console_script_enters_the_cli() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for target in scripts.values():  # the one way in: the console script
        module = target.split(":")[0]
        assert module == "gateway.cli" or module.startswith("gateway.cli."), target
    # the package, and the bench and scripts beside it (tests may drive the CLI: that is what they test)
    graph = dict(GRAPH)
    for path in sorted([*(ROOT / "bench").glob("*.py"), *(ROOT / "scripts").glob("*.py")]):
        name = module_name(path, ROOT)
        graph[name] = imported(path.read_text(), name, False, set(GRAPH))
    assert any(graph[m] for m in graph if m.startswith("bench."))  # the walk does see bench's imports
    offenders = [
        f"{m} imports {t}"
        for m, deps in sorted(graph.items())
        if not (m == "gateway.cli" or m.startswith("gateway.cli."))
        for t in sorted(deps)
        if t == "gateway.cli" or t.startswith("gateway.cli.")
    ]
    assert not offenders, offenders


def test_every_module_has_a_layer() -> None:
    missing = [m for m in GRAPH if layer_of(m, PREFIXES) is None]
    assert not missing, f"add these to the layer table in docs/architecture.md: {missing}"


def test_the_layer_table_is_an_order() -> None:
    assert set(MAY_IMPORT) == set(PREFIXES.values())
    for layer, allowed in MAY_IMPORT.items():
        assert allowed <= set(MAY_IMPORT), (layer, allowed - set(MAY_IMPORT))
    assert find_cycle({k: v - {k} for k, v in MAY_IMPORT.items()}) is None


def test_imports_only_go_down() -> None:
    upward = []
    for module, deps in sorted(GRAPH.items()):
        mine = layer_of(module, PREFIXES)
        for dep in sorted(deps):
            theirs = layer_of(dep, PREFIXES)
            if theirs != mine and theirs not in MAY_IMPORT.get(mine or "", set()):
                upward.append(f"{module} ({mine}) imports {dep} ({theirs})")
    assert not upward, "imports against docs/architecture.md's layer table:\n" + "\n".join(upward)


# -- the checker itself can fail ----------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for rel, text in files.items():
        p = tmp_path / "pkg" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return import_graph(tmp_path / "pkg")


def test_checker_sees_function_level_imports_and_skips_type_checking(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
            "b.py": "def f():\n    from pkg import a\n",
            "c.py": "from . import a\nfrom .sub.d import x\n",
            "sub/__init__.py": "",
            "sub/d.py": "",
        },
    )
    assert graph["pkg.a"] == set()
    assert graph["pkg.b"] == {"pkg.a"}  # a module's own parent packages are not edges
    assert graph["pkg.c"] == {"pkg.a", "pkg.sub", "pkg.sub.d"}


def test_checker_finds_a_cycle(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import x\n",
            "b.py": "def f():\n    import pkg.c\n",
            "c.py": "import pkg.a\n",
        },
    )
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"pkg.a", "pkg.b", "pkg.c"}


def test_checker_reads_the_table() -> None:
    prefixes, may = layer_table(
        "| Layer | Modules | May import |\n|---|---|---|\n"
        "| core | `x.core` | nothing |\n| top | `x.top`, `x.app` | core |\n"
        "\n| a | b | c |\n|---|---|---|\n| x | y | z |\n"
    )
    assert prefixes == {"x.core": "core", "x.top": "top", "x.app": "top"}
    assert may == {"core": set(), "top": {"core"}}
    assert layer_of("x.top.deep", prefixes) == "top" and layer_of("y", prefixes) is None
    assert layer_of("x", {"x": "core"}) == "core" and layer_of("x.new", {"x": "core"}) is None

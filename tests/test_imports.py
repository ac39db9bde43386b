"""The package's import graph, read statically: no cycles, and dependencies run one way.

Every module under `src/kerneltune` is parsed with `ast`; each `import`, `from ... import ...`
and `importlib.import_module("...")` of a `kerneltune` module is an edge, wherever it stands (an
import inside a function only defers a cycle to the first call), except under
`if TYPE_CHECKING:`, which never runs. `from pkg import name` is an edge to `pkg.name` where that
is a module, else to `pkg` itself (whose `__init__` must run to provide the name). Importing a
submodule does run its parent packages' `__init__` too, but that is no edge: a package importing
its own submodules is a cycle only if one of them imports the package back.

The layering is DESIGN.md's: `kernels` (its private modules, such as the typed configs and the
launch descriptions, included), `table` and `resolution` (the one resolution rule, which the
runtime and the service share) at the bottom, importing nothing of the package but each other;
`runtime` and `storage` above them; `tuner` and `api` above those; `cli` on top.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = "kerneltune"
SRC = Path(__file__).resolve().parents[1] / "src" / ROOT


@dataclass(frozen=True)
class Edge:
    """`source` imports `target` at `path`:`line`."""

    source: str
    target: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({_shown(self.path)}:{self.line})"


def _shown(path: Path) -> Path:
    """`path` relative to the working directory where it lies under it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


Graph = dict[str, list[Edge]]


def module_files(package_dir: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every `.py` file under `package_dir`."""
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


class _Imports(ast.NodeVisitor):
    """(dotted name, imported names or None, line) of every import in a module, lazy ones too."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.found: list[tuple[str, tuple[str, ...] | None, int]] = []

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:  # the `else:` of `if TYPE_CHECKING:` does run
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((alias.name, None, node.lineno))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            if node.level > 1:
                base = base[: -(node.level - 1)]
            name = ".".join([*base, node.module] if node.module else base)
        else:
            name = node.module or ""
        self.found.append((name, tuple(a.name for a in node.names), node.lineno))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called in ("import_module", "__import__") and node.args:
            name = _literal_prefix(node.args[0])
            if name:
                self.found.append((name, None, node.lineno))
        self.generic_visit(node)


def _literal_prefix(arg: ast.expr) -> str | None:
    """The module a name argument surely names: the whole of a string literal, or the packages
    before the first placeholder of an f-string (`f"pkg.kernels.{name}"` -> `pkg.kernels`)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if (isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant)
            and isinstance(arg.values[0].value, str)):
        return arg.values[0].value.rpartition(".")[0] or None
    return None


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is one of `modules` (None outside the package)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph(package_dir: Path, package: str = ROOT) -> Graph:
    """Module -> its import edges to other modules of `package` (see the module docstring)."""
    modules = module_files(package_dir, package)
    graph: Graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        visitor = _Imports(module, path.name == "__init__.py")
        visitor.visit(tree)
        edges: dict[tuple[str, int], Edge] = {}
        for name, names, line in visitor.found:
            targets = []
            if names is None:
                targets.append(_known(name, modules))
            else:
                for imported in names:
                    sub = f"{name}.{imported}"
                    targets.append(sub if sub in modules else _known(name, modules))
            for target in targets:
                if target is not None:
                    edges.setdefault((target, line), Edge(module, target, path, line))
        graph[module] = list(edges.values())
    return graph


def strongly_connected(graph: Graph) -> list[list[str]]:
    """The components of `graph` with a cycle in them (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted({e.target for e in graph[root]})))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted({e.target for e in graph.get(nxt, [])}))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    self_loop = any(e.target == node for e in graph[node])
                    if len(component) > 1 or self_loop:
                        found.append(sorted(component))
    return found


def cycle_in(graph: Graph, component: list[str]) -> list[str]:
    """One shortest cycle through the first module of a component, as the modules along it."""
    members = set(component)
    start = component[0]
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted({e.target for e in graph[node]} & members):
                if target in came:
                    continue
                came[target] = node
                if target == start:
                    path = [start]
                    while path[0] != start or len(path) == 1:
                        path.insert(0, came[path[0]])
                    return path
                following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")  # pragma: no cover


def describe_cycles(graph: Graph) -> list[str]:
    """A readable account of each cycle: its modules, one loop through them, and every import
    among them (each lies on some loop) with its file and line."""
    accounts = []
    for component in strongly_connected(graph):
        members = set(component)
        lines = [f"cycle among {', '.join(component)}:",
                 f"  e.g. {' -> '.join(cycle_in(graph, component))}"]
        lines += [f"    {edge}" for module in component for edge in graph[module]
                  if edge.target in members]
        accounts.append("\n".join(lines))
    return accounts


def _in(module: str, layers: tuple[str, ...]) -> bool:
    return any(module == layer or module.startswith(layer + ".") for layer in layers)


def upward_imports(graph: Graph, lower: tuple[str, ...], upper: tuple[str, ...]) -> list[Edge]:
    """The edges from a module of `lower` to a module of `upper`."""
    return [edge for module, edges in sorted(graph.items()) if _in(module, lower)
            for edge in edges if _in(edge.target, upper)]


def imports_leaving(graph: Graph, layer: tuple[str, ...]) -> list[Edge]:
    """The edges from a module of `layer` to a module of the package outside it."""
    return [edge for module, edges in sorted(graph.items()) if _in(module, layer)
            for edge in edges if not _in(edge.target, layer)]


def _layer(*names: str) -> tuple[str, ...]:
    return tuple(f"{ROOT}.{name}" for name in names)


#: The bottom layer: it imports nothing of the package outside itself.
BOTTOM = _layer("kernels", "table", "resolution")

#: (modules, what they must not import), one rule per layer of DESIGN.md.
LAYERING = {
    "kernels, table and resolution sit at the bottom": (
        BOTTOM, _layer("runtime", "storage", "tuner", "api", "cli")),
    "runtime uses kernels and the table alone": (
        _layer("runtime"), _layer("storage", "tuner", "api", "cli")),
    "storage uses kernels and the table alone": (
        _layer("storage"), _layer("runtime", "tuner", "api", "cli")),
    "tuner does not use the service": (_layer("tuner"), _layer("api", "cli")),
    "api does not use the tuner": (_layer("api"), _layer("tuner", "cli")),
}


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(SRC)


def test_the_graph_covers_the_package(graph):
    assert f"{ROOT}.tuner.worker" in graph and f"{ROOT}.runtime.resolve" in graph
    assert any(e.target == f"{ROOT}.kernels" for e in graph[f"{ROOT}.tuner.job"])
    for module in ("kernels._config", "kernels._launch", "resolution"):
        assert f"{ROOT}.{module}" in graph and _in(f"{ROOT}.{module}", BOTTOM)


def test_no_import_cycles(graph):
    cycles = describe_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("rule", list(LAYERING))
def test_dependencies_run_one_way(graph, rule):
    lower, upper = LAYERING[rule]
    upward = upward_imports(graph, lower, upper)
    assert not upward, f"{rule}, but:\n" + "\n".join(f"    {edge}" for edge in upward)


def test_the_bottom_layer_imports_only_itself(graph):
    """Not even the package's helpers (`env`, the package itself): model code that imports the
    kernels or the resolution rule pays for nothing else."""
    leaving = imports_leaving(graph, BOTTOM)
    assert not leaving, "the bottom layer imports from above it:\n" + "\n".join(
        f"    {edge}" for edge in leaving)


# ------------------------------------------------------------- the checks against planted faults


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package `pkg` under tmp_path made of `files` (path inside it -> source)."""
    root = tmp_path / "pkg"
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def test_a_planted_cycle_is_found(tmp_path):
    root = plant(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "def f():\n    from . import c\n",  # lazy, relative
        "c.py": "import pkg.a\n",
        "d.py": "from pkg.a import name\n",  # outside the cycle
    })
    graph = import_graph(root, "pkg")
    assert strongly_connected(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    (account,) = describe_cycles(graph)
    assert account.splitlines()[0] == "cycle among pkg.a, pkg.b, pkg.c:"
    assert f"pkg.b -> pkg.c ({root / 'b.py'}:2)" in account
    assert f"pkg.c -> pkg.a ({root / 'c.py'}:1)" in account


def test_a_package_and_its_submodules(tmp_path):
    files = {
        "__init__.py": "from pkg.sub import run\n",
        "sub/__init__.py": "from .impl import run\n",
        "sub/impl.py": "from pkg.sub import helpers\nfrom ..util import x\n",
        "sub/helpers.py": "",
        "util.py": "",
    }
    graph = import_graph(plant(tmp_path, files), "pkg")
    assert strongly_connected(graph) == []  # the packages import down into their submodules
    assert {e.target for e in graph["pkg.sub.impl"]} == {"pkg.sub.helpers", "pkg.util"}

    # A sibling's name taken through the package runs the package's __init__ first: a cycle.
    files["sub/impl.py"] = "from pkg.sub import helpers, run\n"
    graph = import_graph(plant(tmp_path, files), "pkg")
    assert strongly_connected(graph) == [["pkg.sub", "pkg.sub.impl"]]


def test_type_checking_imports_are_not_edges_and_import_module_is(tmp_path):
    root = plant(tmp_path, {
        "__init__.py": "",
        "a.py": "import pkg.b\n",
        "b.py": ("from typing import TYPE_CHECKING\nimport typing\n"
                 "if TYPE_CHECKING:\n    from pkg import a\n"
                 "if typing.TYPE_CHECKING:\n    import pkg.a\nelse:\n    import pkg.c\n"),
        "c.py": "import importlib\nimportlib.import_module('pkg.a')\n",
        "d.py": "from importlib import import_module\ndef f(x):\n    import_module(f'pkg.{x}')\n",
    })
    graph = import_graph(root, "pkg")
    assert [e.target for e in graph["pkg.b"]] == ["pkg.c"]
    assert [(e.target, e.line) for e in graph["pkg.d"]] == [("pkg", 3)]
    assert strongly_connected(graph) == [["pkg.a", "pkg.b", "pkg.c"]]  # through the else branch


def test_an_upward_import_is_found(tmp_path):
    root = plant(tmp_path, {
        "__init__.py": "",
        "kernels/__init__.py": "",
        "kernels/spec.py": "def f():\n    from pkg.tuner.job import Job\n",
        "tuner/__init__.py": "",
        "tuner/job.py": "from pkg.kernels import spec\n",
    })
    graph = import_graph(root, "pkg")
    (edge,) = upward_imports(graph, ("pkg.kernels",), ("pkg.tuner",))
    assert (edge.source, edge.target, edge.line) == ("pkg.kernels.spec", "pkg.tuner.job", 2)
    assert upward_imports(graph, ("pkg.tuner",), ("pkg.kernels.spec.x",)) == []


def test_an_import_leaving_a_layer_is_found(tmp_path):
    root = plant(tmp_path, {
        "__init__.py": "from pkg import env\n",
        "env.py": "",
        "kernels/__init__.py": "from pkg.kernels import _config\n",
        "kernels/_config.py": "from pkg.table import Value\n",
        "table.py": "",
        "resolution.py": "from pkg.kernels import spec\nfrom pkg import env\n",
    })
    graph = import_graph(root, "pkg")
    bottom = ("pkg.kernels", "pkg.table", "pkg.resolution")
    (edge,) = imports_leaving(graph, bottom)
    assert (edge.source, edge.target, edge.line) == ("pkg.resolution", "pkg.env", 2)
    assert imports_leaving(graph, ("pkg.kernels", "pkg.table")) == []

"""The package's import graph: no cycles, the lower rooms never reach up, and runtime/'s
wings import only the wings below them.

The graph is read from the source with ``ast``, so nothing is imported and every module is
seen, optional dependencies or not. An edge is any import of another ``parityserve`` module,
of three kinds, all counted and each named in a failure:

- ``module``: at module level (inside a module-level ``try``/``if`` too); it runs on import.
- ``TYPE_CHECKING``: never runs, but it is still a dependency. Hiding a cycle there is how
  ``runtime/modelpath/dispatch.py`` <-> ``runtime/coding.py`` once came to put ``Any`` on the task
  links (that pair is now the driver and ``core/scheduling``, which never imports the runtime).
- ``function``: a lazy import inside a function. It defers an optional or heavy module
  (torch, the bench commands) until it is used; a lazy import that closes a cycle would
  only hide the cycle, so it counts too.

``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
Parent packages that Python imports on the way are not edges: ``models/__init__`` imports
``models.base``, so counting them would make every package a cycle with its modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import parityserve

Graph = dict[str, dict[str, str]]  # module -> {imported module: kind of import}
_KINDS = ("module", "TYPE_CHECKING", "function")

# room -> rooms it must never import, lazily or not: a decision or a model never knows how it
# is served, benchmarked or started.
FORBIDDEN = {
    "parityserve.core": ("parityserve.runtime", "parityserve.bench", "parityserve.cli",
                         "parityserve.demo"),
    "parityserve.models": ("parityserve.runtime", "parityserve.bench", "parityserve.cli",
                           "parityserve.demo"),
}


def module_files(package_dir: Path) -> dict[str, Path]:
    """Every module under ``package_dir``, by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def import_graph(package_dir: Path) -> Graph:
    modules = module_files(package_dir)
    graph: Graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: dict[str, str] = {}
        for target, kind in _imports(ast.parse(path.read_text()), name, is_package, modules):
            if target in modules and target != name:
                # The module-level import wins when a module imports another in two ways.
                edges[target] = min(kind, edges.get(target, kind), key=_KINDS.index)
        graph[name] = edges
    return graph


def _imports(tree: ast.AST, module: str, is_package: bool,
             modules: Mapping[str, Path], kind: str = "module") -> Iterator[tuple[str, str]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, kind) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                yield (child if child in modules else base), kind
        else:
            yield from _imports(node, module, is_package, modules, _kind_inside(node, kind))


def _kind_inside(node: ast.AST, kind: str) -> str:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return "function"
    if (kind == "module" and isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test)):
        return "TYPE_CHECKING"
    return kind


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def cycles(graph: Graph) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = {stack.pop()}
            while node not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def describe(graph: Graph, component: frozenset[str]) -> str:
    """One loop through ``component``, each edge with its kind: ``a -(module)-> b -> ... a``."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth-first, inside the component, until a path returns to start
        node = frontier.pop(0)
        for target in sorted(graph[node]):
            if target == start:
                loop = paths[node]
                steps = zip(loop, [*loop[1:], start], strict=True)
                return "".join(f"{a} -({graph[a][b]})-> " for a, b in steps) + start
            if target in component and target not in paths:
                paths[target] = [*paths[node], target]
                frontier.append(target)
    raise AssertionError(f"{sorted(component)} is not a cycle")


PACKAGE = import_graph(Path(parityserve.__file__).parent)
_FILES = module_files(Path(parityserve.__file__).parent)


def test_the_walker_sees_every_kind_of_import():
    assert len(PACKAGE) > 50
    assert PACKAGE["parityserve.runtime.frontend.v2"]["parityserve.datatypes"] == "module"
    assert PACKAGE["parityserve.models.zoo"]["parityserve.models.nets"] == "TYPE_CHECKING"
    assert PACKAGE["parityserve.models.loader"]["parityserve.models._python"] == "function"
    # ``from parityserve.models import datasets`` names a module, not the package.
    assert "parityserve.models.datasets" in PACKAGE["parityserve.training.data"]


def test_relative_imports_and_packages(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import a\n")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("from .. import a\nfrom ..a import thing\n")
    (package / "c.py").write_text("def f():\n    from pkg.sub import b\n")
    graph = import_graph(package)
    assert graph == {"pkg": {"pkg.a": "module"}, "pkg.a": {"pkg.sub.b": "module"},
                     "pkg.sub": {}, "pkg.sub.b": {"pkg.a": "module"},
                     "pkg.c": {"pkg.sub.b": "function"}}
    assert cycles(graph) == [frozenset({"pkg.a", "pkg.sub.b"})]
    assert describe(graph, cycles(graph)[0]) == "pkg.a -(module)-> pkg.sub.b -(module)-> pkg.a"


def test_cycles_finds_every_loop_and_only_loops():
    graph: Graph = {"a": {"b": "module"}, "b": {"c": "function"}, "c": {"a": "TYPE_CHECKING"},
                    "d": {"a": "module", "e": "module"}, "e": {"d": "module"}, "f": {}}
    assert sorted(map(sorted, cycles(graph))) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": {"b": "module"}, "b": {}}) == []


def test_no_import_cycles():
    found = list(cycles(PACKAGE))
    assert not found, "import cycles:\n" + "\n".join(describe(PACKAGE, c) for c in found)


def test_lower_rooms_never_reach_up():
    reaches = [f"{module} -({kind})-> {target}"
               for module, edges in PACKAGE.items() for target, kind in edges.items()
               for room, above in FORBIDDEN.items()
               if _inside(module, room) and any(_inside(target, up) for up in above)]
    assert not reaches, "lower rooms import upper ones:\n" + "\n".join(reaches)


def _inside(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


# --- runtime/ in wings along the request path (issue 40) -----------------------------------

# Top to bottom: a wing may import only the wings after it here. runtime/server.py, above them
# all, is the one module that wires them; each wing's __init__ says what lives there.
RUNTIME = "parityserve.runtime"
WINGS = ("cluster", "frontend", "serving", "graphs", "fleet", "modelpath", "workers")
RUNTIME_TOP = {RUNTIME, f"{RUNTIME}.server"}


def wing_of(module: str) -> str | None:
    """The wing ``module`` lives in, ``None`` outside runtime/ or in its top (server.py)."""
    parts = module.split(".")
    if parts[:2] != RUNTIME.split(".") or len(parts) < 3 or module in RUNTIME_TOP:
        return None
    return parts[2]


def wing_violations(graph: Graph, wings: tuple[str, ...] = WINGS) -> list[str]:
    """``module -(kind)-> target  [wing -> wing]`` for each import of a wing that is not below
    the importer's, of runtime/server.py from a wing, and of a wing not in ``wings``."""
    found = []
    for module, edges in sorted(graph.items()):
        here = wing_of(module)
        if here is None:
            continue
        for target, kind in sorted(edges.items()):
            there = wing_of(target)
            if there == here or (there is None and target not in RUNTIME_TOP):
                continue
            below = here in wings and there in wings and wings.index(there) > wings.index(here)
            if not below:
                found.append(f"{module} -({kind})-> {target}  [{here} -> {there or 'server'}]")
    return found


def test_runtime_holds_only_its_wings_and_the_server():
    top = {m for m in PACKAGE if _inside(m, RUNTIME) and wing_of(m) is None}
    assert top == RUNTIME_TOP, f"{sorted(top - RUNTIME_TOP)} sit in runtime/ outside a wing"
    present = {wing_of(m) for m in PACKAGE if wing_of(m) is not None}
    assert present == set(WINGS), (f"wings not in WINGS: {sorted(present - set(WINGS))}; "
                                   f"in WINGS but gone: {sorted(set(WINGS) - present)}")


def test_each_wing_says_what_lives_there_and_what_it_may_import():
    for wing in WINGS:
        doc = ast.get_docstring(ast.parse(_FILES[f"{RUNTIME}.{wing}"].read_text()))
        assert doc and "import" in doc, f"runtime/{wing}/__init__.py needs a docstring"
        below = WINGS[WINGS.index(wing) + 1:]
        assert all(f"``{w}``" in doc for w in below), (
            f"runtime/{wing}/__init__.py should name the wings it may import: {below}")


def test_each_wing_imports_only_the_wings_below_it():
    found = wing_violations(PACKAGE)
    assert not found, (f"a wing imports one that is not below it (top to bottom: "
                       f"{', '.join(WINGS)}):\n" + "\n".join(found))


def test_the_wing_check_names_each_offending_import():
    graph: Graph = {
        "parityserve.runtime.server": {"parityserve.runtime.cluster.a": "module"},
        "parityserve.runtime.top.a": {"parityserve.runtime.bottom.b": "module",
                                      "parityserve.runtime.top.c": "module",
                                      "parityserve.errors": "module"},
        "parityserve.runtime.bottom.b": {"parityserve.runtime.top.c": "function",
                                         "parityserve.runtime.server": "TYPE_CHECKING",
                                         "parityserve.runtime.stray.d": "module"},
    }
    assert wing_violations(graph, ("top", "bottom")) == [
        "parityserve.runtime.bottom.b -(TYPE_CHECKING)-> parityserve.runtime.server"
        "  [bottom -> server]",
        "parityserve.runtime.bottom.b -(module)-> parityserve.runtime.stray.d  [bottom -> stray]",
        "parityserve.runtime.bottom.b -(function)-> parityserve.runtime.top.c  [bottom -> top]",
    ]


# --- the lab stays out of the package (issue 40) -------------------------------------------

# What a user runs ships in the wheel: ``bench load``, ``bench overhead``, ``profile`` and
# ``demo``, and what they import. Experiment servers and helpers live in benchmarks/.
USER_BENCH = {f"parityserve.bench{suffix}" for suffix in (
    "", ".load", ".overhead", ".profiler",  # the commands
    ".loadgen", ".probe", ".stats", ".serverproc", ".ports", ".report", ".extra",
    ".baseline_app", ".floor_app",  # bench overhead's comparison systems, run by module name
)}



def lab_imports(package_dir: Path, lab: str = "benchmarks") -> list[str]:
    """``module:line -> name`` for every import of ``lab`` (or a module in it) in the package,
    at any depth; relative imports stay inside the package, so only absolute ones count."""
    found = []
    for name, path in module_files(package_dir).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            found += [f"{name}:{node.lineno} -> {t}" for t in targets
                      if t == lab or t.startswith(lab + ".")]
    return found


def test_the_lab_walker_finds_imports_of_benchmarks(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("import benchmarks.tail\nimport benchmarks_not\n")
    (package / "b.py").write_text("def f():\n    from benchmarks import report\n"
                                  "from . import benchmarks\n")
    assert lab_imports(package) == ["pkg.a:1 -> benchmarks.tail", "pkg.b:2 -> benchmarks"]


def test_the_package_never_imports_the_lab():
    found = lab_imports(Path(parityserve.__file__).parent)
    assert not found, ("parityserve imports benchmarks/, which the wheel does not ship:\n"
                       + "\n".join(found))


def test_the_wheel_ships_no_lab_module():
    shipped = {m for m in PACKAGE if _inside(m, "parityserve.bench")}
    assert shipped <= USER_BENCH, (
        f"{sorted(shipped - USER_BENCH)} in parityserve/bench/: a module only experiments use "
        "belongs in benchmarks/; one a command needs goes in USER_BENCH, with why")
    assert shipped == USER_BENCH, f"USER_BENCH names modules that are gone: " \
                                  f"{sorted(USER_BENCH - shipped)}"


def test_every_shipped_bench_module_serves_a_command():
    """USER_BENCH holds no lab module in disguise: each is imported, at any depth, from the
    CLI (which starts the commands and the demo), or started by name by a module that is."""
    reached: set[str] = set()
    frontier = ["parityserve.cli"]
    while frontier:
        module = frontier.pop()
        if module in reached:
            continue
        reached.add(module)
        frontier += [*PACKAGE[module], *_started_by_name(module)]
    unused = sorted(m for m in USER_BENCH - reached if m != "parityserve.bench")
    assert not unused, f"{unused} serve no parityserve command: move them to benchmarks/"


def _started_by_name(module: str) -> list[str]:
    """Package modules named in a string constant of ``module`` (``python -m NAME``)."""
    tree = ast.parse(_FILES[module].read_text())
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value in PACKAGE]

"""Find import cycles among the modules of the ``spade_jax`` package.

Reads every ``spade_jax/**/*.py`` with ``ast`` (imports nothing of the package) and builds
the graph "module A imports module B" from every ``import spade_jax...`` and
``from spade_jax... import ...`` (absolute or relative) anywhere in the file: at module
level and inside functions and classes. A function-level import does not fail at import
time, but a cycle through one still ties the two modules together, so it counts too.
Imports under ``if TYPE_CHECKING:`` never run and are left out.

``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
The implicit import of a module's parent packages is not an edge.

Every strongly connected component of more than one module is a cycle; each is printed
with a shortest cycle through it and the import statements (file:line) that make it up.

The same graph, collapsed to packages (``spade_jax.X`` for a subpackage or a top-level
module; every ``__main__`` module and the top-level entry modules count as entry points),
must have no cycle either, and every import must follow `LAYERS`: a package imports only
packages of its own layer or of layers below it. A package in no layer is reported too.

`JOINED_ONLY_BY` names the packages that only one part of the rest may import: the related
systems (other papers' methods, `spade_jax.related`) are imported only by the side-system
registry (`spade_jax.selfplay.components`), so no other module of SPADE depends on them.

    python tools/import_cycles.py            # exit status 1 when there is a cycle or a layer is crossed
    python tools/import_cycles.py --root DIR # DIR holds the spade_jax/ package
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import pathlib
import sys

PACKAGE = "spade_jax"
# Lowest first. Entry points (command lines) sit on top; nothing imports them.
LAYERS = (
    ("base", ("spade_jax", "spade_jax.seeds", "spade_jax.progress", "spade_jax.jsonable", "spade_jax.compile_cache",
              "spade_jax.text")),
    ("core", ("spade_jax.models", "spade_jax.sampling", "spade_jax.rl", "spade_jax.sandbox", "spade_jax.admission",
              "spade_jax.envs")),
    ("roles", ("spade_jax.agent", "spade_jax.designer")),
    ("systems", ("spade_jax.evals", "spade_jax.bootstrap")),
    ("related", ("spade_jax.related",)),
    ("run", ("spade_jax.selfplay",)),
    ("entry", ("spade_jax.main", "spade_jax.cli", "spade_jax.demo", "spade_jax.export", "spade_jax.serve",
               "spade_jax.envpack")),
)
# package -> the only modules outside it that may import it (that module and the ones under it).
JOINED_ONLY_BY = {"spade_jax.related": "spade_jax.selfplay.components"}


@dataclasses.dataclass(frozen=True)
class Edge:
    """One import statement: ``source`` imports ``target`` at ``path:line``."""

    source: str
    target: str
    path: str
    line: int
    function_level: bool


def module_names(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every ``.py`` of the package under ``root``."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _known(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    """``name`` or its longest prefix that is a module of the package, or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, path: str, modules: dict[str, pathlib.Path]):
        self.module, self.is_package, self.path, self.modules = module, is_package, path, modules
        self.depth = 0  # > 0 inside a function body
        self.edges: list[Edge] = []

    def _add(self, target: str | None, node: ast.stmt) -> None:
        if target is not None and target != self.module:
            self.edges.append(Edge(self.module, target, self.path, node.lineno, self.depth > 0))

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def _visit_function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                self._add(_known(alias.name, self.modules), node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            package = self.module.split(".")
            if not self.is_package:
                package = package[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if not (base == PACKAGE or base.startswith(PACKAGE + ".")):
            return
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            self._add(sub if sub in self.modules else _known(base, self.modules), node)


def import_graph(root: pathlib.Path) -> tuple[list[str], list[Edge]]:
    """The package's modules and every import edge between them."""
    modules = module_names(root)
    edges = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        visitor = _Imports(module, path.name == "__init__.py", str(path.relative_to(root)), modules)
        visitor.visit(tree)
        edges.extend(visitor.edges)
    return list(modules), edges


def strongly_connected(nodes: list[str], edges: list[Edge]) -> list[list[str]]:
    """Tarjan's components (iterative), each sorted; only those of more than one node."""
    succ = collections.defaultdict(list)
    for edge in edges:
        succ[edge.source].append(edge.target)
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            child = next(it, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(succ[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return sorted(out)


def shortest_cycle(component: list[str], edges: list[Edge]) -> list[str]:
    """A shortest cycle through the component's first module, as [m0, m1, ..., m0]."""
    members = set(component)
    succ = collections.defaultdict(set)
    for edge in edges:
        if edge.source in members and edge.target in members:
            succ[edge.source].add(edge.target)
    start = component[0]
    previous = {}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(succ[node]):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return path[::-1] + [start]
            if child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"{component} is not a cycle")


def package_of(module: str) -> str:
    """The package-level unit of ``module``: ``spade_jax.X``, or the module itself for a ``__main__``."""
    return module if module.endswith(".__main__") else ".".join(module.split(".")[:2])


def layer_of(unit: str) -> int | None:
    """The index in `LAYERS` of a package-level unit (entry points for every ``__main__``)."""
    if unit.endswith(".__main__"):
        return len(LAYERS) - 1
    return next((i for i, (_, units) in enumerate(LAYERS) if unit in units), None)


def package_edges(edges: list[Edge]) -> list[Edge]:
    """The import edges between different package-level units."""
    return [dataclasses.replace(e, source=package_of(e.source), target=package_of(e.target)) for e in edges
            if package_of(e.source) != package_of(e.target)]


def layer_violations(units: list[str], edges: list[Edge]) -> tuple[list[str], list[Edge]]:
    """Units in no layer, and package edges that import from a higher layer."""
    unplaced = sorted(u for u in units if layer_of(u) is None)
    upward = [e for e in edges if None not in (layer_of(e.source), layer_of(e.target))
              and layer_of(e.target) > layer_of(e.source)]
    return unplaced, upward


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def outside_joins(edges: list[Edge]) -> list[tuple[Edge, str]]:
    """Module imports of a `JOINED_ONLY_BY` package from outside it and outside its joining
    modules, each with the modules that may import it."""
    return [(e, joiner) for e in edges for package, joiner in JOINED_ONLY_BY.items()
            if _within(e.target, package) and not _within(e.source, package) and not _within(e.source, joiner)]


def _print_cycles(cycles: list[list[str]], edges: list[Edge], kind: str) -> None:
    for n, component in enumerate(cycles, 1):
        print(f"{kind} cycle {n}: {len(component)} {kind}s: {', '.join(component)}")
        print("  e.g. " + " -> ".join(shortest_cycle(component, edges)))
        members = set(component)
        for edge in sorted(edges, key=lambda e: (e.path, e.line)):
            if edge.source in members and edge.target in members:
                where = "in a function" if edge.function_level else "module level"
                print(f"  {edge.path}:{edge.line} ({where}): {edge.source} -> {edge.target}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[1],
                        help="the directory that holds the spade_jax/ package (default: this repository)")
    args = parser.parse_args(argv)
    nodes, edges = import_graph(args.root)
    cycles = strongly_connected(nodes, edges)
    units = sorted({package_of(n) for n in nodes})
    pedges = package_edges(edges)
    package_cycles = strongly_connected(units, pedges)
    unplaced, upward = layer_violations(units, pedges)
    joins = outside_joins(edges)
    if cycles:
        _print_cycles(cycles, edges, "module")
        print(f"{len(cycles)} import cycle(s) among the {len(nodes)} modules of {PACKAGE}")
    else:
        print(f"no import cycles among the {len(nodes)} modules of {PACKAGE}")
    if package_cycles:
        _print_cycles(package_cycles, pedges, "package")
        print(f"{len(package_cycles)} package-level cycle(s) among the {len(units)} packages of {PACKAGE}")
    else:
        print(f"no package-level cycles among the {len(units)} packages and entry points of {PACKAGE}")
    for unit in unplaced:
        print(f"{unit} is in no layer: add it to LAYERS in tools/import_cycles.py")
    for edge in sorted(upward, key=lambda e: (e.path, e.line)):
        print(f"layer crossed: {edge.path}:{edge.line}: {edge.source} ({LAYERS[layer_of(edge.source)][0]}) imports "
              f"{edge.target} ({LAYERS[layer_of(edge.target)][0]})")
    if not (unplaced or upward):
        print("every import follows the layers: " + " -> ".join(name for name, _ in LAYERS))
    for edge, joiner in sorted(joins, key=lambda j: (j[0].path, j[0].line)):
        print(f"joined outside {joiner}: {edge.path}:{edge.line}: {edge.source} imports {edge.target}")
    if not joins:
        print("; ".join(f"{package} is imported only by {joiner}" for package, joiner in JOINED_ONLY_BY.items()))
    return 1 if cycles or package_cycles or unplaced or upward or joins else 0


if __name__ == "__main__":
    sys.exit(main())

"""The package's import structure: no import circles among ``accelgen`` modules, and layers that
point one way (workloads -> policies -> (sim | vllm_integration) -> results -> pipeline).

The graph is read from the source with ``ast``: every ``import`` / ``from ... import`` of an
``accelgen`` module, at module level and inside functions alike (a function-local import only
postpones a circle to the first call, it does not remove it), except those under
``if TYPE_CHECKING:`` (annotations only, never executed).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "accelgen"

# package -> packages it must never import. sim and vllm_integration are the two backends (they
# write through results, which imports neither); pipeline and profiling sit on top of both.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "workloads": ("policies", "sim", "vllm_integration", "results", "pipeline", "profiling"),
    "policies": ("sim", "vllm_integration", "results", "pipeline", "profiling"),
    "results": ("sim", "vllm_integration", "pipeline", "profiling"),
    "sim": ("vllm_integration", "pipeline", "profiling"),
    "vllm_integration": ("sim", "pipeline", "profiling"),
    # The HTTP benchmark client: a backend of its own (through results), never the others.
    "serving": ("sim", "pipeline", "profiling"),
    # Regime `engine` drives both backends, like the fidelity stage; the pipeline sits on it.
    "engine_regime": ("pipeline", "profiling"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The accelgen modules ``module`` imports (``from pkg import submodule`` counts as the
    submodule, ``from pkg import name`` as ``pkg``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - (node.level - is_package)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in known else source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in known and m != module}


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    return {m: _imports(ast.parse(p.read_text(), str(p)), m, p.name == "__init__.py", known)
            for m, p in files.items()}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = set()
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.add(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(frozenset(comp))
    return out


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [frozenset({"a", "b", "c"})]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_function_local_imports_but_not_type_checking_ones() -> None:
    graph = import_graph()
    # accelgen.cli imports its commands lazily, inside a function, by string: not an import.
    assert "accelgen.sim.runner" in graph["accelgen.cli.simulate"]  # function-local
    assert "accelgen.results" in graph["accelgen.sim.runner"]  # module level
    # core/policy.py imports Request and CostModel only for annotations.
    assert "accelgen.core.request" not in graph["accelgen.core.policy"]


def test_no_import_circles() -> None:
    found = circles(import_graph())
    assert not found, f"import circles: {[sorted(c) for c in found]}"


def test_layers_point_one_way() -> None:
    def package(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else ""

    bad = sorted(f"{m} imports {d}" for m, deps in import_graph().items() for d in deps
                 if package(d) in FORBIDDEN.get(package(m), ()))
    assert not bad, "\n".join(bad)

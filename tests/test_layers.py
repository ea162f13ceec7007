"""The package's import structure: no import circles among ``accelgen`` modules or among its
packages, and layers that point one way (a package imports only those to its left):

    core, costmodel, workloads, policies, (sim | vllm_integration), then experiments,
    engine_regime, fidelity, serving, profiling, then pipeline, then cli

where both backends write through ``results`` (which imports only ``core``), and ``figures``
(plotting helpers) imports no backend, experiment or pipeline.

``core`` (the request, the KV block manager, the batch shape and pivot, the policy interface, the
deployment and run specs) imports nothing of ``accelgen`` above it; only ``cli`` parses options,
and nothing else imports it.

The graph is read from the source with ``ast``: every ``import`` / ``from ... import`` of an
``accelgen`` module, at module level and inside functions alike (a function-local import only
postpones a circle to the first call, it does not remove it), except those under
``if TYPE_CHECKING:`` (annotations only, never executed). A package is the first name below
``accelgen`` (``accelgen.results`` is the package ``results``; ``accelgen`` itself, which holds
only the version, is ``accelgen``).
"""

from __future__ import annotations

import ast
import functools
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "accelgen"

# Everything above the cost models and the workloads: what they, and core, never import.
ABOVE_WORKLOADS = ("policies", "sim", "vllm_integration", "results", "experiments", "engine_regime",
                   "fidelity", "serving", "profiling", "pipeline", "figures", "cli")
# package -> packages it must never import (and no package but cli imports cli: see
# ``wrong_way_imports``). sim and vllm_integration are the two backends (they write through
# results, which imports neither); experiments, pipeline and profiling sit on top of both.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "core": ("accelgen", "costmodel", "workloads", "metrics", *ABOVE_WORKLOADS),
    # workloads may ask a cost model for isolated latencies (SLOs); the cost model never asks
    # for a workload.
    "costmodel": ("workloads", "metrics", *ABOVE_WORKLOADS),
    "workloads": ABOVE_WORKLOADS,
    "metrics": ABOVE_WORKLOADS,
    "policies": ("sim", "vllm_integration", "results", "experiments", "engine_regime", "fidelity",
                 "serving", "profiling", "pipeline", "figures"),
    "results": ("policies", "sim", "vllm_integration", "experiments", "engine_regime", "fidelity",
                "serving", "profiling", "pipeline", "figures"),
    "sim": ("vllm_integration", "experiments", "engine_regime", "fidelity", "serving", "profiling",
            "pipeline", "figures"),
    "vllm_integration": ("sim", "experiments", "engine_regime", "fidelity", "profiling",
                         "pipeline", "figures"),
    # Experiments run the simulator many times (the Oracle's schedule search).
    "experiments": ("vllm_integration", "engine_regime", "fidelity", "serving", "profiling",
                    "pipeline", "figures"),
    # The HTTP benchmark client: a backend of its own (through results), never the others.
    "serving": ("sim", "experiments", "engine_regime", "fidelity", "profiling", "pipeline",
                "figures"),
    # Regime `engine` drives both backends, like the fidelity stage; the pipeline sits on it.
    "engine_regime": ("experiments", "profiling", "pipeline", "figures"),
    "fidelity": ("experiments", "engine_regime", "profiling", "pipeline", "figures"),
    "profiling": ("sim", "experiments", "engine_regime", "fidelity", "pipeline", "figures"),
    # Plotting helpers: the notebooks load CSVs and call them; they run nothing.
    "figures": ("policies", "sim", "vllm_integration", "experiments", "engine_regime", "fidelity",
                "serving", "profiling", "pipeline"),
}
ONLY_CLI_IMPORTS = "cli"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
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


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the accelgen modules it imports, for the package at ``root``."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
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


@functools.cache
def package_import_graph() -> dict[str, set[str]]:
    """The import graph of this checkout's package, read once per test session."""
    return import_graph()


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the other packages its modules import."""
    out: dict[str, set[str]] = {package(m): set() for m in graph}
    for m, deps in graph.items():
        out[package(m)].update(package(d) for d in deps if package(d) != package(m))
    return out


def wrong_way_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import against the layers, as ``"module imports module"``."""
    return sorted(f"{m} imports {d}" for m, deps in graph.items() for d in deps
                  if package(d) in FORBIDDEN.get(package(m), ())
                  or (package(d) == ONLY_CLI_IMPORTS != package(m)))


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [frozenset({"a", "b", "c"})]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_function_local_imports_but_not_type_checking_ones() -> None:
    graph = package_import_graph()
    # accelgen.cli imports its commands lazily, inside a function, by string: not an import.
    assert "accelgen.sim.runner" in graph["accelgen.cli.simulate"]  # function-local
    assert "accelgen.results" in graph["accelgen.sim.runner"]  # module level
    # core/policy.py imports Request and CostModel only for annotations.
    assert "accelgen.core.request" not in graph["accelgen.core.policy"]
    assert "accelgen.costmodel.base" not in graph["accelgen.core.policy"]


def test_the_rules_name_packages_that_exist() -> None:
    """A renamed package would leave its rules checking nothing."""
    packages = set(package_graph(package_import_graph()))
    named = set(FORBIDDEN) | {p for deps in FORBIDDEN.values() for p in deps} | {ONLY_CLI_IMPORTS}
    assert named <= packages, sorted(named - packages)


def test_no_import_circles() -> None:
    found = circles(package_import_graph())
    assert not found, f"import circles: {[sorted(c) for c in found]}"


def test_no_package_circles() -> None:
    """No two packages import each other, even through modules that do not form a circle."""
    found = circles(package_graph(package_import_graph()))
    assert not found, f"package circles: {[sorted(c) for c in found]}"


def test_layers_point_one_way() -> None:
    bad = wrong_way_imports(package_import_graph())
    assert not bad, "\n".join(bad)


def _copy_with(tmp_path: Path, plants: list[tuple[str, str]]) -> dict[str, set[str]]:
    """The import graph of a copy of the package where each ``(module, line)`` of ``plants``
    has ``line`` appended to ``module`` (a path below the package)."""
    root = tmp_path / "accelgen"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.csv",
                                                                 "*.json", "*.txt"))
    for module, line in plants:
        with open(root / module, "a") as fh:
            fh.write(f"\n{line}  # planted\n")
    return import_graph(root)


# One planted import per rule kind, all in one copy (each copy parses the whole package).
PLANTED = (
    ("costmodel/base.py", "from accelgen.policies.registry import make_policy",
     "accelgen.costmodel.base imports accelgen.policies.registry"),
    ("core/request.py", "from accelgen.costmodel.base import CostModel",
     "accelgen.core.request imports accelgen.costmodel.base"),
    ("workloads/slo.py", "from accelgen.results import RunOutput",
     "accelgen.workloads.slo imports accelgen.results"),
    ("figures/plots.py", "from accelgen.pipeline.grid import Grid",
     "accelgen.figures.plots imports accelgen.pipeline.grid"),
    ("sim/engine.py", "from accelgen.experiments import oracle_search",
     "accelgen.sim.engine imports accelgen.experiments.oracle_search"),
    ("pipeline/grid.py", "from accelgen.cli import main", "accelgen.pipeline.grid imports accelgen.cli"),
)


def test_planted_wrong_way_imports_are_found(tmp_path: Path) -> None:
    graph = _copy_with(tmp_path, [(module, line) for module, line, _ in PLANTED])
    assert wrong_way_imports(graph) == sorted(found for *_, found in PLANTED)


def test_a_planted_package_circle_is_found(tmp_path: Path) -> None:
    """serving (the HTTP client) imports vllm_integration; vllm_integration importing serving
    makes no module circle (version.py -> arrivals.py imports nothing back), but a package one."""
    graph = _copy_with(tmp_path, [("vllm_integration/version.py",
                                   "from accelgen.serving import arrivals")])
    assert circles(graph) == []
    assert circles(package_graph(graph)) == [frozenset({"serving", "vllm_integration"})]


# AccelGen's policy side runs in Python; its compiled modules import numba, which a process that
# loads the ahead-of-time build never imports (``policies/accelgen/build.py``). So the policy side
# imports compiled modules only inside functions (``build`` does, to compile them).
ACCELGEN_POLICY_SIDE = ("__init__", "__main__", "policy", "oracle", "table", "workspace", "state", "build",
                        "closed_loop")


def test_accelgen_policy_side_imports_no_compiled_module_at_module_level() -> None:
    pkg = "accelgen.policies.accelgen"
    side = {f"{pkg}.{m}" for m in ACCELGEN_POLICY_SIDE} | {pkg}
    compiled = {m for m in import_graph() if m.startswith(pkg + ".") and m not in side}
    assert f"{pkg}.decide" in compiled and f"{pkg}.era" in compiled
    bad = []
    for name in ACCELGEN_POLICY_SIDE:
        tree = ast.parse((PACKAGE / "policies" / "accelgen" / f"{name}.py").read_text())
        for node in tree.body:  # (module level; an ``if TYPE_CHECKING:`` block is not an import)
            if isinstance(node, ast.Import):
                targets = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            else:
                continue
            bad += [f"{name}.py imports {t}" for t in sorted(targets & (compiled | {"numba"}))]
    assert not bad, "\n".join(bad)

"""The job side takes the plan, never the planner: ``hpcrl.job`` and ``hpcrl.core`` import
from ``hpcrl.plan`` only the ``JobSpec`` types and the one jobspec.json reader (which plans a
run folder that has no plan with the local profile; hence its lazy import of the planner).

Read from the source with ``ast``, so imports inside functions count too; the login-node side's
own boundary (no torch, Ray, ...) is tests/test_packaging.py. The same scan finds import
cycles: none among hpcrl's modules at import time, none new among hpcrl/core/generation's
even through function-level imports (issue 12's vllm_policy <-> vllm_workers circle)."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

HPCRL = Path(__file__).resolve().parents[1] / "hpcrl"
JOB_SIDE = ("job", "core")
PLAN_CONTRACT = {"hpcrl.run.jobspec", "hpcrl.run.jobspec_file"}


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in the file names (absolute ones);
    ``from <package> import <name>`` names the module ``<package>.<name>``."""
    return _names(ast.walk(ast.parse(path.read_text(), str(path))), HPCRL)


def _names(nodes: Iterable[ast.AST], root: Path) -> set[str]:
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _is_package(node.module, root):
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
            else:
                names.add(node.module)
    return names


def _is_package(module: str, root: Path = HPCRL) -> bool:
    parts = module.split(".")
    return parts[0] == "hpcrl" and (root.joinpath(*parts[1:]) / "__init__.py").is_file()


def plan_imports(path: Path) -> set[str]:
    return {
        name
        for name in imported_modules(path)
        if name == "hpcrl.plan" or name.startswith("hpcrl.plan.")
    }


def test_the_job_side_imports_only_the_jobspec_contract_from_plan():
    found = {}
    for stage in JOB_SIDE:
        for path in sorted((HPCRL / stage).rglob("*.py")):
            outside = plan_imports(path) - PLAN_CONTRACT
            if outside:
                found[str(path.relative_to(HPCRL.parent))] = sorted(outside)
    assert not found, (
        "the job side must take planned decisions from the JobSpec (hpcrl.run.jobspec, read "
        f"by hpcrl.run.jobspec_file), not re-run plan rules: {found}"
    )


def test_the_scan_sees_plan_imports_in_any_form(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "from hpcrl.run.jobspec import JobSpec\n"
        "def f():\n"
        "    from hpcrl.plan import generation\n"
        "    import hpcrl.plan.checkpoint_dir\n"
        "    from hpcrl.plan.planner import plan\n"
        "    from hpcrl import plan\n"
    )
    assert plan_imports(source) == {
        "hpcrl.run.jobspec",
        "hpcrl.plan.generation",
        "hpcrl.plan.checkpoint_dir",
        "hpcrl.plan.planner",
        "hpcrl.plan",
    }


# ---------------------------------------------------------------------- import cycles
# Issue 12 broke the circle vllm_policy.py <-> vllm_workers.py: the workers (the engine side
# of the generation seam) never reach back into the policy that drives them. The one cycle
# left among hpcrl/core/generation's modules goes through function-level imports only:
# ``TorchEngine.generate`` uses torch_sampler's padding helpers and torch_sampler builds a
# ``TorchEngine``. Known, harmless at import time (and may go); a new one fails here.
GENERATION = HPCRL / "core" / "generation"
KNOWN_LAZY_GENERATION_CYCLES = [
    ["hpcrl.core.generation.torch_engine", "hpcrl.core.generation.torch_sampler"]
]


def module_name(path: Path, root: Path = HPCRL) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The import statements that run when the module is imported: top level, inside
    top-level ``if`` / ``try`` blocks, not under ``if TYPE_CHECKING`` nor in a function."""
    for statement in body:
        if isinstance(statement, ast.Import | ast.ImportFrom):
            yield statement
        elif isinstance(statement, ast.If):
            if not _is_type_checking(statement.test):
                yield from _import_time_statements(statement.body)
            yield from _import_time_statements(statement.orelse)
        elif isinstance(statement, ast.Try):
            for block in (statement.body, statement.orelse, statement.finalbody):
                yield from _import_time_statements(block)
            for handler in statement.handlers:
                yield from _import_time_statements(handler.body)


def import_graph(
    folder: Path, *, import_time_only: bool, root: Path = HPCRL
) -> dict[str, set[str]]:
    """Module -> the modules under ``folder`` (inside the package ``root``) it imports: every
    import, or only those that run when it is imported."""
    modules = {module_name(path, root): path for path in sorted(folder.rglob("*.py"))}
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        nodes = _import_time_statements(tree.body) if import_time_only else ast.walk(tree)
        imported = _names(nodes, root)
        graph[name] = {other for other in imported if other in modules and other != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted."""
    reach = {name: _reachable(graph, name) for name in graph}
    found = {tuple(sorted(n for n in graph if n in reach[name] and name in reach[n]))
             for name in graph}  # fmt: skip
    return sorted(list(c) for c in found if len(c) > 1)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for other in graph[todo.pop()]:
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


def test_no_module_of_hpcrl_imports_itself_back_at_import_time():
    assert cycles(import_graph(HPCRL, import_time_only=True)) == []


def test_generation_modules_form_no_new_import_cycle():
    graph = import_graph(GENERATION, import_time_only=False)
    assert "hpcrl.core.workers.vllm_policy" not in graph["hpcrl.core.workers.vllm_workers"]
    new = [cycle for cycle in cycles(graph) if cycle not in KNOWN_LAZY_GENERATION_CYCLES]
    assert not new, f"import cycles among hpcrl/core/generation's modules: {new}"


def test_the_cycle_scan_sees_function_level_and_type_checking_imports(tmp_path):
    root = tmp_path / "hpcrl"
    package = root / "core" / "generation"
    package.mkdir(parents=True)
    for folder in (root, root / "core", package):
        (folder / "__init__.py").write_text("")
    (package / "a.py").write_text("from hpcrl.core.generation.b import f\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from hpcrl.core.generation import c\n"
        "def f():\n"
        "    import hpcrl.core.generation.a\n"
    )
    (package / "c.py").write_text("from hpcrl.core.generation.b import f\n")
    every = import_graph(package, import_time_only=False, root=root)
    import_time = import_graph(package, import_time_only=True, root=root)
    prefix = "hpcrl.core.generation."
    assert cycles(every) == [[prefix + "a", prefix + "b", prefix + "c"]]
    assert import_time[prefix + "b"] == set()
    assert cycles(import_time) == []

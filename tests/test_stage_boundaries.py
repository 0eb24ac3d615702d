"""The job side takes the plan, never the planner: ``hpcrl.job`` and ``hpcrl.core`` import
from ``hpcrl.plan`` only the ``JobSpec`` types and the one jobspec.json reader (which plans a
run folder that has no plan with the local profile; hence its lazy import of the planner).

Read from the source with ``ast``, so imports inside functions count too; the login-node side's
own boundary (no torch, Ray, ...) is tests/test_packaging.py."""

from __future__ import annotations

import ast
from pathlib import Path

HPCRL = Path(__file__).resolve().parents[1] / "hpcrl"
JOB_SIDE = ("job", "core")
PLAN_CONTRACT = {"hpcrl.plan.jobspec", "hpcrl.plan.jobspec_file"}


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in the file names (absolute ones);
    ``from <package> import <name>`` names the module ``<package>.<name>``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _is_package(node.module):
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
            else:
                names.add(node.module)
    return names


def _is_package(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "hpcrl" and (HPCRL.joinpath(*parts[1:]) / "__init__.py").is_file()


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
        "the job side must take planned decisions from the JobSpec (hpcrl.plan.jobspec, read "
        f"by hpcrl.plan.jobspec_file), not re-run plan rules: {found}"
    )


def test_the_scan_sees_plan_imports_in_any_form(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "from hpcrl.plan.jobspec import JobSpec\n"
        "def f():\n"
        "    from hpcrl.plan import generation\n"
        "    import hpcrl.plan.checkpoint_dir\n"
        "    from hpcrl.plan.planner import plan\n"
        "    from hpcrl import plan\n"
    )
    assert plan_imports(source) == {
        "hpcrl.plan.jobspec",
        "hpcrl.plan.generation",
        "hpcrl.plan.checkpoint_dir",
        "hpcrl.plan.planner",
        "hpcrl.plan",
    }

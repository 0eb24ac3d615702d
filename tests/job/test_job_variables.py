"""docs/architecture.md lists every ``HPCRL_*`` variable the job side reads, and which of them
override a planned value; this checks the table against the code both ways."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import attrs

from hpcrl.config.profile import RayPortsCfg
from hpcrl.job import settings

REPO = Path(__file__).resolve().parents[2]
#: What the job side runs; the port band's variable is named beside the bands (config types).
JOB_SIDE = (REPO / "hpcrl" / "job", REPO / "hpcrl" / "core", REPO / "hpcrl" / "run",
            REPO / "hpcrl" / "config" / "port_bands.py")  # fmt: skip
SECTION = "### The job's `HPCRL_*` variables"
VARIABLE = re.compile(r"HPCRL_[A-Z0-9_]+")
PORT_ROW = "HPCRL_RAY_<PORT>"


def documented() -> dict[str, bool]:
    """Variable -> whether the table says it overrides the plan (ports expanded per field)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`HPCRL_"):
            continue
        overrides = cells[1] == "overrides"
        for name in re.findall(r"`([^`]+)`", cells[0]):
            names = _port_variables() if name == PORT_ROW else {name}
            rows |= dict.fromkeys(names, overrides)
    return rows


def _port_variables() -> set[str]:
    return {f"HPCRL_RAY_{field.name.upper()}" for field in attrs.fields(RayPortsCfg)}


def read_in_code() -> set[str]:
    """Every whole ``HPCRL_*`` name among the job side's string constants, and the per-port
    variables ``hpcrl.job.settings`` builds from RayPortsCfg's fields."""
    names = {
        node.value
        for folder in JOB_SIDE
        for path in (folder.rglob("*.py") if folder.is_dir() else [folder])
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and VARIABLE.fullmatch(node.value)
    }
    return (names - {"HPCRL_RAY_"}) | _port_variables()


def planned_overrides() -> set[str]:
    """The ``HPCRL_*`` settings that replace a value of ``planned_settings``, and the ports."""
    planned = set(settings.planned_settings(_plan()))
    return {
        variable for variable, (name, _) in settings._ENV_SETTINGS.items() if name in planned
    } | _port_variables()


def test_the_table_names_every_variable_the_job_reads_and_no_other():
    assert set(documented()) == read_in_code()


def test_the_table_says_which_override_the_plan():
    assert {name for name, overrides in documented().items() if overrides} == planned_overrides()


def _plan():
    import tempfile

    from tests.job.plans import write_node_plan

    with tempfile.TemporaryDirectory() as folder:
        return write_node_plan(Path(folder))

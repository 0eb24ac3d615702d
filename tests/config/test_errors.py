"""How problems read: one entry per path, value and fix shown, errors first, a summary."""

from rich.console import Console

from hpcrl.config import ConfigError, Problem, print_problems
from hpcrl.config.errors import NO_VALUE

PROBLEMS = [
    Problem(path="policy.dtensor_cfg", message="older name", fix="rename it", severity="warning"),
    Problem(
        path="policy.megatron_cfg.optimizer.optimizer_offload_fraction",
        value=1.5,
        message="must be in (0, 1]",
        fix="set policy.megatron_cfg.optimizer.optimizer_offload_fraction=0.5",
    ),
    Problem(
        path="data.train_path", message="required key is missing", fix="add data.train_path: <str>"
    ),
]


def test_plain_text_lists_errors_first_then_warnings():
    text = str(ConfigError(PROBLEMS))
    assert text.splitlines() == [
        "error: policy.megatron_cfg.optimizer.optimizer_offload_fraction = 1.5: must be in (0, 1]",
        "  fix: set policy.megatron_cfg.optimizer.optimizer_offload_fraction=0.5",
        "error: data.train_path: required key is missing",
        "  fix: add data.train_path: <str>",
        "warning: policy.dtensor_cfg: older name",
        "  fix: rename it",
        "2 errors, 1 warning",
    ]


def test_rich_rendering_shows_each_path_once_with_value_and_fix():
    console = Console(record=True, width=200, color_system=None)
    print_problems(PROBLEMS, console)
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert lines[0] == "error   policy.megatron_cfg.optimizer.optimizer_offload_fraction = 1.5"
    assert lines[1].strip() == "must be in (0, 1]"
    assert (
        lines[2].strip() == "fix: set policy.megatron_cfg.optimizer.optimizer_offload_fraction=0.5"
    )
    assert sum("data.train_path" in line and "error" in line for line in lines) == 1
    assert lines[-1] == "2 errors, 1 warning"


def test_config_error_splits_errors_and_warnings():
    error = ConfigError(PROBLEMS)
    assert [problem.path for problem in error.warnings] == ["policy.dtensor_cfg"]
    assert len(error.errors) == 2 and error.problems == PROBLEMS
    assert PROBLEMS[2].value is NO_VALUE

"""Sweep points and sweep planning: every point is checked before anything is submitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrl.config import ConfigError
from hpcrl.render.script import render_sbatch
from hpcrl.run.sweep_record import SweepError, SweepRecord, read_sweep_record, write_sweep_record
from hpcrl.submit.sweep import build_points, split_values, sweep_hash
from hpcrl.submit.sweep_launch import plan_sweep, sweep_argv, sweep_name

REPO = Path(__file__).resolve().parents[2]
MEGATRON_RECIPE = str(REPO / "recipes" / "grpo-tiny-1n-cpu-megatron.yaml")
FRACTION = "policy.megatron_cfg.optimizer.optimizer_offload_fraction"
OFFLOAD_ON = ["cluster.gpus_per_node=1", "policy.megatron_cfg.optimizer.optimizer_cpu_offload=true"]


def test_grid_axes_multiply_in_order() -> None:
    points = build_points(["a.x=1,2", "b=p,q,r"])
    assert [p.values for p in points] == [
        {"a.x": "1", "b": "p"}, {"a.x": "1", "b": "q"}, {"a.x": "1", "b": "r"},
        {"a.x": "2", "b": "p"}, {"a.x": "2", "b": "q"}, {"a.x": "2", "b": "r"},
    ]  # fmt: skip
    assert [p.index for p in points] == list(range(6))
    assert points[4].overrides == ("a.x=2", "b=q")
    assert points[4].run_dir_name == "point-4"


def test_zip_keys_move_together_and_multiply_with_the_grid() -> None:
    points = build_points(["g=1,2"], zips=["lr=0.1,0.2", "seed=7,8"])
    assert [p.values for p in points] == [
        {"g": "1", "lr": "0.1", "seed": "7"}, {"g": "1", "lr": "0.2", "seed": "8"},
        {"g": "2", "lr": "0.1", "seed": "7"}, {"g": "2", "lr": "0.2", "seed": "8"},
    ]  # fmt: skip


def test_list_values_keep_their_commas() -> None:
    assert split_values("[a,b],c,{x: 1, y: 2}") == ["[a,b]", "c", "{x: 1, y: 2}"]


@pytest.mark.parametrize(
    ("grid", "zips", "message"),
    [
        (["novalue"], [], "expected KEY=V1,V2"),
        (["a=1,,2"], [], "empty value"),
        (["a=1", "a=2"], [], "a is swept twice"),
        ([], ["a=1,2", "b=1"], "equal lengths"),
        ([], [], "at least one --grid"),
    ],
)
def test_malformed_sweeps(grid: list[str], zips: list[str], message: str) -> None:
    with pytest.raises(SweepError, match=message):
        build_points(grid, zips)


def test_sweep_hash_is_stable_and_input_sensitive() -> None:
    points = build_points(["a=1,2"])
    assert sweep_hash("r", "c", [], points) == sweep_hash("r", "c", [], build_points(["a=1,2"]))
    assert sweep_hash("r", "c", [], points) != sweep_hash("r", "c", ["x=1"], points)


def test_sweep_record_round_trips(tmp_path: Path) -> None:
    record = SweepRecord(
        name="s", recipe_source="r.yaml", cluster="c", overrides=("x=1",), swept_keys=("a",),
        points=tuple(build_points(["a=1,2"])), array_job_id="12", submitted_at="t",
    )  # fmt: skip
    write_sweep_record(tmp_path, record)
    assert read_sweep_record(tmp_path) == record


def test_flagship_sweep_plans_every_point_as_one_array(tmp_path: Path) -> None:
    points = build_points([f"{FRACTION}=0.25,0.5,0.75,1.0"])
    planned = plan_sweep(MEGATRON_RECIPE, "slurm-test", OFFLOAD_ON, points, tmp_path / "sw")
    spec = planned.array_spec
    assert spec.array_size == 4 and spec.run_dir == str(tmp_path / "sw")
    assert dict(spec.sbatch_directives)["array"] == "0-3%2"  # slurm-test: array_parallelism 2
    assert dict(spec.sbatch_directives)["job-name"] == sweep_name(
        MEGATRON_RECIPE, "slurm-test", OFFLOAD_ON, points
    )
    # slurm-test leaves the Ray ports to each task's port band: tasks may share a node.
    assert "exclusive" not in dict(spec.sbatch_directives)
    fractions = [
        p.loaded.recipe.policy.megatron_cfg.optimizer.optimizer_offload_fraction
        for p in planned.points
    ]
    assert fractions == [0.25, 0.5, 0.75, 1.0]
    assert [p.spec.run_dir for p in planned.points] == [
        str(tmp_path / "sw" / f"point-{i}") for i in range(4)
    ]


def test_one_bad_point_fails_the_sweep_naming_its_values_and_path(tmp_path: Path) -> None:
    points = build_points([f"{FRACTION}=0.5,1.5,1.0"])
    with pytest.raises(ConfigError) as error:
        plan_sweep(MEGATRON_RECIPE, "slurm-test", OFFLOAD_ON, points, tmp_path / "sw")
    errors = [p for p in error.value.problems if p.is_error]
    assert len(errors) == 1
    assert errors[0].path == FRACTION and errors[0].value == 1.5
    assert errors[0].message.startswith(f"[sweep point 1: {FRACTION}=1.5] must be in [0, 1]")
    assert not (tmp_path / "sw").exists(), "nothing is written before every point is valid"


def test_points_that_change_the_allocation_cannot_share_an_array(tmp_path: Path) -> None:
    recipe = str(REPO / "recipes" / "grpo-tiny-2n-cpu.yaml")
    points = build_points(["cluster.num_nodes=1,2"])
    with pytest.raises(ConfigError) as error:
        plan_sweep(recipe, "slurm-test", [], points, tmp_path / "sw")
    messages = [p.format() for p in error.value.problems if p.is_error]
    assert any("need different allocations" in m for m in messages), messages


def test_a_local_sweep_has_no_array_its_points_run_one_by_one(tmp_path: Path) -> None:
    points = build_points([f"{FRACTION}=0.5,1.0"])
    offload_on = [o for o in OFFLOAD_ON if not o.startswith("cluster.")]  # local: 2 slots
    planned = plan_sweep(MEGATRON_RECIPE, "local", offload_on, points, tmp_path / "sw")
    assert planned.runs_points_one_by_one and planned.array_spec is None
    assert [p.spec.array_size for p in planned.points] == [None, None]
    assert [p.spec.run_dir for p in planned.points] == [
        str(tmp_path / "sw" / "point-0"),
        str(tmp_path / "sw" / "point-1"),
    ]


def test_a_profile_with_named_ray_ports_gets_whole_nodes_per_task(tmp_path: Path) -> None:
    profile_text = (REPO / "cluster_profiles" / "slurm-test.yaml").read_text()
    profile = tmp_path / "fixed-ports.yaml"
    profile.write_text(profile_text + "ray_ports:\n  gcs_port: 6379\n")
    points = build_points([f"{FRACTION}=0.25,0.5"])
    planned = plan_sweep(MEGATRON_RECIPE, str(profile), OFFLOAD_ON, points, tmp_path / "sw")
    assert "exclusive" in dict(planned.array_spec.sbatch_directives), (
        "tasks would share the named gcs_port on one node"
    )


def test_a_sweep_is_named_after_its_recipe_and_its_scripts_after_the_sweep_command(tmp_path):
    grid = [f"{FRACTION}=0.5,1.0"]
    points = build_points(grid)
    name = sweep_name(MEGATRON_RECIPE, "slurm-test", OFFLOAD_ON, points)
    assert (
        name
        == f"grpo-tiny-1n-cpu-megatron-sweep-{sweep_hash(MEGATRON_RECIPE, 'slurm-test', OFFLOAD_ON, points)}"
    )
    out = tmp_path / "my-folder"  # -o: the folder's name is not the job's
    argv = sweep_argv(MEGATRON_RECIPE, "slurm-test", OFFLOAD_ON, grid, [], out)
    planned = plan_sweep(MEGATRON_RECIPE, "slurm-test", OFFLOAD_ON, points, out, written_by=argv)
    assert dict(planned.array_spec.sbatch_directives)["job-name"] == name
    assert [dict(p.spec.sbatch_directives)["job-name"] for p in planned.points] == [
        f"{name}-point-0",
        f"{name}-point-1",
    ]
    written_by = (
        f"# Written by: hpcrl sweep {MEGATRON_RECIPE} --cluster slurm-test {' '.join(OFFLOAD_ON)} "
        f"--grid {grid[0]} -o {out}\n# Run it with `hpcrl sweep` (same arguments)"
    )
    # The array script and every point's script name the sweep command, not point 0's render.
    for spec in (planned.array_spec, *(p.spec for p in planned.points)):
        assert written_by in render_sbatch(spec)


def test_without_its_command_line_a_sweep_names_its_points_values():
    points = build_points(["a=1,2", "b=x,y"])
    planned_argv = sweep_argv("r.yaml", "c", ["k=v"], [], ["a=1,1,2,2", "b=x,y,x,y"])
    from hpcrl.submit.sweep_launch import _points_argv

    assert _points_argv("r.yaml", "c", ["k=v"], points) == planned_argv
    assert build_points([], ["a=1,1,2,2", "b=x,y,x,y"]) == points


def test_a_sweep_warns_as_submitting_each_point_would_each_text_once(tmp_path, monkeypatch, capfd):
    """Every point's warnings (not only point 0's): the data running out at points 0 and 1
    only, named by point; the offline cache, the same for every point, once and unnamed; on
    Slurm (an array) and on the local profile (points one by one) alike."""
    from hpcrl.submit.sweep_launch import sweep_warnings

    cache = tmp_path / "no-cache"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    points = build_points(["grpo.max_num_steps=200,300,20"])
    model = "policy.model_name=Qwen/Qwen2.5-0.5B"
    for recipe, cluster in (("grpo-tiny-2n-cpu", "slurm-test"), ("grpo-tiny-1n-cpu", "local")):
        recipe_path = str(REPO / "recipes" / f"{recipe}.yaml")
        planned = plan_sweep(recipe_path, cluster, [model], points, tmp_path / cluster)
        shown = [(w.path, w.message) for w in sweep_warnings(planned) if w.path != "run_dir"]
        assert shown == [
            ("grpo.max_num_steps", "[sweep point 0: grpo.max_num_steps=200] asks for 200 steps, "
             "but the data gives 32: toy_count.jsonl holds 256 rows, at 8 per step "
             "(grpo.num_prompts_per_step) over 1 epoch(s) (grpo.max_num_epochs) that is 32 "
             "steps; the run stops after step 32"),
            ("policy.model_name", "the job runs with HF_HUB_OFFLINE=1 and its Hugging Face cache "
             f"{cache} does not exist on this machine, so nothing there holds it"),
            ("grpo.max_num_steps", "[sweep point 1: grpo.max_num_steps=300] asks for 300 steps, "
             "but the data gives 32: toy_count.jsonl holds 256 rows, at 8 per step "
             "(grpo.num_prompts_per_step) over 1 epoch(s) (grpo.max_num_epochs) that is 32 "
             "steps; the run stops after step 32"),
        ], cluster  # fmt: skip
        # a Slurm sweep under pytest's /tmp also warns that nodes may not see it, once
        assert [w.path for w in sweep_warnings(planned)].count("run_dir") == (
            cluster == "slurm-test"
        )
    from hpcrl.cli.main import main

    capfd.readouterr()
    # The CLI prints them on stderr, point 1's too (it used to show point 0's only).
    args = ["sweep", str(REPO / "recipes" / "grpo-tiny-1n-cpu.yaml"), "--cluster", "local",
            model, "--grid", "grpo.max_num_steps=20,300", "--no-submit", "-o", str(tmp_path / "cli")]  # fmt: skip
    assert main(args) == 0
    err = " ".join(capfd.readouterr().err.split())
    assert err.startswith(
        "warning policy.model_name = 'Qwen/Qwen2.5-0.5B' the job runs with HF_HUB_OFFLINE=1"
    ), err
    assert "warning grpo.max_num_steps [sweep point 1: grpo.max_num_steps=300] asks for 300" in err
    assert err.endswith("0 errors, 2 warnings"), err

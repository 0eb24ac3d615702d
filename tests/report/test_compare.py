"""``hpcrl report RUN_A RUN_B ...``: runs outside one sweep in one table and overlaid curves
(issue 26 item 8; at 167264e report took one folder)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from hpcrl.cli.main import main
from hpcrl.report.comparison import build_comparison, differing_keys
from hpcrl.report.training_plots import row_label
from hpcrl.run.logger_destinations import write_destinations
from hpcrl.run.sweep_record import SweepRecord, write_sweep_record
from hpcrl.submit.sweep import build_points


def _run(folder: Path, seed: int, lr: float, steps: int = 3) -> Path:
    folder.mkdir(parents=True)
    recipe = {"grpo": {"seed": seed, "max_num_steps": steps},
              "policy": {"optimizer": {"kwargs": {"lr": lr}}, "model_name": "tiny:qwen2"}}  # fmt: skip
    (folder / "recipe.resolved.yaml").write_text(yaml.safe_dump(recipe))
    (folder / "manifest.json").write_text(json.dumps({"recipe_source": "grpo-tiny-1n-cpu"}))
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 1.0 / (s + seed), "reward_mean": 0.1 * s * seed,
                    "time_step_s": 1.0 + seed}) + "\n" for s in range(1, steps + 1)
    ))  # fmt: skip
    return folder


def test_runs_from_anywhere_compare_in_one_table_with_the_keys_that_differ(tmp_path, capsys):
    a = _run(tmp_path / "runs" / "demo", seed=1, lr=1e-3)
    b = _run(tmp_path / "old-runs" / "demo", seed=2, lr=1e-3)  # same name, another folder
    c = _run(tmp_path / "runs" / "demo-rerun", seed=3, lr=5e-3)
    sweep = tmp_path / "runs" / "sw"
    sweep.mkdir()
    points = tuple(build_points(["grpo.seed=4,5"]))
    write_sweep_record(sweep, SweepRecord(name="sw", recipe_source="r", cluster="local",
                                          overrides=(), swept_keys=("grpo.seed",), points=points))  # fmt: skip
    for point, seed in zip(points, (4, 5), strict=True):
        _run(sweep / point.run_dir_name, seed=seed, lr=1e-3)

    report = build_comparison([a, b, c, sweep])
    assert [row.name for row in report.rows] == [
        "runs/demo", "old-runs/demo", "demo-rerun", "sw/point-0", "sw/point-1"
    ]  # fmt: skip
    assert report.swept_keys == ("grpo.seed", "policy.optimizer.kwargs.lr")
    assert [row.swept_values for row in report.rows][:3] == [
        {"grpo.seed": "1", "policy.optimizer.kwargs.lr": "0.001"},
        {"grpo.seed": "2", "policy.optimizer.kwargs.lr": "0.001"},
        {"grpo.seed": "3", "policy.optimizer.kwargs.lr": "0.005"},
    ]
    assert [row.summary.final_loss for row in report.rows] == [0.25, 0.2, 1 / 6, 1 / 7, 0.125]
    assert row_label(report.rows[1]) == "old-runs/demo"  # plots name the runs

    write_destinations(
        a, [{"logger": "wandb", "mode": "online", "url": "https://wandb.ai/me/p/runs/x1"}]
    )
    out = tmp_path / "plots"
    code = main(["report", str(a), str(b), str(c), str(sweep), "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "runs/demo: wandb online: https://wandb.ai/me/p/runs/x1\n" in text  # item 5
    assert "5 runs" in text and "seed" in text and "lr" in text
    assert sorted(path.name for path in out.iterdir()) == [
        "step_time.png", "training.png", "vs_lr.png", "vs_seed.png"
    ]  # fmt: skip


def test_more_differing_keys_than_fit_are_named_in_a_note(tmp_path):
    runs = [_run(tmp_path / f"r{index}", seed=index, lr=10.0**-index) for index in (1, 2)]
    recipe = yaml.safe_load((runs[1] / "recipe.resolved.yaml").read_text())
    recipe["loss_fn"] = {"a": 1, "b": 2, "c": 3}
    (runs[1] / "recipe.resolved.yaml").write_text(yaml.safe_dump(recipe))
    keys, _ = differing_keys(runs)
    assert keys == ["grpo.seed", "loss_fn.a", "loss_fn.b", "loss_fn.c",
                    "policy.optimizer.kwargs.lr"]  # fmt: skip
    report = build_comparison(runs)
    assert report.swept_keys == ("grpo.seed", "loss_fn.a", "loss_fn.b", "loss_fn.c")
    assert report.notes == (
        "1 more recipe key(s) differ: policy.optimizer.kwargs.lr (hpcrl diff RUN_A RUN_B lists "
        "them)",
    )

"""hpcrl report: table values and plots from fixture metrics (no cluster needed)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from hpcrl.report.plots import save_plots
from hpcrl.report.summary import build_report, format_number, render_table
from hpcrl.run.metrics_file import read_metrics, read_metrics_file
from hpcrl.run.sweep_record import SweepRecord, write_sweep_record
from hpcrl.submit.sweep import build_points

KEY = "policy.megatron_cfg.optimizer.optimizer_offload_fraction"
FRACTIONS = ["0.25", "0.5", "1.0"]


def _fixture_records(fraction: float, num_steps: int = 9) -> list[dict]:
    # step time grows with the offload fraction, memory shrinks: a plausible sweep shape
    rng = np.random.default_rng(int(fraction * 100))
    return [
        {
            "step": step,
            "time_step_s": float(1.0 + fraction + rng.uniform(0, 0.5)),
            "tokens_per_s": float(1000 / (1.0 + fraction) + rng.uniform(0, 10)),
            "loss": float(2.0 / step),
            "reward_mean": float(0.1 * step),
            "peak_gpu_mem_gb": None,
            "peak_host_rss_gb": float(4.0 - 2 * fraction + 0.01 * step),
        }
        for step in range(1, num_steps + 1)
    ]


def _write_run(run_dir: Path, records: list[dict]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    sweep_dir = tmp_path / "grpo-tiny-sweep-abcd1234"
    points = build_points([f"{KEY}={','.join(FRACTIONS)}"])
    record = SweepRecord(
        name=sweep_dir.name, recipe_source="r.yaml", cluster="local", overrides=(),
        swept_keys=(KEY,), points=tuple(points), array_job_id="7",
    )  # fmt: skip
    sweep_dir.mkdir()
    write_sweep_record(sweep_dir, record)
    for point, fraction in zip(points, FRACTIONS, strict=True):
        _write_run(sweep_dir / point.run_dir_name, _fixture_records(float(fraction)))
    return sweep_dir


def _table_text(report) -> str:
    console = Console(record=True, width=250)
    console.print(render_table(report))
    return console.export_text()


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_sweep_table_rows_match_independently_computed_values(sweep_dir: Path) -> None:
    report = build_report(sweep_dir)
    lines = {
        line.split("│")[1].strip(): line
        for line in _table_text(report).splitlines()
        if "point-" in line
    }
    assert sorted(lines) == ["point-0", "point-1", "point-2"]
    for index, fraction in enumerate(FRACTIONS):
        records = _fixture_records(float(fraction))
        times = [r["time_step_s"] for r in records]
        cells = [cell.strip() for cell in lines[f"point-{index}"].split("│")[1:-1]]
        expected = [
            f"point-{index}", fraction, "9",
            format_number(float(np.median(times))),
            format_number(float(np.percentile(times, 95))),
            format_number(float(np.median([r["tokens_per_s"] for r in records]))),
            "—",
            format_number(max(r["peak_host_rss_gb"] for r in records)),
            format_number(records[-1]["loss"]),
            format_number(records[-1]["reward_mean"]),
        ]  # fmt: skip
        assert cells == expected


def test_plots_are_pngs_of_the_expected_size(sweep_dir: Path, tmp_path: Path) -> None:
    paths = save_plots(build_report(sweep_dir), tmp_path / "out")
    assert [p.name for p in paths] == [
        "training.png",
        "step_time.png",
        "vs_optimizer_offload_fraction.png",
    ]
    assert _png_size(paths[0]) == (1300, 750)
    for path in paths[1:]:
        assert _png_size(path) == (800, 500)


def test_single_run_report_has_one_row_and_no_sweep_plot(tmp_path: Path) -> None:
    _write_run(tmp_path / "run", _fixture_records(0.5, num_steps=3))
    report = build_report(tmp_path / "run")
    assert [row.name for row in report.rows] == ["run"]
    assert report.rows[0].summary.last_step == 3
    assert [p.name for p in save_plots(report, tmp_path / "out")] == [
        "training.png",
        "step_time.png",
    ]


def test_torn_last_line_is_skipped_quietly_a_bad_middle_line_with_a_note(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert read_metrics_file(run).notes == ()
    (run / "metrics.jsonl").write_bytes(
        b'{"step": 1}\nnot json\n{"step": 3}\n\xff\xfe\n[1]\n{"loss": 1}\n{"step": 4}\n'
    )
    metrics = read_metrics_file(run)
    assert [r["step"] for r in metrics.records] == [1, 3, 4]
    assert metrics.notes == (
        f"{run}/metrics.jsonl: skipped 4 unreadable line(s) (line 2: not JSON; line 4: not "
        "UTF-8; line 5: a JSON list, not an object; line 6: no step number (step = None))",
        f"{run}/metrics.jsonl: lines are missing: 1 of the 4 steps up to step 4 have none "
        "(steps 2), so the figures cover 3 steps; unreadable (see above) or the job's own log "
        "(hpcrl logs --driver) shows every step",
    )


def test_lines_deleted_while_the_job_ran_are_said(tmp_path: Path) -> None:
    """Issue 26: metrics.jsonl deleted mid-run: the job appends to a new file from step 51 on,
    and the report showed 10 of 60 steps without a word."""
    run = tmp_path / "run"
    _write_run(run, _fixture_records(0.5, num_steps=60)[50:])
    metrics = read_metrics_file(run)
    assert [r["step"] for r in metrics.records] == list(range(51, 61))
    assert metrics.notes == (
        f"{run}/metrics.jsonl: lines are missing: 50 of the 60 steps up to step 60 have none "
        "(steps 1-50), so the figures cover 10 steps; the file was changed or cut while the "
        "job wrote it: the job's own log (hpcrl logs --driver) shows every step",
    )
    holes = tmp_path / "holes"  # steps 3 and 6 gone; 9 is after the last line, unknown
    _write_run(holes, [r for r in _fixture_records(0.5, num_steps=9) if r["step"] % 3])
    assert (
        "2 of the 8 steps up to step 8 have none (steps 3, 6)" in read_metrics_file(holes).notes[0]
    )
    whole = tmp_path / "whole"
    _write_run(whole, [{"step": 0, "val_reward": 0.1}, *_fixture_records(0.5, num_steps=5)])
    assert read_metrics_file(whole).notes == ()


def test_nan_and_text_are_ignored_explicitly_and_results_do_not_depend_on_line_order(
    tmp_path: Path,
) -> None:
    records = [
        {"step": 1, "time_step_s": 1.0, "peak_host_rss_gb": 5.0, "loss": 3.0},
        {"step": 2, "time_step_s": float("nan"), "peak_host_rss_gb": float("nan"), "loss": "abc"},
        {"step": 3, "time_step_s": 3.0, "peak_host_rss_gb": 4.0, "loss": 1.0},
        {"step": 4, "time_step_s": 2.0, "peak_host_rss_gb": float("inf"), "loss": float("nan")},
    ]
    summaries = []
    for order in (records, records[::-1], [records[1], records[3], records[0], records[2]]):
        run = tmp_path / f"run{len(summaries)}"
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in order))
        row = build_report(run).rows[0]
        summaries.append(row.summary)
        assert row.notes == (
            "ignored 1 NaN/infinite time_step_s value(s) (steps 2)",
            "ignored 2 NaN/infinite peak_host_rss_gb value(s) (steps 2, 4)",
            "ignored 1 NaN/infinite loss value(s) (steps 4)",
            "ignored 1 loss value(s) that are not a number (steps 2)",
        )
    assert summaries[0] == summaries[1] == summaries[2]
    summary = summaries[0]
    assert (summary.num_steps, summary.last_step) == (4, 4)
    assert summary.median_time_step_s == 2.0 and summary.peak_host_rss_gb == 5.0
    assert summary.final_loss == 1.0  # the last finite loss, by step


def test_a_step_written_twice_counts_once_with_its_later_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}, {"step": 2, "loss": 2.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = build_report(run).rows[0].summary
    assert (summary.num_steps, summary.final_loss) == (2, 2.5)


def _grpo_records(num_steps: int = 12) -> list[dict]:
    rng = np.random.default_rng(3)
    return [
        {
            "step": step,
            "reward_mean": 0.05 * step,
            "reward_std": 0.2,
            "loss": 1.0 / step,
            "kl": 0.001 * step,
            "response_length_mean": 40.0 + step,
            "time_generate_s": 2.0 + rng.uniform(0, 0.2),
            "time_logprobs_s": 0.5,
            "time_train_s": 1.0,
            "tokens_per_s": 900.0 + step,
        }
        for step in range(1, num_steps + 1)
    ]


def test_training_series_and_stacked_split(tmp_path: Path) -> None:
    from hpcrl.report.training_plots import PHASES, series

    _write_run(tmp_path / "run", [{"step": 0, "val_reward_mean": 0.1}, *_grpo_records()])
    (row,) = build_report(tmp_path / "run").rows
    steps, rewards = series(row, "reward_mean")
    assert steps[0] == 1.0 and rewards[-1] == pytest.approx(0.6)  # step 0 (validation) left out
    assert [name for name, _ in PHASES] == ["generate", "log-probs", "train"]
    path = save_plots(build_report(tmp_path / "run"), tmp_path / "out")[0]
    assert path.name == "training.png" and _png_size(path) == (1300, 750)

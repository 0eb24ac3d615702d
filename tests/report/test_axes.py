"""The report's plot decisions, through the data that makes them (axis scales, limits, tick
locators, markers, which points shared a node, how each ended), and the PNGs they produce."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from hpcrl.report.axes import integer_ticks, point_style, swept_axis, value_axis
from hpcrl.report.placement import Placement, placement_of, run_states, shared_nodes
from hpcrl.report.plots import plot_vs_swept_value, save_plots
from hpcrl.report.summary import build_report
from hpcrl.run.sweep_record import SweepRecord, write_sweep_record
from hpcrl.submit.sweep import build_points

LR_KEY = "policy.optimizer.kwargs.lr"


def test_swept_values_spanning_decades_get_a_log_axis() -> None:
    assert swept_axis(["1e-5", "3e-5", "1e-4"]).scale == "log"
    assert swept_axis(["0.25", "0.5", "1.0"]).scale == "linear"
    assert swept_axis(["-1", "10", "100"]).scale == "linear"  # not all positive
    text = swept_axis(["adam", "sgd"])
    assert (text.scale, text.xs, text.labels) == ("category", (0.0, 1.0), ("adam", "sgd"))


def test_nearly_equal_values_start_at_zero_and_say_their_spread() -> None:
    flat = value_axis([2.001, 2.002, 2.0015])
    assert flat.limits == pytest.approx((0.0, 2.002 * 1.15)) and flat.note == "spread 0.05%"
    assert value_axis([1.0, 3.0]).limits is None  # a real difference keeps matplotlib's axis
    assert value_axis([-1.0, -1.001]).limits is None  # losses may be negative: left alone
    assert value_axis([5.0]).limits is None


def test_points_that_did_not_complete_or_shared_a_node_are_marked() -> None:
    failed = point_style("FAILED", False, "C0")
    assert (failed.marker, failed.facecolor, failed.edgecolor, failed.why) == (
        "X",
        "red",
        "red",
        "failed",
    )
    failed = point_style("CANCELLED", True, "C0")
    assert (failed.marker, failed.facecolor, failed.why) == ("X", "red", "cancelled")
    shared = point_style("COMPLETED", True, "C1")
    assert (shared.marker, shared.facecolor, shared.edgecolor, shared.why) == (
        "o", "none", "C1", "shared a node"
    )  # fmt: skip
    plain = point_style("COMPLETED", False, "C1")
    assert (plain.facecolor, plain.why) == ("C1", "")


def test_the_title_says_what_each_mark_means() -> None:
    from hpcrl.report.plots import marks_legend

    styles = [point_style(state, shared, "C0") for state, shared in
              (("FAILED", False), ("CANCELLED", True), ("COMPLETED", True), ("COMPLETED", False))]  # fmt: skip
    assert marks_legend(styles) == " (red ×: cancelled, failed; hollow: shared a node)"
    assert marks_legend(styles[2:]) == " (hollow: shared a node)"
    assert marks_legend(styles[:1]) == " (red ×: failed)"
    assert marks_legend(styles[3:]) == ""


def test_step_axes_tick_whole_numbers_only() -> None:
    from hpcrl.report.pyplot_agg import agg_pyplot

    pyplot = agg_pyplot()
    figure, axes = pyplot.subplots()
    axes.plot([1, 2, 3], [0.5, 0.4, 0.3])
    integer_ticks(axes.xaxis)
    figure.canvas.draw()
    ticks = [tick for tick in axes.get_xticks() if 1 <= tick <= 3]
    pyplot.close(figure)
    assert ticks and all(float(tick).is_integer() for tick in ticks)


def test_points_overlapping_on_a_host_shared_it() -> None:
    a = Placement(frozenset({"n1"}), 0.0, 100.0)
    b = Placement(frozenset({"n1", "n2"}), 50.0, 150.0)
    c = Placement(frozenset({"n1"}), 200.0, 300.0)  # after the others ended
    d = Placement(frozenset({"n3"}), 0.0, 300.0)  # at the same time, elsewhere
    assert shared_nodes([a, b, c, d, None]) == [True, True, False, False, False]


def _banner(job: str, host: str, time: str) -> str:
    return f"===== hpcrl attempt 1 · job {job} · node 0 ({host}) · {time} =====\n"


def make_sweep(root: Path) -> Path:
    """Three learning rates as one array on the test cluster's nodes: point 0 and 1 at the
    same time on n1, point 2 later on n2 (run by hand: no job.json); point 1 failed."""
    sweep = root / "sw"
    sweep.mkdir()
    points = tuple(build_points([f"{LR_KEY}=1e-5,1e-4,1e-3"]))
    write_sweep_record(sweep, SweepRecord(name="sw", recipe_source="r", cluster="c", overrides=(),
                                          swept_keys=(LR_KEY,), points=points))  # fmt: skip
    (sweep / "submitit").mkdir()
    hosts = [("n1", "2026-11-29T10:00:00+00:00"), ("n1", "2026-11-29T10:00:10+00:00"),
             ("n2", "2026-11-29T11:00:00+00:00")]  # fmt: skip
    for index, (host, start) in enumerate(hosts):
        (sweep / "submitit" / f"20_{index}_0_log.err").write_text(
            _banner(f"20_{index}", host, start)
        )
        point = sweep / f"point-{index}"
        point.mkdir()
        steps = 2 if index == 2 else 4
        (point / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "reward_mean": 0.1 * s * (index + 1), "loss": 1.0 / s,
                        "time_step_s": 2.0 + 0.0001 * s}) + "\n" for s in range(1, steps + 1)
        ))  # fmt: skip
        if index < 2:
            (point / "status").mkdir()
            end = 1796032800.0 + 600 + index  # 10:10 UTC, after both started
            (point / "status" / "done").write_text(
                json.dumps({"exit_code": 7 * index, "time": end})
            )
    return sweep


def test_states_come_from_the_run_folder_and_placements_from_the_banners(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path)
    points = [sweep / f"point-{i}" for i in range(3)]
    assert run_states(points) == ["COMPLETED", "FAILED", ""]  # point-2: never submitted here
    placements = [placement_of(point) for point in points]
    assert [p.hosts for p in placements if p] == [frozenset({"n1"})] * 2 + [frozenset({"n2"})]
    assert shared_nodes(placements) == [True, True, False]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_a_sweep_report_marks_its_points_and_writes_every_png(tmp_path: Path, capsys) -> None:
    sweep = make_sweep(tmp_path)
    report = build_report(sweep)
    assert [(row.state, row.shared_node) for row in report.rows] == [
        ("COMPLETED", True), ("FAILED", True), ("", False)
    ]  # fmt: skip
    paths = save_plots(report, tmp_path / "out")
    assert [p.name for p in paths] == ["training.png", "step_time.png", "vs_lr.png"]
    assert [_png_size(p) for p in paths] == [(1300, 750), (800, 500), (800, 500)]
    assert _png_size(plot_vs_swept_value(report, LR_KEY, tmp_path / "again.png")) == (800, 500)

    assert main(["report", str(sweep), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["swept_keys"] == [LR_KEY]
    first = data["rows"][0]
    assert (first["name"], first["state"], first["shared_node"]) == ("point-0", "COMPLETED", True)
    assert first["swept_values"] == {LR_KEY: "1e-5"}
    assert first["summary"]["final_reward"] == pytest.approx(0.4)
    assert first["summary"]["num_steps"] == 4


@pytest.mark.parametrize(
    "values, ticks",
    [(["1", "2", "3"], [1.0, 2.0, 3.0]),  # seeds: 167264e ticked 1.00, 1.25, 1.50, ...
     (["16", "32", "64", "256"], [16.0, 32.0, 64.0, 256.0])],  # a log axis: each value
)  # fmt: skip
def test_an_integer_swept_axis_gets_integer_ticks(values, ticks) -> None:
    from hpcrl.report.metrics import summarize
    from hpcrl.report.plots import _sweep_panel
    from hpcrl.report.pyplot_agg import agg_pyplot
    from hpcrl.report.summary import Report, ReportRow

    axis = swept_axis(values)
    assert axis.integer and not swept_axis(["0.25", "0.5"]).integer
    rows = tuple(
        ReportRow(name=f"point-{index}", run_dir=Path("."), swept_values={"k": value},
                  records=(), summary=summarize([{"step": 1, "loss": 1.0 / (index + 1)}]))
        for index, value in enumerate(values)
    )  # fmt: skip
    report = Report(title="t", source_dir=Path("."), swept_keys=("k",), rows=rows)
    pyplot = agg_pyplot()
    figure, panel = pyplot.subplots()
    _sweep_panel(panel, report, axis, "final loss", "final_loss")
    figure.canvas.draw()
    shown = [float(tick) for tick in panel.get_xticks()]
    labels = [label.get_text() for label in panel.get_xticklabels()]
    minor = list(panel.xaxis.get_minorticklocs())
    pyplot.close(figure)
    assert shown == ticks and labels == values and minor == []


def test_points_at_the_same_place_of_a_panel_are_plotted(tmp_path: Path) -> None:
    """A two-axis sweep whose second axis has one value: against that key every point sits
    at the same x, and equal metrics put them at the same y (hpcrl report stopped with a
    TypeError there, comparing the rows themselves)."""
    host_key, fraction_key = "policy.automodel_cfg.reference_on_host", "policy.x.fraction"
    sweep = tmp_path / "sw"
    sweep.mkdir()
    points = tuple(build_points([f"{host_key}=false,true", f"{fraction_key}=0"]))
    write_sweep_record(sweep, SweepRecord(name="sw", recipe_source="r", cluster="c", overrides=(),
                       swept_keys=(host_key, fraction_key), points=points))  # fmt: skip
    for index in range(2):
        (sweep / f"point-{index}").mkdir()
        (sweep / f"point-{index}" / "metrics.jsonl").write_text(
            json.dumps({"step": 1, "reward_mean": 0.0, "loss": 0.5, "time_step_s": 2.0}) + "\n"
        )
    paths = save_plots(build_report(sweep), tmp_path / "out")
    assert [p.name for p in paths] == [
        "training.png", "step_time.png", "vs_reference_on_host.png", "vs_fraction.png"
    ]  # fmt: skip
    assert all(_png_size(p) == (800, 500) for p in paths[1:])

"""``hpcrl.core.profiling.idle_gaps``: where the device waited, from kernel spans."""

from hpcrl.core.profiling import idle_gaps


def test_gaps_between_kernels_are_named_by_their_neighbours():
    spans = [
        (0.0, 100.0, "gemm"),
        (100.0, 150.0, "norm"),  # back to back: no gap
        (1150.0, 1200.0, "adam"),  # 1 ms after norm ended
        (1203.0, 1300.0, "adam"),  # 3 us: launch spacing, below the floor
        (1500.0, 1600.0, "attention"),
    ]
    lines = idle_gaps(spans)
    assert lines[0].startswith("idle gaps >= 5 us: 2, 1.20 ms of the 1.6 ms")
    assert "(75.0%)" in lines[0]
    assert lines[2].split() == ["1.000", "0.15", "norm", "->", "adam"]
    assert lines[3].split() == ["0.200", "1.30", "adam", "->", "attention"]
    summed = lines[lines.index("idle gaps summed by the work after them:") + 2 :]
    assert [line.split() for line in summed] == [
        ["1.000", "1", "adam"],
        ["0.200", "1", "attention"],
    ]


def test_short_gaps_add_up_under_the_work_that_waited():
    spans = [(0.0, 10.0, "gemm")]
    for index in range(1, 5):  # waits of 90, 20, 20, 20 us before "adam", 50 us before "norm"
        spans.append((index * 100.0, index * 100.0 + 80.0, "adam"))
    spans.append((530.0, 540.0, "norm"))
    lines = idle_gaps(spans)
    summed = lines[lines.index("idle gaps summed by the work after them:") + 2 :]
    assert [line.split() for line in summed] == [["0.150", "4", "adam"], ["0.050", "1", "norm"]]


def test_overlapping_streams_leave_no_gap_where_either_is_busy():
    spans = [
        (0.0, 1000.0, "long"),
        (100.0, 200.0, "short on a side stream"),  # ends inside "long"
        (1100.0, 1200.0, "next"),
    ]
    lines = idle_gaps(spans)
    assert lines[0].startswith("idle gaps >= 5 us: 1, 0.10 ms of the 1.2 ms")
    assert lines[2].split()[:4] == ["0.100", "1.00", "long", "->"]


def test_no_device_work():
    assert idle_gaps([]) == ["idle gaps: no device work recorded"]


def test_gpu_side_annotations_are_not_device_work():
    from types import SimpleNamespace

    from hpcrl.core.profiling import _on_device

    kernel = SimpleNamespace(name="_adam_kernel", device_type="DeviceType.CUDA")
    annotation = SimpleNamespace(
        name="Optimizer.step#MasterWeightAdam.step", device_type="DeviceType.CUDA"
    )
    flagged = SimpleNamespace(
        name="a range", device_type="DeviceType.CUDA", is_user_annotation=True
    )
    host_op = SimpleNamespace(name="aten::mm", device_type="DeviceType.CPU")
    assert [_on_device(e) for e in (kernel, annotation, flagged, host_op)] == [
        True,
        False,
        False,
        False,
    ]


def test_a_profiled_region_leaves_a_trace_that_launch_lag_reads(tmp_path):
    import torch

    from benchmarks.launch_lag import load_events
    from hpcrl.core.profiling import profiled

    with profiled(tmp_path / "s.txt", "matmuls", trace_path=tmp_path / "t.json.gz"):
        torch.ones(64, 64) @ torch.ones(64, 64)
    assert (tmp_path / "s.txt").read_text().startswith("== matmuls\n")
    names = {event.get("name") for event in load_events(tmp_path / "t.json.gz")}
    assert "aten::matmul" in names


def test_a_trace_with_python_frames_names_the_calling_function(tmp_path):
    import torch

    from benchmarks.launch_lag import load_events
    from hpcrl.core.profiling import profiled

    def host_work_between_operators() -> torch.Tensor:
        return torch.ones(8, 8) @ torch.ones(8, 8)

    trace = tmp_path / "t.json.gz"
    with profiled(tmp_path / "s.txt", "frames", trace_path=trace, python_frames=True):
        host_work_between_operators()
    python_calls = [
        event.get("name", "")
        for event in load_events(trace)
        if event.get("cat") == "python_function"
    ]
    assert any("host_work_between_operators" in name for name in python_calls)

"""``benchmarks/launch_lag.py``: idle device time blamed on the host only when the work was
queued after the device went idle, and named by the host operation that queued it."""

from benchmarks.launch_lag import host_late_report


def kernel(name, ts, dur, corr):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"correlation": corr}, "tid": 7}  # fmt: skip


def launch(ts, corr, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2,
            "args": {"correlation": corr}, "tid": tid}  # fmt: skip


def op(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid}


def test_host_late_gaps_are_named_and_dependency_waits_are_not():
    events = [
        op("train_step", 0, 1000),
        op("forward", 0, 300),
        op("aten::mm", 10, 5),
        launch(12, 1),
        kernel("gemm", 20, 100, 1),  # busy 20-120
        op("python loss", 150, 100),
        launch(200, 2),  # queued at 200, after the device went idle at 120: host-late 80 us
        kernel("loss", 200, 10, 2),  # busy until 210
        launch(205, 3),  # queued while the device was busy: the 50 us wait is not the host's
        kernel("waits on an event", 260, 10, 3),
    ]
    lines = host_late_report(events)
    assert lines[0] == (
        "device span 0.2 ms; idle >= 5 us: 0.13 ms, "
        "of which host-late (queued after the device went idle) 0.08 ms"
    )
    outer = lines.index("host-late ms by the outermost host operation at the launch:")
    inner = lines.index("host-late ms by the innermost host operation at the launch:")
    assert [line.split() for line in lines[outer + 1 : inner]] == [["0.080", "train_step"]]
    assert [line.split(None, 1) for line in lines[inner + 1 :]] == [["0.080", "python loss"]]


def test_no_device_work():
    assert host_late_report([op("x", 0, 1)]) == ["no device work in the trace"]


def test_train_benchmark_times_each_steps_host_work_before_the_embedding():
    """``train_throughput.time_window`` records, per timed step, the host time from the
    step's call to the model's embedding: the step-start work a GPU sits idle through."""
    import time

    import torch

    from benchmarks.train_throughput import Loop, time_window

    embedding = torch.nn.Embedding(16, 4)
    host_work_s = 0.02

    def step() -> float:
        time.sleep(host_work_s)  # uploads and checks before the forward
        return float(embedding(torch.arange(4)).sum().detach())

    loop = Loop("sleepy", step, embedding=embedding)
    time_window(loop, "cpu", steps=3)
    assert len(loop.start_delays_s) == 3
    assert all(
        host_work_s <= delay <= step_s
        for delay, step_s in zip(loop.start_delays_s, loop.windows[0], strict=True)
    )
    assert not embedding._forward_pre_hooks  # the window took its hook away

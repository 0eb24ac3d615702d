"""Small training-driver stand-ins for the bootstrap tests (the real driver is hpcrl.core.driver)."""

from __future__ import annotations

import ray


def exit_with_7(run_dir: str) -> int:
    """Fails like a training driver that hit an error: nonzero exit code, after touching Ray."""
    assert ray.is_initialized()
    print("driver: failing on purpose with exit code 7", flush=True)
    return 7


def checkpoint_on_preempt(run_dir: str) -> int:
    """Behaves like the training driver under preemption: it announces that it runs, waits for
    ``PREEMPT``, "saves a checkpoint" (a file) and returns 3; a resumed run finds the checkpoint
    and returns 0."""
    import time
    from pathlib import Path

    run = Path(run_dir)
    checkpoint = run / "checkpoint.txt"
    if checkpoint.exists():
        print(f"driver: resumed from {checkpoint.read_text()}", flush=True)
        return 0
    (run / "driver_started").write_text("yes")
    deadline = time.monotonic() + 120
    while not (run / "PREEMPT").exists():
        assert time.monotonic() < deadline, "no PREEMPT within 120 s"
        time.sleep(0.1)
    checkpoint.write_text("step 7")
    print("driver: saw PREEMPT, saved step 7", flush=True)
    return 3


def probe_then_hold(run_dir: str) -> int:
    """The probe driver (a task on every node), then an actor on the last node, then it holds
    the job open until ``<run_dir>/release`` appears, so that a test can knock on the running
    job's ports meanwhile. Returns the probe's exit code."""
    import json
    import time
    from pathlib import Path

    from hpcrl.job.probe import run_probe
    from hpcrl.job.ray_cluster import node_resource_name

    code = run_probe(run_dir)
    last_node = len([node for node in ray.nodes() if node["Alive"]]) - 1
    holder = (
        ray.remote(num_cpus=0)(_Holder)
        .options(resources={node_resource_name(last_node): 0.001})
        .remote()
    )
    run = Path(run_dir)
    (run / "driver_holding").write_text(
        json.dumps({"probe_code": code, "actor": ray.get(holder.ping.remote())})
    )
    deadline = time.monotonic() + 280
    while not (run / "release").exists():
        assert time.monotonic() < deadline, "not released within 280 s"
        time.sleep(0.2)
    return code


class _Holder:
    def ping(self) -> str:
        return "pong"


def probe_then_train(run_dir: str) -> int:
    """The probe driver, then the real training driver (hpcrl.core.driver.run_training) with the
    node of each training rank's actor recorded in ``<run_dir>/placement.json`` (rank order:
    node id and IP), so that a test sees where the placement by node label really put them on
    the Ray at hand. Returns the probe's code if it failed, else the training driver's."""
    import json
    from pathlib import Path

    from hpcrl.core.driver import run_training
    from hpcrl.core.workers.group import RayWorkerGroup, node_ip
    from hpcrl.job.probe import run_probe

    code = run_probe(run_dir)
    if code != 0:
        return code
    start = RayWorkerGroup.start

    def start_and_record(self, *args, **kwargs):
        start(self, *args, **kwargs)
        node_ids = ray.get([actor.node_id.remote() for actor in self.actors])
        placement = [{"node_id": node, "node_ip": node_ip(node)} for node in node_ids]
        Path(run_dir, "placement.json").write_text(json.dumps(placement))

    RayWorkerGroup.start = start_and_record
    try:
        return run_training(run_dir)
    finally:
        RayWorkerGroup.start = start

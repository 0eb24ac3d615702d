"""What hpcrl switches off when it starts Ray, to make each start cheaper in CPU.

A Ray start runs a handful of Python processes (GCS-side dashboard, dashboard agent,
runtime-env agent, log monitor, the head's autoscaler monitor) and, when the first driver
connects, prestarts one idle worker per CPU that Ray may use (``min(num_cpus, cores)``: on a
GPU node with a hundred cores, a hundred Python processes importing Ray that nothing asked
for). hpcrl's work runs in actors and tasks it creates itself; Ray starts a worker for each
on demand, so the prestarted ones only cost CPU and memory at start-up (about 0.7 CPU-s each,
measured in docs/ci-time.md). The autoscaler monitor is switched off in ``ray start``
(``--no-monitor``, hpcrl.job.ray_cluster); ``ray.init`` has no such option.

Both the env form (for ``ray start``, whose raylet reads ``RAY_<name>``) and the
``_system_config`` form (for ``ray.init`` of a local Ray) are here, so that every Ray hpcrl
starts, and the tests' local Ray, match.
"""

from __future__ import annotations

from types import MappingProxyType

# Ray's RayConfig flag; its default (true) prestarts the idle workers described above.
NO_PRESTART_ENV = MappingProxyType({"RAY_prestart_worker_first_driver": "0"})


def local_ray_system_config() -> dict[str, bool]:
    """``ray.init(_system_config=...)`` for a local Ray: the same switch as NO_PRESTART_ENV."""
    return {"prestart_worker_first_driver": False}

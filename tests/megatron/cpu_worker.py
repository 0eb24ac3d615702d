"""``MegatronWorker`` for CPU test runs inside Ray actors (test-only).

The real worker class; it only installs the test CPU patch layer (and TE stand-in) in its
process before setup and in the spawned converter. Tests point the backend registry at it:
``monkeypatch.setitem(hpcrl.core.backends.WORKER_CLASS_PATHS, "megatron", CPU_WORKER_PATH)``.
"""

from __future__ import annotations

from hpcrl.core.backends.megatron.worker import MegatronWorker
from tests.megatron.harness import prepare_cpu_process

CPU_WORKER_PATH = "tests.megatron.cpu_worker:CpuMegatronWorker"


class CpuMegatronWorker(MegatronWorker):
    converter_prepare = staticmethod(prepare_cpu_process)

    def setup(self, recipe, rank_info, model_path):
        prepare_cpu_process()
        return super().setup(recipe, rank_info, model_path)

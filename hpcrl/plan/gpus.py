"""The GPUs of this machine, for local GPU profiles (``scheduler: local``, ``device: gpu``).

Found without importing torch: ``CUDA_VISIBLE_DEVICES`` when the user set it (those GPUs and
no others), else the NVIDIA driver's ``/proc/driver/nvidia/gpus/<PCI id>/`` entries, else
``nvidia-smi -L``. The plan records the ids, the rendered script exports them, and submitit's
local executor is told the count (it hides every GPU from the job otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from hpcrl.config.profile import ClusterProfile
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.plan.findings import Findings
from hpcrl.plan.layout import profile_path

PROC_GPUS = "/proc/driver/nvidia/gpus"
NVIDIA_SMI_TIMEOUT_S = 10.0


@attrs.frozen
class LocalGpus(SharedMethods):
    """GPU ids as ``CUDA_VISIBLE_DEVICES`` lists them (indices, or ``GPU-``/``MIG-`` UUIDs),
    and how they were found (for messages)."""

    ids: tuple[str, ...]
    found_by: str


def parse_visible_devices(text: str) -> tuple[str, ...]:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: ids up to the first invalid one (``-1``
    hides every GPU; an empty value too)."""
    ids = []
    for item in text.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        ids.append(item)
    return tuple(ids)


def detect_local_gpus(
    environ: Mapping[str, str], proc_gpus: str = PROC_GPUS, nvidia_smi: str = "nvidia-smi"
) -> LocalGpus:
    """This machine's usable GPUs (see the module docstring); ``ids`` empty when none."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        value = environ["CUDA_VISIBLE_DEVICES"]
        return LocalGpus(parse_visible_devices(value), f"CUDA_VISIBLE_DEVICES={value!r}")
    proc = Path(proc_gpus)
    if proc.is_dir():
        count = sum(1 for entry in proc.iterdir() if entry.is_dir())
        return LocalGpus(tuple(str(index) for index in range(count)), f"{proc_gpus}/")
    return _nvidia_smi_gpus(nvidia_smi)


def _nvidia_smi_gpus(nvidia_smi: str) -> LocalGpus:
    import subprocess  # here: a command that starts no process skips its import (~4 ms)

    try:
        result = subprocess.run(
            [nvidia_smi, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return LocalGpus((), f"no {PROC_GPUS}/ and no usable {nvidia_smi} ({error})")
    # "GPU 0: NVIDIA H200 (UUID: GPU-...)"; MIG devices are indented under their GPU.
    count = sum(1 for line in result.stdout.splitlines() if line.startswith("GPU "))
    return LocalGpus(tuple(str(index) for index in range(count)), f"{nvidia_smi} -L")


def resolve_local_gpus(
    profile: ClusterProfile, local_gpus: LocalGpus | None, findings: Findings
) -> tuple[ClusterProfile, tuple[str, ...] | None]:
    """A profile whose ``gpus_per_node`` is a number, and the GPU ids a local job gets.

    Local GPU profiles take the first ``gpus_per_node`` of this machine's GPUs (all of them
    for ``auto``); other profiles get no ids (Slurm hands out the GPUs).
    """
    auto = profile.gpus_per_node == "auto"
    if profile.scheduler != "local" or profile.device != "gpu":
        if auto:  # the profile rules reject this; a directly built profile may still hold it
            findings.error(
                profile_path(profile, "gpus_per_node"),
                "auto only counts the GPUs of this machine (scheduler: local, device: gpu)",
                value="auto",
                fix="set gpus_per_node to the GPUs of one node",
            )
            profile = attrs.evolve(profile, gpus_per_node=1)
        return profile, None
    assert local_gpus is not None, "describe_submit_host probes GPUs for local GPU profiles"
    found = len(local_gpus.ids)
    wanted = found if auto else int(profile.gpus_per_node)
    if found == 0 or wanted > found:
        findings.error(
            profile_path(profile, "gpus_per_node"),
            f"this machine offers {found} GPU(s) (found by {local_gpus.found_by})",
            value=profile.gpus_per_node,
            fix="set gpus_per_node to at most the GPUs here (or unset CUDA_VISIBLE_DEVICES), "
            "or use --cluster local to run on the CPU",
        )
        wanted = max(wanted, 1)
    return attrs.evolve(profile, gpus_per_node=wanted), local_gpus.ids[:wanted]

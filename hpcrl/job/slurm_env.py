"""What a task learns about its job from Slurm's environment (or, without Slurm, about itself):
the one reader of the scheduler's variables (``SLURM_*``, submitit's local job id), as
submitit's ``JobEnvironment`` is for submitit. Everything else of the job takes a ``SlurmTask``
(tests/job/test_settings.py checks no other module of hpcrl reads a ``SLURM_*`` variable).

Kept free of Ray and subprocesses so it can be tested with plain dictionaries.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from typing import TypedDict

import attrs

from hpcrl.job.errors import NodeSettingsError
from hpcrl.run.attempt_banner import attempt_banner

_BRACKET = re.compile(r"\[([^\]]*)\]")
#: Set by the task (``hpcrl.job.node_task.NodeTask``) from its submission: how many
#: attempts the run's earlier jobs made (``hpcrl resume`` submits a new job into the folder).
ATTEMPT_OFFSET_VARIABLE = "HPCRL_ATTEMPT_OFFSET"


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list (``n[1-3,7],gpu[01-02]-ib``) as host names, in order."""
    hosts: list[str] = []
    for group in _split_top_level(hostlist.strip()):
        hosts.extend(_expand_group(group))
    return hosts


def _split_top_level(hostlist: str) -> list[str]:
    groups, depth, current = [], 0, ""
    for char in hostlist:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            groups.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise NodeSettingsError(f"unbalanced brackets in Slurm host list {hostlist!r}")
    return [group for group in groups + [current] if group]


def _expand_group(group: str) -> list[str]:
    match = _BRACKET.search(group)
    if match is None:
        return [group]
    prefix, suffix = group[: match.start()], group[match.end() :]
    names = []
    for item in match.group(1).split(","):
        low, dash, high = item.partition("-")
        if not dash:
            names.append(prefix + low + suffix)
            continue
        width = len(low)  # Slurm keeps leading zeros: gpu[01-03] -> gpu01, gpu02, gpu03
        names.extend(
            f"{prefix}{number:0{width}d}{suffix}" for number in range(int(low), int(high) + 1)
        )
    return [host for name in names for host in _expand_group(name)]


@attrs.frozen(kw_only=True)
class SlurmTask:
    """This task's place in the job. ``job_id`` is ``local<pid>`` outside Slurm."""

    job_id: str
    attempt: int  # SLURM_RESTART_COUNT: 0, then 1, 2, ... after each requeue
    node_rank: int
    num_nodes: int
    node_name: str
    node_names: tuple[str, ...]
    in_slurm: bool = True
    attempt_offset: int = 0  # attempts of the run's earlier jobs (hpcrl resume)
    array_job_id: str | None = None  # SLURM_ARRAY_JOB_ID / _TASK_ID: a sweep's array task
    array_task_id: str | None = None

    @property
    def run_attempt(self) -> int:
        """This attempt's number in the run, from 0 (``logs/node<k>/attempt<r>/``): the
        run's earlier jobs' attempts come first."""
        return self.attempt_offset + self.attempt

    @property
    def head_name(self) -> str:
        return self.node_names[0]

    @property
    def attempt_id(self) -> str:
        """Identifies one run of the job; markers from other attempts are stale."""
        return f"{self.job_id}.{self.attempt}"


def read_slurm_task(environ: Mapping[str, str], requeue_count: int = 0) -> SlurmTask:
    """Read the task's place from SLURM_* variables; one local node when they are absent.

    ``requeue_count`` numbers the attempt where Slurm does not (SLURM_RESTART_COUNT): submitit's
    local executor restarts a requeued job in a new process of the same job.
    """
    if "SLURM_JOB_ID" not in environ or "SLURM_NODEID" not in environ:
        name = socket.gethostname()
        job_id = environ.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getpid())
        return SlurmTask(
            job_id=f"local{job_id}", attempt=requeue_count, node_rank=0, num_nodes=1,
            node_name=name, node_names=(name,), in_slurm=False,
            attempt_offset=_attempt_offset(environ), **_array_ids(environ),
        )  # fmt: skip
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "")
    node_names = tuple(expand_hostlist(nodelist))
    num_nodes = int(environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES") or 0)
    if not node_names or len(node_names) != num_nodes:
        raise NodeSettingsError(
            f"SLURM_JOB_NODELIST={nodelist!r} names {len(node_names)} hosts but SLURM_NNODES="
            f"{num_nodes}; run one srun task per node (srun --ntasks-per-node=1)"
        )
    node_rank = int(environ["SLURM_NODEID"])
    return SlurmTask(
        job_id=environ["SLURM_JOB_ID"],
        attempt=int(environ.get("SLURM_RESTART_COUNT") or requeue_count),
        node_rank=node_rank,
        num_nodes=num_nodes,
        node_name=environ.get("SLURMD_NODENAME") or node_names[node_rank],
        node_names=node_names,
        attempt_offset=_attempt_offset(environ),
        **_array_ids(environ),
    )


class _ArrayIds(TypedDict):
    array_job_id: str | None
    array_task_id: str | None


def _array_ids(environ: Mapping[str, str]) -> _ArrayIds:
    return {
        "array_job_id": environ.get("SLURM_ARRAY_JOB_ID"),
        "array_task_id": environ.get("SLURM_ARRAY_TASK_ID"),
    }


def shown_job_id(environ: Mapping[str, str]) -> str:
    """The job's id as hpcrl shows it: ``20_3`` for array task 3 of array 20 (Slurm gives each
    task an id of its own, e.g. 23, that no hpcrl command shows), else the job id."""
    array_job, array_task = _array_ids(environ).values()
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return environ.get("SLURM_JOB_ID") or environ.get("SUBMITIT_LOCAL_JOB_ID", "?")


def banner_of(environ: Mapping[str, str], attempt_offset: int = 0) -> str:
    """This task's attempt banner (``hpcrl.run.attempt_banner``), from its environment alone:
    it is printed before anything of the job could fail on a bad host list."""
    attempt = attempt_offset + int(environ.get("SLURM_RESTART_COUNT") or "0") + 1
    node = environ.get("SLURM_NODEID", "0")
    return attempt_banner(shown_job_id(environ), attempt, node)


def _attempt_offset(environ: Mapping[str, str]) -> int:
    text = environ.get(ATTEMPT_OFFSET_VARIABLE, "")
    return int(text) if text.isdigit() else 0

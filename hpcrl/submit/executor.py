"""submitit executors whose submitted script is the one ``hpcrl render`` wrote.

submitit writes its own sbatch text in ``SlurmExecutor._make_submission_file_text(command,
uid)``, a private method. ``RenderedSlurmExecutor`` overrides it to return the rendered
``job.sbatch`` text unchanged, so what users read is what runs. Because the hook is private,
the submitit version is pinned (setup.cfg) and ``check_submitit_hook`` fails loudly when the
installed submitit no longer has the hook with the expected signature.

Job arrays: ``SlurmExecutor._internal_process_submissions`` builds a *plain* SlurmExecutor
for arrays (so a subclass's script would be bypassed); this subclass handles arrays itself,
with the same file layout submitit uses (``<A>_<a>_submitted.pkl``, ``<A>_submission.sh``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import shlex
import shutil
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import submitit
from submitit.core import utils as submitit_utils
from submitit.local import local as submitit_local
from submitit.slurm.slurm import SlurmJob

from hpcrl.config.errors import UserError

PINNED_SUBMITIT_VERSION = "1.5.4"

# (executor class, member, parameter names) this module overrides or calls; all private to
# submitit. An empty parameter tuple: a property.
_PRIVATE_HOOKS: tuple[tuple[type, str, tuple[str, ...]], ...] = (
    (submitit.SlurmExecutor, "_make_submission_file_text", ("self", "command", "uid")),
    (submitit.SlurmExecutor, "_internal_process_submissions", ("self", "delayed_submissions")),
    (submitit.SlurmExecutor, "_submit_command", ("self", "command")),
    (submitit.SlurmExecutor, "_make_submission_command", ("self", "submission_file_path")),
    (submitit.SlurmExecutor, "_submitit_command_str", ()),
    (submitit.LocalExecutor, "_submitit_command_str", ()),
    (submitit.LocalExecutor, "_submit_command", ("self", "command")),
)


class SubmititHookError(UserError):
    """The installed submitit lacks the private hooks hpcrl overrides."""


class ScriptCommandMismatch(RuntimeError):
    """submitit would run a command other than the one written in the rendered script."""


def check_submitit_hook() -> None:
    """Raise SubmititHookError unless submitit's private script hooks are as expected."""
    problems = []
    for executor_class, name, expected_params in _PRIVATE_HOOKS:
        where = f"{executor_class.__name__}.{name}"
        member = inspect.getattr_static(executor_class, name, None)
        if member is None or getattr(member, "__isabstractmethod__", False):
            problems.append(f"{where} is missing (or only abstract)")
        elif not expected_params and not isinstance(member, property):
            problems.append(f"{where} is no longer a property")
        elif expected_params and tuple(inspect.signature(member).parameters) != expected_params:
            found = tuple(inspect.signature(member).parameters)
            problems.append(f"{where}{found} != expected {expected_params}")
    version = getattr(submitit, "__version__", "unknown")
    if problems:
        raise SubmititHookError(
            f"hpcrl needs submitit=={PINNED_SUBMITIT_VERSION} (installed: {version}); its "
            "private script-writing hook changed: " + "; ".join(problems) + ". Fix: "
            f"pip install submitit=={PINNED_SUBMITIT_VERSION}"
        )


def time_limit_to_min(time_limit: str) -> int:
    """Slurm's time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in whole minutes."""
    days_text, dash, clock = time_limit.partition("-")
    try:
        days = int(days_text) if dash else 0
        parts = [int(part) for part in (clock if dash else days_text).split(":")]
    except ValueError:
        raise ValueError(f"not a Slurm time limit: {time_limit!r} (use [D-]HH:MM:SS)") from None
    if len(parts) > 3:
        raise ValueError(f"not a Slurm time limit: {time_limit!r} (use [D-]HH:MM:SS)")
    if dash:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:
        hours, minutes, seconds = 0, parts[0], (parts[1:] or [0])[0]
    total_s = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return max(1, -(-total_s // 60))


class RenderedSlurmExecutor(submitit.SlurmExecutor):
    """A SlurmExecutor that submits an already-rendered sbatch script.

    ``script_text`` must run ``task_command`` once per task (the renderer puts
    ``JobSpec.task_command`` in it); the hook checks that submitit asks for that same command,
    so the pickled callable in ``folder`` is what the script runs. ``array_size``: the script
    declares ``#SBATCH --array=0-<array_size-1>%P`` and every submission is one array task.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        script_text: str,
        task_command: str,
        python: str,
        num_nodes: int,
        tasks_per_node: int,
        time_limit_min: int,
        max_requeues: int,
        array_size: int | None = None,
        sbatch_timeout_s: float | None = None,
    ) -> None:
        check_submitit_hook()
        super().__init__(folder, max_num_timeout=max_requeues, python=python)
        self._script_text = script_text
        self._sbatch_timeout_s = sbatch_timeout_s
        self._task_command = task_command
        self._array_size = array_size
        # Only submitit's own bookkeeping reads these (task count for results, time limit
        # for its timed-out-vs-preempted decision); the script text is not derived from them.
        self.update_parameters(nodes=num_nodes, ntasks_per_node=tasks_per_node, time=time_limit_min)

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        if command != self._task_command:
            raise ScriptCommandMismatch(
                "the rendered job.sbatch runs a different command than submitit expects:\n"
                f"  rendered: {self._task_command}\n  submitit: {command}\n"
                "The submitit folder or python in the JobSpec differs from the executor's."
            )
        return self._script_text

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        """``sbatch <script>``, under coreutils' ``timeout`` when a limit is set: submitit
        waits for sbatch without one, and a controller that never answers would hang hpcrl
        (exit code 124: the limit passed, 137: it ignored the TERM and was killed 5 s later)."""
        command = ["sbatch", str(submission_file_path)]
        if self._sbatch_timeout_s is None or shutil.which("timeout") is None:
            return command
        return ["timeout", "--kill-after=5", f"{self._sbatch_timeout_s:g}", *command]

    def _internal_process_submissions(
        self, delayed_submissions: list[submitit_utils.DelayedSubmission]
    ) -> list[submitit.Job[Any]]:
        if self._array_size is None:
            if len(delayed_submissions) != 1:
                raise ValueError("this executor's script is not an array; submit one job")
            return super()._internal_process_submissions(delayed_submissions)
        if len(delayed_submissions) != self._array_size:
            raise ValueError(
                f"the rendered array script has {self._array_size} tasks, "
                f"got {len(delayed_submissions)} submissions"
            )
        return self._submit_array(delayed_submissions)

    def _submit_array(
        self, delayed_submissions: list[submitit_utils.DelayedSubmission]
    ) -> list[submitit.Job[Any]]:
        # Mirrors SlurmExecutor's array branch, but submits through self (the rendered script).
        folder = submitit_utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        pickle_paths = []
        for delayed in delayed_submissions:
            pickle_path = folder / f"{uuid.uuid4().hex}.pkl"
            delayed.set_timeout(self.parameters["time"], self.max_num_timeout)
            delayed.dump(pickle_path)
            pickle_paths.append(pickle_path)
        self._throttle()
        first_job = self._submit_command(self._submitit_command_str)
        task_ids = list(range(first_job.num_tasks))
        jobs: list[submitit.Job[Any]] = [
            SlurmJob(folder=self.folder, job_id=f"{first_job.job_id}_{index}", tasks=task_ids)
            for index in range(len(delayed_submissions))
        ]
        for job, pickle_path in zip(jobs, pickle_paths, strict=True):
            job.paths.move_temporary_file(pickle_path, "submitted_pickle")
        return jobs


class RenderedLocalExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor (one task in a subprocess here, ``--cluster local``) running
    the rendered local script, so the job gets the same environment lines as on Slurm.

    submitit starts ``_submitit_command_str`` once per task; here that is ``bash <script>``,
    and the script ``exec`` s the task command (checked to be submitit's own command).
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        script_path: Path,
        task_command: str,
        python: str,
        time_limit_min: int,
        max_requeues: int,
        visible_gpus: tuple[str, ...] = (),
    ) -> None:
        check_submitit_hook()
        super().__init__(folder, max_num_timeout=max_requeues, python=python)
        own_command = super()._submitit_command_str
        if own_command != task_command or task_command not in Path(script_path).read_text():
            raise ScriptCommandMismatch(
                f"{script_path} must run submitit's task command:\n  {own_command}\n"
                f"rendered task command: {task_command}"
            )
        self._script_path = Path(script_path).absolute()
        self.update_parameters(timeout_min=time_limit_min, tasks_per_node=1, nodes=1)
        # submitit sets the controller's CUDA_VISIBLE_DEVICES from these and hides every GPU
        # without them; the script exports the same ids (UUIDs too, which submitit cannot take).
        if visible_gpus:
            indices = [int(gpu) for gpu in visible_gpus if gpu.isdigit()]
            gpus = {"visible_gpus": indices} if len(indices) == len(visible_gpus) else {}
            self.update_parameters(gpus_per_node=len(visible_gpus), **gpus)

    @property
    def _submitit_command_str(self) -> str:
        return shlex.join(["bash", str(self._script_path)])

    def _submit_command(self, command: str) -> Any:
        """submitit's own start of the job's controller, in a session of its own: a local
        job outlives its terminal as a Slurm job does, so Ctrl-C on ``--wait`` (the
        terminal's SIGINT reaches its whole foreground process group) detaches from the job
        instead of interrupting it; ``hpcrl cancel`` signals the controller by pid."""
        with _popen_in_new_session(submitit_local):
            return super()._submit_command(command)


@contextlib.contextmanager
def _popen_in_new_session(module: Any) -> Iterator[None]:
    """``module.subprocess.Popen`` starts its process in a new session while inside. submitit
    starts the local controller through ``subprocess.Popen`` (``submitit.local.local``'s
    ``start_controller``, no option for it): only that module's name is swapped, never the
    ``subprocess`` module itself."""
    real = module.subprocess
    if not hasattr(real, "Popen"):
        raise SubmititHookError(
            f"hpcrl needs submitit=={PINNED_SUBMITIT_VERSION}: submitit.local.local no longer "
            f"starts its controller through subprocess.Popen. Fix: pip install "
            f"submitit=={PINNED_SUBMITIT_VERSION}"
        )
    members = {name: getattr(real, name) for name in dir(real) if not name.startswith("__")}
    members["Popen"] = functools.partial(real.Popen, start_new_session=True)
    module.subprocess = types.SimpleNamespace(**members)
    try:
        yield
    finally:
        module.subprocess = real

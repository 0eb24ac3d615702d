"""Before Ray starts, on every node: can this Python run this job?

Reads what the plan (the typed ``JobSpec`` of jobspec.json; a missing or unreadable plan, or
one another hpcrl wrote, fails here too) says the job's Python must have
(``JobSpec.code.requirements``) and looks
each package up by its metadata (``importlib.metadata``: nothing heavy is imported, so this
takes well under a second), checks that hpcrl itself comes from where the plan says (the code
bundle, or an installed hpcrl of the planned version), and logs which Python runs and where
hpcrl was imported from. On any problem it writes ``status/node<k>.failed`` (other nodes stop
at once, ``hpcrl status`` and ``submit --wait`` show the line) and raises ``PreflightFailed``
naming every missing or out-of-range package and the fix, before a Ray timeout could hide it.
With ``ray_auth: token`` it also refuses a Ray older than token authentication (2.52): such a
Ray would ignore ``RAY_AUTH_MODE`` and run the job's cluster open to anyone who reaches it. A
Ray without package metadata (version unknown) must show the token-authentication package in
its files instead. Once the packages are there it checks the machine against the plan, for the
training driver (``hpcrl.core.machine_checks``: CUDA for a GPU plan, Transformer Engine for the
Megatron settings that need it), once per node, so no worker checks it again; a stand-in
driver (``HPCRL_DRIVER``) trains nothing and needs none of it.
"""

from __future__ import annotations

import datetime
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

import attrs

import hpcrl
from hpcrl.config.errors import Problem
from hpcrl.job.errors import PreflightFailed
from hpcrl.job.settings import DEFAULT_DRIVER, DRIVER_VARIABLE
from hpcrl.job.slurm_env import SlurmTask, read_slurm_task
from hpcrl.run.jobspec import RAY_TOKEN_AUTH_SPEC, JobCode, JobSpec, PackageRequirement
from hpcrl.run.jobspec_file import JobSpecError, read_jobspec
from hpcrl.run.markers import failed_marker_name, node_log_dir, write_marker
from hpcrl.run.versions import in_range

BUNDLE_VARIABLE = "HPCRL_CODE_BUNDLE"  # set by the bundle's entry script
#: Where Ray keeps its token authentication (Ray 2.60; absent from 2.49): the evidence for a Ray
#: without package metadata, whose version cannot be compared.
TOKEN_AUTH_PACKAGE = "ray._private.authentication"


@attrs.frozen
class PackageCheck:
    """One requirement as found: ``version`` None when missing; ``problem`` empty when fine."""

    requirement: PackageRequirement
    distribution: str
    version: str | None
    problem: str = ""

    def line(self) -> str:
        name, spec = self.requirement.distributions[0], self.requirement.spec
        found = f"{self.distribution} {self.version}" if self.version else name
        if not self.problem and self.version is None:
            found += " (imports; no package metadata, version unknown)"
        status = "ok" if not self.problem else self.problem.upper()
        return f"{status:<14} {found} (needs {spec}; {self.requirement.needed_for})"


@attrs.frozen
class PreflightInputs:
    """The parts of the plan the check needs: the code plan, the container image, the
    profile's ``ray_auth``, and the plan itself for the machine checks (None: none run)."""

    code: JobCode
    container_image: str | None
    ray_auth: str = "token"
    jobspec: JobSpec | None = None


def read_inputs(run_dir: Path) -> PreflightInputs:
    """``code`` and the container image of the run folder's typed ``JobSpec``."""
    spec = read_jobspec(run_dir)
    image = spec.container.image if spec.container is not None else None
    return PreflightInputs(
        code=spec.code, container_image=image, ray_auth=spec.ray_auth, jobspec=spec
    )


def check_package(
    requirement: PackageRequirement,
    version_of: Callable[[str], str] = importlib.metadata.version,
    module_found: Callable[[str], bool] | None = None,
) -> PackageCheck:
    """The requirement as this Python has it (by its metadata; the module when there is none)."""
    module_found = module_found or _module_found
    for name in requirement.distributions:
        try:
            version = version_of(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        problem = "" if in_range(version, requirement.spec) else "out of range"
        return PackageCheck(requirement, name, version, problem)
    name = requirement.distributions[0]
    if module_found(requirement.module):
        return PackageCheck(requirement, name, None, "")  # importable, but no metadata
    return PackageCheck(requirement, name, None, "missing")


def _module_found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def check_code(code: JobCode, environ: Mapping[str, str]) -> tuple[str, list[Problem]]:
    """(where hpcrl came from, problems): the bundle's hpcrl, or the planned version."""
    imported_from = str(Path(hpcrl.__file__).parent)
    if code.bundle is not None:
        bundle = code.bundle.path
        where = f"the bundle {bundle}"
        if not imported_from.startswith(bundle.rstrip("/") + "/"):
            return where, [
                Problem(
                    path="code",
                    value="bundle",
                    message=f"hpcrl was imported from {imported_from}, not from the bundle "
                    f"{bundle} ({BUNDLE_VARIABLE}={environ.get(BUNDLE_VARIABLE, 'unset')})",
                    fix=f"start the task through {bundle}/hpcrl_entry.py",
                )  # fmt: skip
            ]
        return where, []
    where = f"{imported_from} (installed)"
    if hpcrl.__version__ != code.hpcrl_version:
        return where, [
            Problem(
                path="code",
                value="installed",
                message=f"the job's Python has hpcrl {hpcrl.__version__} but hpcrl "
                f"{code.hpcrl_version} planned the job",
                fix="set code: bundle in the cluster profile (the job then runs the planning "
                "hpcrl), or install that version for the job's Python",
            )  # fmt: skip
        ]
    return where, []


def check_ray_auth_support(
    checks: list[PackageCheck],
    inputs: PreflightInputs,
    has_token_auth: Callable[[], bool] | None = None,
) -> tuple[str, list[Problem]]:
    """(log line, problems): whether the Ray found can enforce the job's token. Nothing to say
    with ``ray_auth: none`` or when Ray is missing (reported above). A Ray without package
    metadata is judged by its files (``has_token_auth``), never let through unchecked."""
    ray = next((c for c in checks if c.distribution == "ray" and c.problem != "missing"), None)
    if inputs.ray_auth != "token" or ray is None:
        return "", []
    wanted = f"ray{RAY_TOKEN_AUTH_SPEC}"
    if ray.version is not None:
        about = f"Ray token authentication (ray {ray.version}; ray_auth: token needs {wanted})"
        if in_range(ray.version, RAY_TOKEN_AUTH_SPEC):
            return f"ok             {about}", []
        status, finding = "TOO OLD", f"ray {ray.version} predates Ray token authentication"
    else:
        about = f"Ray token authentication (ray version unknown; its {TOKEN_AUTH_PACKAGE})"
        if (has_token_auth or ray_has_token_auth)():
            return f"ok             {about}", []
        status = "NOT FOUND"
        finding = (
            f"this ray (no package metadata) has no {TOKEN_AUTH_PACKAGE}, so no token "
            "authentication"
        )
    if inputs.container_image is not None:
        newer = f"use a container image with {wanted} (the profile's container.image)"
    else:
        newer = f"install {wanted} for the job's Python"
    problem = Problem(
        path="ray_auth", value="token",
        message=f"{finding} ({wanted}), which the cluster profile's ray_auth: token (the "
        "default) needs",
        fix=f"{newer}, or set ray_auth: none in the cluster profile to run the job's Ray "
        "without authentication (anyone who reaches its ports can then run code as you)",
    )  # fmt: skip
    return f"{status:<14} {about}", [problem]


def ray_has_token_auth(search_path: list[str] | None = None) -> bool:
    """Whether the ``ray`` package holds its token-authentication code (``TOKEN_AUTH_PACKAGE``),
    read from its files: the package is located, not imported. ``search_path``: the folders to
    look in instead of this Python's import path."""
    try:
        if search_path is None:
            spec = importlib.util.find_spec("ray")
        else:
            spec = importlib.machinery.PathFinder.find_spec("ray", search_path)
    except (ImportError, ValueError):
        return False
    folders = (spec.submodule_search_locations or []) if spec is not None else []
    relative = Path(*TOKEN_AUTH_PACKAGE.split(".")[1:], "__init__.py")
    return any((Path(folder) / relative).is_file() for folder in folders)


def package_problems(checks: list[PackageCheck], inputs: PreflightInputs) -> list[Problem]:
    """A ``Problem`` per missing or out-of-range package. ``path`` is the profile key that
    chose the job's Python (``container.image``, or ``python`` without a container), ``value``
    what it holds, ``message`` which package is wrong and what needs it, ``fix`` what to
    change (the bundle as well, for a pure-Python package)."""
    return [_package_problem(check, inputs) for check in checks if check.problem]


def _package_problem(check: PackageCheck, inputs: PreflightInputs) -> Problem:
    wanted, needed_for = _wanted(check), check.requirement.needed_for
    if check.version:
        message = f"{check.distribution} {check.version} is outside {wanted} ({needed_for})"
    else:
        message = f"{check.distribution} is missing ({needed_for} needs {wanted})"
    if inputs.container_image is not None:
        path, value = "container.image", inputs.container_image
        fix = f"use a container image with {wanted} (the profile's container.image)"
    else:
        path, value = "python", " ".join(inputs.code.python)
        fix = f"install {wanted} for this Python, or set the profile's python to one that has it"
    if check.requirement.pure_python:
        fix += (
            f"; pure-Python {wanted} can come with the code bundle instead: install it where "
            "hpcrl runs and list it in the profile's bundle_packages (with code: bundle)"
        )
    return Problem(path=path, value=value, message=message, fix=fix)


def _wanted(check: PackageCheck) -> str:
    return f"{check.requirement.distributions[0]}{check.requirement.spec}"


def failure_summary(problems: list[Problem]) -> str:
    """One line for the failure marker, ``hpcrl status`` and the task's stderr: which Python,
    then every problem (``Problem.one_line``), numbered when there are several."""
    lines = [problem.one_line() for problem in problems]
    listed = (
        lines[0]
        if len(lines) == 1
        else " ".join(f"({n}) {line}" for n, line in enumerate(lines, 1))
    )
    return f"{sys.executable} (Python {sys.version.split()[0]}) cannot run this job: {listed}"


def run_preflight(run_dir: str, environ: Mapping[str, str], requeue_count: int = 0) -> None:
    """Check this node; log the findings; on a problem mark the node failed and raise."""
    run_path = Path(run_dir)
    task = read_slurm_task(environ, requeue_count)
    python = f"preflight: python {sys.executable} (Python {sys.version.split()[0]})"
    try:
        inputs = read_inputs(run_path)
    except JobSpecError as error:  # no plan, or one this hpcrl cannot read: nothing to check
        _fail(run_path, task, [f"{python}; hpcrl {hpcrl.__version__}"], [], str(error))
    checks = [check_package(requirement) for requirement in inputs.code.requirements]
    hpcrl_from, code_problems = check_code(inputs.code, environ)
    auth_line, auth_problems = check_ray_auth_support(checks, inputs)
    problems = package_problems(checks, inputs) + code_problems + auth_problems
    report = [
        f"{python}; hpcrl {hpcrl.__version__} from {hpcrl_from}",
        *(f"preflight: {check.line()}" for check in checks),
        *([f"preflight: {auth_line}"] if auth_line else []),
    ]
    if problems:  # the machine checks below import torch: only once the packages are there
        _fail(run_path, task, report, problems)
    machine_line, machine_problems = check_machine(inputs, environ)
    report += [f"preflight: {machine_line}"] if machine_line else []
    if machine_problems:
        _fail(run_path, task, report, machine_problems)
    _log(run_path, task, report)


def check_machine(inputs: PreflightInputs, environ: Mapping[str, str]) -> tuple[str, list[Problem]]:
    """(log line, problems): whether this node can run what the training driver will build
    (``hpcrl.core.machine_checks``). Nothing to check for a stand-in driver."""
    driver = environ.get(DRIVER_VARIABLE) or DEFAULT_DRIVER
    if inputs.jobspec is None or driver != DEFAULT_DRIVER:
        return "", []
    from hpcrl.core.machine_checks import machine_problems  # after torch was found above

    problems = machine_problems(inputs.jobspec)
    device = inputs.jobspec.device
    status = "ok" if not problems else "UNSUPPORTED"
    return f"{status:<14} this machine for the plan (device: {device})", problems


def _fail(
    run_dir: Path,
    task: SlurmTask,
    report: list[str],
    problems: list[Problem],
    summary: str | None = None,
) -> NoReturn:
    """Log, mark the node failed (other nodes and ``hpcrl status`` see the line) and raise
    ``PreflightFailed`` holding the problems. ``summary``: the line to report instead of the
    problems' (a plan this hpcrl cannot read, which has no key to name)."""
    summary = summary or failure_summary(problems)
    several = [f"preflight: problem: {p.one_line()}" for p in problems] if len(problems) > 1 else []
    _log(run_dir, task, [*report, *several, f"preflight FAILED: {summary}"])
    write_marker(run_dir, failed_marker_name(task.node_rank), task.attempt_id,
                 message=f"preflight on node {task.node_rank} ({task.node_name}): {summary}")  # fmt: skip
    sys.excepthook = _quiet_hook(sys.excepthook)
    raise PreflightFailed(summary, problems)


def _log(run_dir: Path, task: SlurmTask, lines: list[str]) -> None:
    """Into the node log (the node entrypoint appends to it later) and the task's stderr."""
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    text = "".join(f"{now} node{task.node_rank} INFO {line}\n" for line in lines)
    log_dir = node_log_dir(run_dir, task.node_rank, task.run_attempt)
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "node.log", "a") as log:
        log.write(text)
    sys.stderr.write(text)
    sys.stderr.flush()


def _quiet_hook(previous):
    """The failure is already logged in full: at exit print its one line, not a traceback
    through submitit's frames (submitit re-raises it after recording it as the result)."""

    def hook(kind, value, traceback):
        if isinstance(value, PreflightFailed):
            sys.stderr.write(f"hpcrl: preflight failed: {value}\n")
            return
        previous(kind, value, traceback)

    return hook

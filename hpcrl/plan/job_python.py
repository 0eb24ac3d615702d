"""``hpcrl validate`` on a local profile without a container: does the job's Python have what
the job needs (``JobSpec.code.requirements``, the table of ``hpcrl.plan.requirements``: vLLM
for vLLM generation, megatron-core/bridge for the Megatron backend, torch and Ray always)?

The job's own preflight checks the same on every node before Ray starts; this asks that
Python before anything runs (``hpcrl.plan.package_probe``: the metadata folders on its import
path and, for a package without metadata, the module's files; nothing is imported), in this
process when the job's Python is this interpreter, else in one subprocess of it. With a
container (or a Slurm profile, whose nodes may differ from this machine) the job's preflight
is the check.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hpcrl.config.errors import Problem
from hpcrl.plan import package_probe
from hpcrl.run.jobspec import RAY_TOKEN_AUTH_SPEC, JobSpec, PackageRequirement

PROBE_TIMEOUT_S = 30


def checkable(spec: JobSpec) -> bool:
    return spec.scheduler == "local" and spec.container is None


def probe_versions(
    python: tuple[str, ...], requirements: tuple[PackageRequirement, ...]
) -> dict[str, str | None] | str:
    """{module: version} as the job's Python has them, or why it could not be asked.

    The job's Python is most often the interpreter running hpcrl (a local profile's default):
    then its own import path is read here, without a subprocess (starting one cost a quarter of
    ``hpcrl validate``'s time, more where the environment's start-up is slow)."""
    rows = [[list(r.distributions), r.module] for r in requirements]
    if len(python) == 1 and os.path.abspath(python[0]) == os.path.abspath(sys.executable):
        return package_probe.probe(rows, sys.path)
    import subprocess  # here: the usual answer (this interpreter) starts no process

    script = Path(package_probe.__file__).read_text(encoding="utf-8")
    try:
        proc = subprocess.run([*python, "-c", script, json.dumps(rows)], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as error:
        return f"cannot run {' '.join(python)}: {error}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return f"{' '.join(python)} exited {proc.returncode}: {last}"
    try:
        return dict(json.loads(proc.stdout))
    except (ValueError, TypeError):
        return f"{' '.join(python)} answered {proc.stdout[:80]!r}"


def check_job_python(spec: JobSpec) -> list[Problem]:
    """An error per package the job's Python lacks or has out of range (local profiles)."""
    if not checkable(spec) or not spec.code.requirements:
        return []
    from hpcrl.run.versions import in_range  # the preflight's own comparison (pure Python)

    python = " ".join(spec.code.python)
    found = probe_versions(spec.code.python, spec.code.requirements)
    if isinstance(found, str):
        return [Problem(path="python", value=python, severity="warning",
                        message=f"could not check the job's Python: {found}",
                        fix="set the profile's python to an interpreter that runs")]  # fmt: skip
    problems = []
    for requirement in spec.code.requirements:
        version = found.get(requirement.module)
        wanted = f"{requirement.distributions[0]}{requirement.spec}"
        if version is None:
            message = f"the job's Python lacks {requirement.distributions[0]} ({requirement.needed_for} needs {wanted})"
        elif version and not in_range(version, requirement.spec):
            message = f"the job's Python has {requirement.distributions[0]} {version}, outside {wanted} ({requirement.needed_for})"
        else:
            continue
        problems.append(Problem(
            path="python", value=python, message=message,
            fix=f"install {wanted} for that Python, or set the profile's python to one that has it",
        ))  # fmt: skip
    return problems + _token_auth_problems(spec, found.get("ray"), python)


def _token_auth_problems(spec: JobSpec, ray_version: str | None, python: str) -> list[Problem]:
    """The preflight's token-auth refusal, said before the job runs: a Ray older than 2.52
    with ``ray_auth: token`` (a Ray without metadata is left to the preflight's file check)."""
    from hpcrl.run.versions import in_range

    needs = spec.ray_auth_needs
    if needs is None or not ray_version or in_range(ray_version, RAY_TOKEN_AUTH_SPEC):
        return []
    return [Problem(
        path="python", value=python,
        message=f"the job's Python has ray {ray_version}, older than Ray token authentication "
        f"({needs}), which the profile's ray_auth: token (the default) needs",
        fix=f"install {needs} for that Python, or set ray_auth: none in the profile (the "
        "job's Ray then admits anyone who reaches its ports)",
    )]  # fmt: skip

"""The job's Python and the code it runs: ``JobSpec.code``.

- The interpreter: the profile's ``python``; unset, the image's ``python3`` with a container
  and, without one, the interpreter that runs hpcrl (an absolute path, so a node whose PATH
  has another ``python3`` first, or no venv at all, still runs the same Python).
- In a container the command is started through ``/usr/bin/env``: srun looks a command up on
  the host before pyxis enters the image (pyxis issue 104), so a bare ``python3`` would
  become the host's path, e.g. a venv of the submitting shell that the image does not have.
- ``code: bundle`` runs hpcrl from the bundle (``hpcrl.plan.bundle``), mounted read-only at
  the same path when no mount shows it there; ``code: installed`` trusts the job's Python.
- What the job's Python must provide (``hpcrl.plan.requirements``) is checked in the job.
"""

from __future__ import annotations

import shlex

from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe
from hpcrl.plan import mounts as mount_checks
from hpcrl.plan.findings import Findings
from hpcrl.plan.layout import profile_path
from hpcrl.plan.requirements import requirements_of
from hpcrl.plan.submit_host import SubmitHost
from hpcrl.run.jobspec import CodeBundle, JobCode

ENV = "/usr/bin/env"


def plan_code(
    recipe: Recipe,
    profile: ClusterProfile,
    host: SubmitHost,
    mounts: list[mount_checks.Mount],
    findings: Findings,
) -> tuple[JobCode, str | None]:
    """The job's code plan, and the container mount to add for the bundle (or None)."""
    words, origin = _python_words(profile, host, findings)
    python = (ENV, *words) if profile.container is not None and words[:1] != (ENV,) else words
    bundle = _plan_bundle(profile, host, findings) if profile.code_mode == "bundle" else None
    extra_mount = None
    if bundle is not None and profile.container is not None:
        extra_mount = mount_checks.same_path_mount(bundle.path, mounts, flags="ro")
    _report(profile, host, bundle, findings)
    code = JobCode(
        mode=profile.code_mode,
        python=python,
        python_origin=origin,
        hpcrl_version=host.hpcrl_version,
        git_sha=host.git_sha,
        bundle=bundle,
        requirements=requirements_of(recipe, profile.device),
    )
    return code, extra_mount


def _python_words(
    profile: ClusterProfile, host: SubmitHost, findings: Findings
) -> tuple[tuple[str, ...], str]:
    if profile.python is not None:
        try:
            words = tuple(shlex.split(profile.python))
        except ValueError:
            words = ()
        if not words:
            findings.error(
                profile_path(profile, "python"),
                "not a command",
                value=profile.python,
                fix="set python to the job's interpreter, e.g. python3 or /opt/venv/bin/python, "
                "or remove it for the default",
            )
            return ("python3",), "the profile's python"
        return words, "the profile's python"
    if profile.container is not None:
        return ("python3",), "the image's python3"
    if not host.python.startswith("/"):
        findings.error(
            profile_path(profile, "python"),
            "unset, and the interpreter running hpcrl has no absolute path to give the job",
            value=host.python,
            fix="set python to the job's interpreter, e.g. /shared/venv/bin/python",
        )
        return ("python3",), "the profile's python"
    return (host.python,), "the interpreter that ran hpcrl"


def _plan_bundle(profile: ClusterProfile, host: SubmitHost, findings: Findings) -> CodeBundle:
    contents = host.bundle
    assert contents is not None, "describe_submit_host collects the bundle for code: bundle"
    for name, reason in contents.problems:
        index = next((i for i, extra in enumerate(profile.bundle_packages) if extra == name), None)
        path = f"bundle_packages[{index}]" if index is not None else "code"
        findings.error(
            profile_path(profile, path),
            f"{name} cannot go into the code bundle: {reason}",
            value=name,
            fix="install it where hpcrl runs"
            if index is None
            else "remove it from bundle_packages (a compiled package must come from the image), "
            "or install it where hpcrl runs",
        )
    path = f"{host.bundles_dir}/hpcrl-{host.hpcrl_version}-{contents.digest}"
    if profile.container is not None and any(ch in path for ch in ",:"):
        findings.error(
            "bundles_dir",
            "the code bundle's folder holds ',' or ':', which pyxis' mount syntax cannot carry",
            value=path,
            fix="keep the runs folder (-o/--out) on a path without ',' or ':'",
        )
    return CodeBundle(
        path=path,
        digest=contents.digest,
        packages=contents.packages,
        extra_packages=contents.extra_packages,
        built_from=contents.built_from,
    )


def _report(
    profile: ClusterProfile, host: SubmitHost, bundle: CodeBundle | None, findings: Findings
) -> None:
    version = f"hpcrl {host.hpcrl_version}"
    if bundle is not None:
        packages = ", ".join(f"{name} {version}" for name, version in bundle.packages)
        findings.passed("code", f"{version} with {packages} from the bundle {bundle.path}")
    else:
        where = "the image's" if profile.container is not None else "the job's"
        findings.passed("code", f"code: installed; {where} Python must have {version}")

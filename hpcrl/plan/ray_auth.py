"""Pre-flight rules for the job's Ray authentication (profile key ``ray_auth``).

With ``ray_auth: token`` (the default) hpcrl alone decides Ray's authentication settings in the
job: a ``RAY_AUTH_*`` variable from the profile or the recipe would replace the job's own token
(``RAY_AUTH_TOKEN`` wins over ``RAY_AUTH_TOKEN_PATH`` in Ray) or turn it off, so it is an error.
``ray_auth: none`` is allowed, and warned about on every command that plans a job.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpcrl.config.env_rules import training_env_vars
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe
from hpcrl.plan.findings import Findings
from hpcrl.plan.images import NEMO_RL_IMAGE_RAY, RECOMMENDED_IMAGE, check_image_ray
from hpcrl.plan.layout import profile_path
from hpcrl.run.jobspec import (
    AUTH_DIR_NAME,
    RAY_AUTH_VARIABLES,
    RAY_TOKEN_AUTH_SPEC,
    TOKEN_FILE_NAME,
)

NO_AUTH_RISK = (
    "Ray token authentication is off: anyone who can reach the job's nodes and finds its Ray "
    "ports (they follow from the job id) can connect to the job's Ray cluster and run code as "
    "you, with the job's GPUs, data and passed-through credentials (pass_env)"
)


def check_ray_auth(recipe: Recipe, profile: ClusterProfile, findings: Findings) -> None:
    """Warn when authentication is off; refuse variables that would override hpcrl's choice."""
    for path, name in _named_variables(recipe, profile):
        if name in RAY_AUTH_VARIABLES:
            findings.error(
                path,
                "hpcrl sets Ray's authentication variables itself (a job's own token, read "
                "from its run folder)",
                value=name,
                fix="remove it; to turn authentication off, set ray_auth: none in the profile",
            )
    found = check_image_ray(profile, findings)
    if profile.ray_auth == "token" and found is not None and not _has_token_auth(found.version):
        findings.error(
            profile_path(profile, "ray_auth"),
            f"token authentication needs ray{RAY_TOKEN_AUTH_SPEC}, and the job's Ray would be "
            f"{found.version} ({found.source}): every node would refuse the job after the "
            "queue wait",
            value="token",
            fix=f"use an image with ray{RAY_TOKEN_AUTH_SPEC}, e.g. container.image: "
            f"{RECOMMENDED_IMAGE} (Ray {NEMO_RL_IMAGE_RAY[RECOMMENDED_IMAGE]}), or set "
            "ray_auth: none (anyone who reaches the job's ports can then run code as you)",
        )
        return
    if profile.ray_auth == "none":
        findings.warn(
            "ray_auth",
            profile_path(profile, "ray_auth"),
            NO_AUTH_RISK,
            value="none",
            fix="remove `ray_auth: none` from the profile (token authentication is the "
            f"default; it needs ray{RAY_TOKEN_AUTH_SPEC} in the job's Python or image)",
        )
    else:
        has = (
            f"the job's Ray is {found.version} ({found.source})"
            if found is not None
            else "each node checks that before Ray starts"
        )
        findings.passed(
            "ray_auth",
            "Ray token authentication: every node and the driver read the job's own token "
            f"from <run_dir>/{AUTH_DIR_NAME}/{TOKEN_FILE_NAME} (mode 0600); it needs "
            f"ray{RAY_TOKEN_AUTH_SPEC}: {has}",
        )


def _has_token_auth(version: str) -> bool:
    from hpcrl.run.versions import in_range  # the preflight's own comparison (pure Python)

    return in_range(version, RAY_TOKEN_AUTH_SPEC)


def _named_variables(recipe: Recipe, profile: ClusterProfile) -> Iterable[tuple[str, str]]:
    for name in profile.env:
        yield profile_path(profile, f"env.{name}"), name
    for index, name in enumerate(profile.pass_env):
        yield profile_path(profile, f"pass_env[{index}]"), name
    section, env_vars = training_env_vars(recipe)
    for name in env_vars:
        yield f"{section}.{name}", name

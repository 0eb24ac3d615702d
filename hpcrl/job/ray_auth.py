"""Ray's token authentication inside the job: which token file, and how Ray finds it.

With ``ray_auth: token`` (the default) every Ray process of the job runs with
``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH=<run_dir>/auth/ray_token``: each node's
``ray start`` (its GCS, raylet, dashboard agent, runtime-env agent and worker processes inherit
the variables) and node 0's driver process (its GCS node-table reader and ``ray.init``). Ray then
refuses every gRPC call and HTTP request without the token on all of them. Only the path
travels in environments; the token stays in the file (mode 0600 in a 0700 folder), which is why
``RAY_AUTH_TOKEN`` (a value Ray prefers over the file) is removed from what Ray inherits.

The token file is normally written with the run folder (``hpcrl.render.ray_token``); node 0
creates it when there is none (a node entrypoint run directly), before its Ray starts, and the
other nodes read it only after node 0 announced its head. With ``ray_auth: none`` the mode is set
to ``disabled`` explicitly: Ray 2.60 otherwise turns token auth on whenever a user's
``~/.ray/auth_token`` exists, which the job's nodes and driver do not share.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcrl.job.errors import BootstrapError
from hpcrl.job.settings import NodeSettings
from hpcrl.plan.ray_auth import RAY_AUTH_VARIABLES, token_path
from hpcrl.render.ray_token import TokenFileError, ensure_token_file, token_file_problem


class RayTokenUnusable(BootstrapError):
    """The job's token file is missing, not private, or cannot be created."""


def job_token_path(settings: NodeSettings) -> str | None:
    """The token file every Ray process of the job reads (None: authentication is off)."""
    return token_path(str(settings.run_dir)) if settings.ray_auth == "token" else None


def prepare_job_token(settings: NodeSettings) -> None:
    """Node 0: create the token file unless the run folder has one. Every node: check that it
    is private and well formed before this node's Ray reads it."""
    path = job_token_path(settings)
    if path is None:
        return
    try:
        if settings.is_head:
            ensure_token_file(path)
            return
        problem = token_file_problem(path)
    except (TokenFileError, OSError) as error:
        problem = str(error)
    if problem is not None:
        raise RayTokenUnusable(
            f"node {settings.task.node_name} cannot use the job's Ray token: {problem}"
        )


def apply_ray_auth(env: Mapping[str, str], settings: NodeSettings) -> dict[str, str]:
    """``env`` with Ray's authentication variables as this job's ``ray_auth`` says, and no
    inherited ones (a submitting shell's ``RAY_AUTH_TOKEN`` would replace the job's token)."""
    result = {name: value for name, value in env.items() if name not in RAY_AUTH_VARIABLES}
    path = job_token_path(settings)
    if path is None:
        result["RAY_AUTH_MODE"] = "disabled"
    else:
        result |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": path}
    return result

"""The user's defaults: which cluster profile, and where run folders live.

One place, read only when a command needs a default it was not given:

- ``$HPCRL_CLUSTER``, else ``cluster:`` in the user config file: the profile for
  ``validate``/``render``/``show``/``submit``/``sweep`` without ``--cluster``;
- ``$HPCRL_RUNS_DIR``, else ``runs_dir:`` there, else ``./runs``: where new run folders go and
  where ``hpcrl status`` looks without ``--runs-dir`` or folders.

The file is ``$XDG_CONFIG_HOME/hpcrl/config.yaml`` (``~/.config/hpcrl/config.yaml``), beside
the user's own profiles (``cluster_profiles/`` there)::

    cluster: eos
    runs_dir: /lustre/fsw/me/runs

A key it does not know, or a value that is not text, is an error naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CLUSTER_VARIABLE = "HPCRL_CLUSTER"
RUNS_DIR_VARIABLE = "HPCRL_RUNS_DIR"
BUILTIN_RUNS_DIR = "runs"
KEYS = ("cluster", "runs_dir")


def user_config_path(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    config_home = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "hpcrl" / "config.yaml"


def read_user_config(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The file's settings ({} when there is no file); UserError for one hpcrl cannot use."""
    from hpcrl.config.errors import UserError

    path = user_config_path(environ)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise UserError(f"{path}: cannot read it ({error.strerror})",
                        fix="fix its permissions, or remove it") from None  # fmt: skip
    data = _parse(path, text)
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise UserError(f"{path}: unknown key(s) {', '.join(unknown)}",
                        fix=f"the keys are: {', '.join(KEYS)}")  # fmt: skip
    bad = sorted(key for key, value in data.items() if not isinstance(value, str) or not value)
    if bad:
        raise UserError(f"{path}: {', '.join(bad)} must be text (a profile name, a folder)",
                        fix="e.g. cluster: eos, runs_dir: ~/runs")  # fmt: skip
    return dict(data)


def _parse(path: Path, text: str) -> dict[str, Any]:
    import yaml

    from hpcrl.config.errors import UserError

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise UserError(f"{path}: not YAML ({' '.join(str(error).split())})",
                        fix="write key: value lines, e.g. cluster: eos") from None  # fmt: skip
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected key: value lines", fix="e.g. cluster: eos")
    return data


def default_cluster(environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """(profile, where it came from); (None, '') when nothing names one."""
    environ = os.environ if environ is None else environ
    if environ.get(CLUSTER_VARIABLE):
        return environ[CLUSTER_VARIABLE], f"${CLUSTER_VARIABLE}"
    configured = read_user_config(environ).get("cluster")
    if configured:
        return configured, str(user_config_path(environ))
    return None, ""


def default_runs_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where run folders go and ``hpcrl status`` looks, unless a command names a folder."""
    environ = os.environ if environ is None else environ
    text = environ.get(RUNS_DIR_VARIABLE) or read_user_config(environ).get("runs_dir")
    return Path(os.path.expanduser(text)) if text else Path(BUILTIN_RUNS_DIR)


def no_cluster_error() -> Exception:
    from hpcrl.config.errors import UserError

    return UserError(
        "no cluster profile: give --cluster PROFILE",
        fix=f"or set a default: export {CLUSTER_VARIABLE}=NAME, or 'cluster: NAME' in "
        f"{user_config_path()}",
    )

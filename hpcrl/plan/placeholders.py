"""Placeholders of shipped example profiles (``account: your_account``, ``/lustre/fsw/your_project``).

They would plan cleanly and land in ``#SBATCH --account=your_account``. ``validate`` and
``render`` warn; ``submit`` refuses (``plan(..., for_submission=True)``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import attrs

from hpcrl.config.profile import ClusterProfile
from hpcrl.plan.findings import Findings
from hpcrl.plan.layout import profile_path

#: How hpcrl's example profiles spell a value the user must set.
PLACEHOLDER = re.compile(r"\byour_[a-z0-9_]+", re.IGNORECASE)


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _strings(item, f"{path}[{index}]")


def check_placeholders(profile: ClusterProfile, findings: Findings, *, refuse: bool) -> None:
    """One problem per value holding a placeholder: a warning, an error when ``refuse``."""
    for path, text in _strings(attrs.asdict(profile, recurse=True), ""):
        match = PLACEHOLDER.search(text)
        if match is None or path == "name":
            continue
        message = f"still holds the placeholder {match.group(0)!r} of the example profile" + (
            "; the job would run with it" if not refuse else ""
        )
        fix = (
            f"copy the profile to ~/.config/hpcrl/cluster_profiles/{profile.name}.yaml (or a "
            f"folder on $HPCRL_CLUSTER_PROFILES) and set {path} there; the copy wins over "
            "the shipped one"
        )
        if refuse:
            findings.error(profile_path(profile, path), message, value=text, fix=fix)
        else:
            findings.warn("placeholder", profile_path(profile, path), message, value=text, fix=fix)

"""Placeholders of shipped example profiles (``account: your_account``, ``/lustre/fsw/your_project``).

They would plan cleanly and land in ``#SBATCH --account=your_account``. ``validate`` and
``render`` warn; ``submit`` refuses (``plan(..., for_submission=True)``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import attrs

from hpcrl.config.errors import NO_VALUE
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
    """One problem for every value holding a placeholder (a warning, an error when
    ``refuse``): a profile copied without its edits has five, and one problem naming them
    reads in five lines where five problems took sixty."""
    held = [
        (path, text, match.group(0))
        for path, text in _strings(attrs.asdict(profile, recurse=True), "")
        if path != "name" and (match := PLACEHOLDER.search(text)) is not None
    ]
    if not held:
        return
    copy = (
        f"copy the profile to ~/.config/hpcrl/cluster_profiles/{profile.name}.yaml (or a "
        "folder on $HPCRL_CLUSTER_PROFILES) and set {keys} there; the copy wins over the "
        "shipped one"
    )
    value: object  # the one placeholder's text, or NO_VALUE for several
    if len(held) == 1:
        ((path, text, word),) = held
        where, value, fix = profile_path(profile, path), text, copy.format(keys=path)
        message = f"still holds the placeholder {word!r} of the example profile"
    else:
        where, value, fix = f"profile[{profile.name}]", NO_VALUE, copy.format(keys="them")
        message = f"{len(held)} values still hold the example profile's placeholders: " + "; ".join(
            f"{', '.join(path for path, _, w in held if w == word)} ({word!r})"
            for word in dict.fromkeys(word for _, _, word in held)
        )
    if refuse:
        findings.error(where, message, value=value, fix=fix)
    else:
        ending = (
            "; the job would run with it" if len(held) == 1 else "; the job would run with them"
        )
        findings.warn("placeholder", where, message + ending, value=value, fix=fix)

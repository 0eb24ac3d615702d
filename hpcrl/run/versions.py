"""Version ranges as hpcrl writes them (``>=2.9,<2.14``, ``==2.60.0``, ``>=0.3,<0.4 || >=0.6,<0.7``).

Compared on release numbers only: a pre-release, post-release or local build counts as its
release. NGC and site images carry builds such as torch ``2.9.0a0+50eac811a6.nv25.09``; by
PEP 440 that is older than 2.9 and ``>=2.9`` would turn away the image the range was written
for. Pure and import-light: the job runs it before anything heavy is imported, and
``packaging`` may be missing from an image.
"""

from __future__ import annotations

import re

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")
_CLAUSE = re.compile(r"^(==|!=|>=|<=|>|<)\s*(\d+(?:\.\d+)*)$")
ALTERNATIVE = "||"


class BadVersionSpec(ValueError):
    """A range hpcrl's own table wrote wrongly (an internal error, not a user's)."""


def release(version: str) -> tuple[int, ...] | None:
    """``"2.11.0+cu130"`` → ``(2, 11, 0)``; None when the text starts with no number."""
    match = _RELEASE.match(version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def _padded(left: tuple[int, ...], right: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    width = max(len(left), len(right))
    return left + (0,) * (width - len(left)), right + (0,) * (width - len(right))


def _clause_holds(found: tuple[int, ...], clause: str) -> bool:
    match = _CLAUSE.match(clause.strip())
    if match is None:
        raise BadVersionSpec(f"not a version clause: {clause!r}")
    operator, bound_text = match.groups()
    have, bound = _padded(found, tuple(int(part) for part in bound_text.split(".")))
    return {
        "==": have == bound,
        "!=": have != bound,
        ">=": have >= bound,
        "<=": have <= bound,
        ">": have > bound,
        "<": have < bound,
    }[operator]


def in_range(version: str, spec: str) -> bool:
    """Whether ``version`` lies in ``spec`` (comma: and; ``||``: or; empty: any version)."""
    found = release(version)
    if found is None:
        return False
    alternatives = [part.strip() for part in spec.split(ALTERNATIVE)]
    return any(
        all(_clause_holds(found, clause) for clause in alternative.split(",") if clause.strip())
        for alternative in alternatives
    )


def check_spec(spec: str) -> None:
    """Raise BadVersionSpec unless every clause of ``spec`` parses."""
    for alternative in spec.split(ALTERNATIVE):
        for clause in alternative.split(","):
            if clause.strip():
                _clause_holds((0,), clause)

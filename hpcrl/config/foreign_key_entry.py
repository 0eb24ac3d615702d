"""One entry of the foreign-key table (``ForeignKey``): a NeMo RL key path hpcrl's schema does
not hold, and whether hpcrl accepts it always (``inert``) or only at its "off" value
(``off_only``). ``foreign_key_table`` holds the entries; ``foreign_keys`` looks keys up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from hpcrl.config.shared_methods import SharedMethods

Status = Literal["inert", "off_only"]
WILDCARD = "*"


@attrs.frozen
class ForeignKey(SharedMethods):
    """A NeMo RL key path (``*`` matches any one key) and what hpcrl does with it.

    inert: always accepted, it cannot change results (``reason`` says why). off_only:
    accepted while it holds one of ``off_values`` (or, for a section, while its ``enabled``
    is false), an error otherwise (``reason`` says what is not supported).
    """

    path: str
    status: Status
    reason: str
    off_values: tuple[Any, ...] = ()

    def accepts(self, value: Any) -> bool:
        if self.status == "inert":
            return True
        if isinstance(value, Mapping):
            return value.get("enabled", True) is False or (not value and {} in self.off_values)
        return any(value == off and type(value) is type(off) for off in self.off_values)

    def off_text(self) -> str:
        shown = [_yaml(value) for value in self.off_values if not isinstance(value, dict)]
        if any(isinstance(value, dict) for value in self.off_values):
            shown.append("{}")
        return " or ".join(shown)


def inert(path: str, reason: str) -> ForeignKey:
    return ForeignKey(path=path, status="inert", reason=reason)


def off_only(path: str, reason: str, *off_values: Any) -> ForeignKey:
    return ForeignKey(path=path, status="off_only", reason=reason, off_values=off_values)


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)

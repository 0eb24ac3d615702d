"""What the pre-flight checks found: problems (errors, warnings) and checks that passed."""

from __future__ import annotations

from typing import Any

import attrs

from hpcrl.config.errors import NO_VALUE, Problem, raise_if_errors
from hpcrl.run.jobspec import Check


@attrs.define
class Findings:
    """Collects every check's outcome so all problems are reported together."""

    problems: list[Problem] = attrs.field(factory=list)
    checks: list[Check] = attrs.field(factory=list)

    def error(self, path: str, message: str, *, value: Any = NO_VALUE, fix: str = "") -> None:
        self.problems.append(Problem(path=path, message=message, value=value, fix=fix))

    def warn(
        self, check: str, path: str, message: str, *, value: Any = NO_VALUE, fix: str = ""
    ) -> None:
        self.problems.append(
            Problem(path=path, message=message, value=value, fix=fix, severity="warning")
        )
        self.checks.append(Check(name=check, status="warned", message=message, path=path, fix=fix))

    def passed(self, check: str, message: str) -> None:
        self.checks.append(Check(name=check, status="passed", message=message))

    def num_errors(self) -> int:
        return sum(problem.is_error for problem in self.problems)

    def raise_if_errors(self) -> None:
        raise_if_errors(self.problems)

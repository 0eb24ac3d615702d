"""User-facing problems and how they are shown: one record from config to plan to job.

Every stage that checks user input reports a list of ``Problem`` s (key path, value, what is
wrong, the fix): loading and the rules (``hpcrl.config``), the planner (``hpcrl.plan``, through
its ``Findings``), and on the job side the preflight's checks of the machine and the job's
Python (``hpcrl.core.machine_checks``, ``hpcrl.job.preflight``). Config and plan raise one
``ConfigError`` holding all of them, so a user fixes every mistake in one round instead of
one per queue wait; the CLI prints them with ``print_problems`` and exits with code 2,
without a traceback. The job side, which has no terminal, writes each as ``one_line()``
into the node log, the failure marker and stderr.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import attrs

from hpcrl.config.shared_methods import SharedMethods

Severity = Literal["error", "warning"]


@attrs.frozen
class _NoValue(SharedMethods):
    """Marks a problem that has no offending value (a missing key, a missing file)."""

    def __repr__(self) -> str:
        return "<no value>"


NO_VALUE = _NoValue()


@attrs.frozen(kw_only=True)
class Problem(SharedMethods):
    """One mistake (or doubtful choice) in a recipe or profile.

    path: full dotted key path, e.g. ``policy.megatron_cfg.optimizer.optimizer_offload_fraction``
    (list items as ``offload_modules[2]``); value: what the user wrote (``NO_VALUE`` when
    nothing); message: what is wrong; fix: what to change, naming the exact key to set.
    """

    path: str
    message: str
    value: Any = NO_VALUE
    fix: str = ""
    severity: Severity = "error"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def format(self) -> str:
        """Plain text, one or two lines: for logs, exception text and tests. Secret values
        (``hpcrl.config.secrets``) are hidden."""
        text = f"{self.severity}: {self._what()}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return _redact(text)

    def one_line(self) -> str:
        """One line, ``path = value: message; fix: fix``: for a node log, a failure marker or
        a job's stderr, where the job side reports (secrets hidden)."""
        text = self._what() + (f"; fix: {self.fix}" if self.fix else "")
        return _redact(text)

    def _what(self) -> str:
        head = self.path
        if self.value is not NO_VALUE:
            head += f" = {_show_value(self.value)}"
        return f"{head}: {self.message}"


class ConfigError(Exception):
    """Raised for user mistakes in recipes, profiles, overrides or the plan; holds them all."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = list(problems)
        super().__init__(format_problems(self.problems))

    @property
    def errors(self) -> list[Problem]:
        return [problem for problem in self.problems if problem.is_error]

    @property
    def warnings(self) -> list[Problem]:
        return [problem for problem in self.problems if not problem.is_error]


class UserError(Exception):
    """A mistake a user can make outside a recipe or profile: a run folder, a file, an
    argument, a scheduler command that fails. The CLI shows it as one line (what, where)
    plus the fix, and exits non-zero without a traceback (``--debug`` shows it)."""

    exit_code = 1

    def __init__(self, message: str, fix: str = ""):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def one_line(self) -> str:
        return f"{self.message} (fix: {self.fix})" if self.fix else self.message


class UsageError(UserError):
    """A command-line argument that cannot be right (an unknown state word, a folder that is
    not there, an attempt no job can have): exit 2, like argparse's own usage errors, with
    the fix."""

    exit_code = 2


def errors_only(problems: Iterable[Problem]) -> list[Problem]:
    return [problem for problem in problems if problem.is_error]


def raise_if_errors(problems: Sequence[Problem]) -> None:
    """Raise one ConfigError holding every problem (warnings too) if any of them is an error."""
    if any(problem.is_error for problem in problems):
        raise ConfigError(problems)


def format_problems(problems: Sequence[Problem]) -> str:
    """All problems as plain text, errors first, then warnings, each in path order."""
    ordered = _ordered(problems)
    lines = [problem.format() for problem in ordered]
    num_errors = sum(problem.is_error for problem in ordered)
    num_warnings = len(ordered) - num_errors
    lines.append(f"{_count(num_errors, 'error')}, {_count(num_warnings, 'warning')}")
    return "\n".join(lines)


def render_problems(problems: Sequence[Problem]) -> Any:
    """A rich renderable listing every problem, one per path: what, the value, the fix.

    Two columns, so a long message wraps under itself and the severity column stays clear.
    """
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table.grid(padding=(0, 1))
    table.add_column(no_wrap=True)
    table.add_column()
    for problem in _ordered(problems):
        style = "bold red" if problem.is_error else "bold yellow"
        head = Text(_redact(problem.path), style="bold")
        if problem.value is not NO_VALUE:
            head.append(" = ")
            head.append(_show_value(problem.value), style="magenta")
        body = [head, Text(_redact(problem.message))]
        if problem.fix:
            body.append(Text.assemble(("fix: ", "green"), _redact(problem.fix)))
        table.add_row(Text(problem.severity, style=style), Group(*body))
    num_errors = sum(problem.is_error for problem in problems)
    summary = f"{_count(num_errors, 'error')}, {_count(len(problems) - num_errors, 'warning')}"
    return Group(table, Text(summary, style="bold red" if num_errors else "bold yellow"))


def print_problems(problems: Sequence[Problem], console: Any = None) -> None:
    """Print problems to stderr (or the given rich Console)."""
    if console is None:
        from rich.console import Console

        console = Console(stderr=True, highlight=False)
    console.print(render_problems(problems))


def _ordered(problems: Iterable[Problem]) -> list[Problem]:
    # Stable within a severity, so problems keep the order their checks found them in.
    return sorted(problems, key=lambda problem: not problem.is_error)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _redact(text: str) -> str:
    from hpcrl.config.secrets import redact

    return redact(text)


def show_value(value: Any) -> str:
    """A value as problems show it: repr, secrets hidden, long ones cut."""
    return _show_value(value)


def _show_value(value: Any) -> str:
    text = _redact(repr(value))  # before cutting: a cut secret would no longer be found
    return text if len(text) <= 120 else text[:117] + "..."

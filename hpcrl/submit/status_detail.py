"""``hpcrl status RUN``: one run in full, a field per line, long values wrapped at spaces (a
path or a name is never broken) under their label."""

from __future__ import annotations

from collections.abc import Sequence

from hpcrl.submit.labelled_lines import wrap_field
from hpcrl.submit.status_view import NOT_SUBMITTED, RunStatus, format_elapsed, state_text

LABEL_WIDTH = 10


def detail_lines(
    run: RunStatus,
    extra: Sequence[tuple[str, str]],
    width: int | None,
    commands: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """Every field ``run`` has (and ``extra`` ones: loggers, ...), ``label  value`` per line;
    then ``commands``, each on one line however long (a command is never wrapped)."""
    fields = [
        ("run", run.name),
        ("folder", run.path),
        ("recipe", run.recipe or ""),
        ("state", _state(run)),
        ("job", _job(run)),
        ("progress", _progress(run)),
        ("values", ", ".join(f"{key}={value}" for key, value in run.swept.items())),
        ("cause", run.cause or ""),
        ("problem", run.problem or ""),
        *extra,
    ]
    lines = []
    for label, value in fields:
        if value:
            lines += wrap_field(label, value, width, LABEL_WIDTH)
    return lines + [f"{label:<{LABEL_WIDTH}} {text}" for label, text in commands]


def _state(run: RunStatus) -> str:
    text = state_text(run)
    if run.exit_code is not None:
        text += f", exit code {run.exit_code}"
    if run.state == NOT_SUBMITTED:
        text += " (its submission failed)" if run.cause else " (rendered only)"
    return text


def _job(run: RunStatus) -> str:
    if run.job_id is None:
        return ""
    parts = [run.job_id]
    if run.attempts is not None:
        parts.append(f"{run.attempts} attempt" + ("" if run.attempts == 1 else "s"))
    if run.elapsed_s is not None:
        parts.append(f"elapsed {format_elapsed(run.elapsed_s)}")
    if run.submitted_at:
        parts.append(f"submitted {run.submitted_at}")
    return " · ".join(parts)


def _progress(run: RunStatus) -> str:
    if run.step is None:
        return ""
    parts = [f"step {run.step}/{run.max_steps}" if run.max_steps else f"step {run.step}"]
    if run.reward is not None:
        parts.append(f"reward {run.reward:.4g}")
    if run.loss is not None:
        parts.append(f"loss {run.loss:.4g}")
    return " · ".join(parts)

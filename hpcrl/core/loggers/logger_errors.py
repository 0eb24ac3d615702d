"""How a logger that cannot start fails: one error naming the recipe key and the fix (each
logger raises it; ``hpcrl.core.loggers.sinks`` builds the loggers)."""

from __future__ import annotations


class LoggerError(RuntimeError):
    """A logger the recipe switches on cannot start (the message names the key and the fix)."""


def missing_package(key: str, package: str, error: ImportError) -> LoggerError:
    return LoggerError(
        f"logger.{key} is true but {package} cannot be imported in the job's Python ({error}); "
        f"install it there (pip install 'hpcrl[loggers]' or {package}) or set logger.{key}=false"
    )

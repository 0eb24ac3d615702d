"""Metric loggers users already use, fed from the step records the driver writes to
``metrics.jsonl``: TensorBoard event files, Weights & Biases (offline unless the job has a
key), MLflow (a local file store unless a tracking URI is given), and a GPU monitor.

They run in the driver on node 0 and are switched on by NeMo RL's ``logger.*`` keys. Each
imports its package when it is built (never on the login node); a package missing from the
job's Python is one error naming the key and the extra to install, before training starts.
"""

from hpcrl.core.loggers.logger_errors import LoggerError
from hpcrl.core.loggers.sinks import MetricLoggers, build_loggers, log_name

__all__ = ["LoggerError", "MetricLoggers", "build_loggers", "log_name"]

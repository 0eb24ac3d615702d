"""A process outside a job that knows the job's Ray address, and the token or not.

    python -m tests.job.ray_intruder gcs ADDRESS          # Ray's own GCS client
    python -m tests.job.ray_intruder init ADDRESS NODE_IP # ray.init(address=...) + one task

Prints one JSON line: ``{"connected": true, ...}``, or ``{"connected": false, "errors": [...]}``
with every exception of the chain as ``"<module>.<type>: <message>"`` (``ray.init`` wraps the
GCS client's ``AuthenticationError`` in a ``ConnectionError``). Whether it holds the token is
decided by its environment (``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN_PATH``), as for any Ray process.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def try_gcs(address: str) -> dict[str, Any]:
    from ray._raylet import GcsClient

    client = GcsClient(address=address)
    return {"connected": True, "num_nodes": len(client.get_all_node_info())}


def try_init(address: str, node_ip: str) -> dict[str, Any]:
    import ray

    ray.init(address=address, _node_ip_address=node_ip, logging_level="ERROR", log_to_driver=False)
    alive = [node for node in ray.nodes() if node["Alive"]]
    value = ray.get(ray.remote(num_cpus=0)(_square).remote(7), timeout=120)
    ray.shutdown()
    return {"connected": True, "num_nodes": len(alive), "task_result": value}


def _square(value: int) -> int:
    return value * value


def error_chain(error: BaseException | None) -> list[str]:
    chain = []
    while error is not None:
        chain.append(f"{type(error).__module__}.{type(error).__qualname__}: {error}")
        error = error.__cause__ or error.__context__
    return chain


def main(argv: list[str]) -> int:
    mode, address, *rest = argv
    try:
        result = try_gcs(address) if mode == "gcs" else try_init(address, *rest)
    except Exception as error:
        result = {"connected": False, "errors": error_chain(error)}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

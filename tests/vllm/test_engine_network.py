"""A vLLM engine as hpcrl builds it accepts nothing from other machines: its only TCP listeners
are the loopback ones of the engine's own one-rank torch.distributed (gloo) group, and a
multi-process engine's core talks to it over unix sockets that other users cannot connect to
(docs/architecture.md, "What a job exposes on the network")."""

from __future__ import annotations

import os
import stat

import psutil
import pytest

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.generation.vllm_engine import VllmEngine
from tests.job.ray_listeners import listening_tcp_sockets, listening_unix_sockets
from tests.vllm.harness import VLLM_CFG, build_tiny_model


def listeners_of_this_process_tree() -> tuple[set, set]:
    tcp, unix = set(), set()
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            tcp |= {(process.pid, *where) for where in listening_tcp_sockets(process.pid)}
            unix |= set(listening_unix_sockets(process.pid))
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
    return tcp, unix


@pytest.mark.parametrize("in_process", [True, False], ids=["in-process", "multiprocess"])
def test_a_vllm_engine_listens_on_no_network_address(tmp_path, in_process: bool) -> None:
    from transformers import AutoTokenizer

    path = build_tiny_model(tmp_path / "tiny")
    prompt = AutoTokenizer.from_pretrained(path)("Count: ")["input_ids"]
    tcp_before, unix_before = listeners_of_this_process_tree()
    engine = VllmEngine(path, VLLM_CFG, device="cpu", in_process=in_process)
    try:
        out = engine.generate([prompt], GenerationCfg(temperature=0.0, max_new_tokens=4), seed=0)
        tcp, unix = listeners_of_this_process_tree()
    finally:
        engine.shutdown()
    assert int(out["response_mask"].sum()) == 4  # the engine worked while we looked
    new_tcp = tcp - tcp_before
    assert new_tcp, "vLLM's gloo group listens (if this changes, update docs/architecture.md)"
    assert {ip for _, ip, _ in new_tcp} == {"127.0.0.1"}, new_tcp
    new_unix = unix - unix_before
    abstract = [name for name in new_unix if name.startswith("@")]
    assert abstract == [], "abstract unix sockets have no permissions: anyone on the node connects"
    for socket_path in new_unix:
        mode = os.stat(socket_path).st_mode
        assert stat.S_ISSOCK(mode) and not mode & 0o002, (socket_path, oct(mode))
    if not in_process:
        assert new_unix, "the engine core talks to its client over unix sockets"

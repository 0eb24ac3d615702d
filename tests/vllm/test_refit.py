"""Weight refit of a running engine: generation follows the new weights (and equals the
torch sampler on a model holding them), and returns exactly to the old outputs when the old
weights come back.

The same two engines (in process, and with its core in a child process) carry the checks
that needed nothing but a running engine of that kind; each was one more engine start-up
(~65 CPU-s) in a test of its own (issue 26):
- it accepts nothing from other machines: its only TCP listeners are the loopback ones of
  the engine's own one-rank torch.distributed (gloo) group, and a multi-process engine's core
  talks to it over unix sockets that other users cannot connect to (docs/architecture.md,
  "What a job exposes on the network"; was tests/vllm/test_engine_network.py);
- the multi-process engine's core runs in a child process, generates the torch sampler's
  greedy tokens, and ``shutdown`` leaves no process behind (was
  test_engine.py::test_multiprocess_engine_shuts_down_its_processes);
- an in-flight refit issued while the in-process engine is idle applies at once: the next
  generation samples from the new weights (was
  test_in_flight_refit.py::test_refit_while_idle_applies_at_once)."""

from __future__ import annotations

import os
import stat

import psutil
import pytest
import torch

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.generation.vllm_engine import VllmEngine
from tests.job.ray_listeners import listening_tcp_sockets, listening_unix_sockets
from tests.vllm.harness import (
    encode,
    perturbed,
    response_logprobs,
    responses,
    teacher_forced_logprobs,
    torch_sampler_generate,
    vllm_spec,
    wait_until_gone,
)

GREEDY = GenerationCfg(temperature=0.0, max_new_tokens=16)
# temperature 1, no top-k/top-p: the sampler's log-probs are the model's raw ones, which a
# teacher-forced HF forward gives (tests/vllm/test_engine.py holds vLLM to 2e-4 of it).
SAMPLING = GenerationCfg(temperature=1.0, max_new_tokens=48)
ATOL = 2e-4


def listeners_of_this_process_tree() -> tuple[set, set]:
    tcp, unix = set(), set()
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            tcp |= {(process.pid, *where) for where in listening_tcp_sockets(process.pid)}
            unix |= set(listening_unix_sockets(process.pid))
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
    return tcp, unix


def new_children(before: set[int]) -> list[int]:
    # Python's multiprocessing resource tracker (one per parent, exits with it) aside.
    return [
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())
    ]


def assert_listens_on_no_network_address(
    before: tuple[set, set], running: tuple[set, set], in_process: bool
) -> None:
    new_tcp = running[0] - before[0]
    assert new_tcp, "vLLM's gloo group listens (if this changes, update docs/architecture.md)"
    assert {ip for _, ip, _ in new_tcp} == {"127.0.0.1"}, new_tcp
    new_unix = running[1] - before[1]
    abstract = [name for name in new_unix if name.startswith("@")]
    assert abstract == [], "abstract unix sockets have no permissions: anyone on the node connects"
    for socket_path in new_unix:
        mode = os.stat(socket_path).st_mode
        assert stat.S_ISSOCK(mode) and not mode & 0o002, (socket_path, oct(mode))
    if not in_process:
        assert new_unix, "the engine core talks to its client over unix sockets"


def response_logprobs_of(model: torch.nn.Module, out: dict) -> list[torch.Tensor]:
    """Teacher-forced log-probs of each row's response tokens under ``model``."""
    forced = teacher_forced_logprobs(model, out)
    return [
        forced[row][out["response_mask"][row].bool()] for row in range(out["input_ids"].shape[0])
    ]


@pytest.mark.parametrize("in_process", [True, False], ids=["in-process", "multiprocess"])
def test_refit_follows_new_weights_and_restores_exactly(tiny, in_process: bool) -> None:
    path, model, tokenizer = tiny
    prompts = encode(tokenizer)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    listeners_before = listeners_of_this_process_tree()
    engine = VllmEngine(vllm_spec(path), in_process=in_process)
    idle_refit = None
    try:
        children = new_children(children_before)
        before = engine.generate(prompts, GREEDY, seed=0)
        listeners_running = listeners_of_this_process_tree()  # the engine worked meanwhile
        new_weights = perturbed(model, seed=7)
        engine.update_weights(new_weights.items())
        after = engine.generate(prompts, GREEDY, seed=0)
        engine.update_weights(list(original.items()))
        restored = engine.generate(prompts, GREEDY, seed=0)
        if in_process:
            landed = engine.update_weights_in_flight(perturbed(model, seed=11).items(), False)
            out = engine.generate(prompts[:4], SAMPLING, seed=1)
            idle_refit = landed, out, engine.last_refit_positions, engine.generation_metrics()
    finally:
        engine.shutdown()

    assert_listens_on_no_network_address(listeners_before, listeners_running, in_process)
    assert responses(before) == responses(torch_sampler_generate(model, tokenizer, prompts, GREEDY))
    changed = sum(a != b for a, b in zip(responses(before), responses(after), strict=True))
    assert changed >= 12, f"only {changed}/16 greedy outputs changed with new weights"
    model.load_state_dict(new_weights)
    try:
        assert responses(after) == responses(
            torch_sampler_generate(model, tokenizer, prompts, GREEDY)
        )
    finally:
        model.load_state_dict(original)
    for key in before:
        assert torch.equal(restored[key], before[key]), key
    if in_process:
        assert_idle_refit_applied_at_once(model, *idle_refit)
    else:
        assert children, "a multi-process engine runs its core in a child process"
        assert wait_until_gone(children) == []


def assert_idle_refit_applied_at_once(
    model: torch.nn.Module, landed: bool, out: dict, positions: list, metrics: dict
) -> None:
    """No generation ran when the in-flight refit came: it landed in no generation, and the
    next one samples from the new weights (teacher-forced parity with a model holding them)."""
    assert landed is False and positions == [[], [], [], []]
    assert metrics["generation_refits_in_flight"] == 0
    original = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(perturbed(model, seed=11))
    try:
        forced = response_logprobs_of(model, out)
    finally:
        model.load_state_dict(original)
    for sampled, want in zip(response_logprobs(out), forced, strict=True):
        torch.testing.assert_close(sampled, want, atol=ATOL, rtol=0)

"""NeMo RL's windowed and ready_first samplers (nemo_rl/algorithms/async_utils/
staleness_sampler.py) as hpcrl.core.algorithms.group_selection implements them, checked
against a reference written from NeMo RL's code on crafted and random buffers (dispatch order,
start weight versions, readiness), the streaming threshold's effect, and the grouped async
GRPO loop (hpcrl.core.algorithms.async_grpo_groups) around a policy whose groups finish out of
order. The run on real vLLM engines: tests/vllm/test_async_grpo.py."""

from __future__ import annotations

import random

import attrs
import pytest

from hpcrl.core.algorithms.group_selection import (
    BufferedGroup,
    ReadyFirstSelection,
    WindowedSelection,
)


def reference_select(name, weights, ready, version, window, min_groups, max_groups):
    """NeMo RL's select over its buffer's parallel lists (slot order = dispatch order):
    the eligible slot indices, capped, or None below the minimum."""
    if name == "windowed":
        low = max(0, version - window)
        valid = [i for i, w in enumerate(weights) if low <= w <= version and ready[i]]
    else:  # ready_first
        valid = [i for i, w in enumerate(weights) if w <= version and ready[i]]
    if len(valid) < min_groups:
        return None
    return valid[: min(len(valid), max_groups)]


def reference_evict(name, weights, ready, version, window):
    if name == "ready_first":
        return []
    low = max(0, version - window)
    return [i for i, w in enumerate(weights) if w < low and ready[i]]


def reference_admits(batch_index, version, window):
    """NeMo RL's gate: the cursor (batches admitted - 1) must be below version + window."""
    return batch_index - 1 < version + window


def buffer_of(weights, ready):
    return [
        BufferedGroup(index=i, start_version=w, ready=r)
        for i, (w, r) in enumerate(zip(weights, ready, strict=True))
    ]


def selection(name, window):
    return WindowedSelection(window) if name == "windowed" else ReadyFirstSelection(window)


def indices(groups):
    return None if groups is None else [g.index for g in groups]


def test_windowed_takes_ready_in_window_groups_earliest_dispatched_first():
    # dispatch order 0..7: started on versions 0,1,2,2,3,1,3,4; 2 and 6 still sampling
    weights = [0, 1, 2, 2, 3, 1, 3, 4]
    ready = [True, True, False, True, True, True, False, True]
    groups = buffer_of(weights, ready)
    window = WindowedSelection(1)
    # trainer at version 3: versions 2..3 ready -> 3, 4 (6 unfinished, 7 is from the future)
    assert indices(window.select(groups, 3, 1, 8)) == [3, 4]
    assert indices(window.select(groups, 3, 1, 1)) == [3]  # capped, earliest first
    assert window.select(groups, 3, 3, 8) is None  # fewer than the threshold
    assert indices(window.evict(groups, 3)) == [0, 1, 5]  # ready and older than 2
    assert indices(ReadyFirstSelection(1).select(groups, 3, 1, 8)) == [0, 1, 3, 4, 5]
    assert ReadyFirstSelection(1).evict(groups, 3) == []


@pytest.mark.parametrize("name", ["windowed", "ready_first"])
def test_selection_and_eviction_match_nemo_rl_on_random_buffers(name):
    rng = random.Random(7)
    for _ in range(300):
        size = rng.randint(0, 24)
        weights = [rng.randint(0, 6) for _ in range(size)]
        ready = [rng.random() < 0.7 for _ in range(size)]
        version, window = rng.randint(0, 7), rng.randint(0, 3)
        min_groups = rng.randint(1, 8)
        max_groups = rng.randint(min_groups, 12)
        groups = buffer_of(weights, ready)
        rng.shuffle(groups)  # the buffer's own order must not matter: dispatch order does
        chosen = selection(name, window).select(groups, version, min_groups, max_groups)
        expected = reference_select(name, weights, ready, version, window, min_groups, max_groups)
        assert indices(chosen) == expected
        evicted = sorted(g.index for g in selection(name, window).evict(groups, version))
        assert evicted == reference_evict(name, weights, ready, version, window)


def test_admission_gates_ready_first_and_never_windowed():
    for version in range(4):
        for window in range(3):
            for batch in range(8):
                assert ReadyFirstSelection(window).may_admit(batch, version) == reference_admits(
                    batch, version, window
                )
                assert WindowedSelection(window).may_admit(batch, version)


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="min_groups"):
        WindowedSelection(1).select([], 0, 0, 4)
    with pytest.raises(ValueError, match="min_groups"):
        WindowedSelection(1).select([], 0, 5, 4)


class ScriptedFinishPolicy:
    """The probes' stand-in async policy (real GRPO math around it) whose i-th submitted
    group finishes at its ``delays[i]``-th readiness poll."""

    def __init__(self, delays):
        from tests.core import recording_policy as stand_ins

        tok = stand_ins.tokenizer()
        self.inner = stand_ins.RecordingAsyncPolicy(
            tok.eos_token_id, tok.convert_tokens_to_ids("a")
        )
        self.delays, self.seeds, self.polls = delays, [], {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def submit_generation(self, prompt_ids, cfg, seed):
        self.seeds.append(seed)
        return self.inner.submit_generation(prompt_ids, cfg, seed)

    def collect_generation(self, pending):
        return self.inner.collect_generation(pending)

    def refit_in_flight(self, recompute_kv_cache):
        self.inner.refit_in_flight(recompute_kv_cache)

    def generation_ready(self, pending):
        seed = pending[2]
        self.polls[seed] = self.polls.get(seed, 0) + 1
        delay = (
            self.delays[self.seeds.index(seed)] if self.seeds.index(seed) < len(self.delays) else 1
        )
        return self.polls[seed] >= delay


def grouped_step(tmp_path, delays, **async_rl):
    from hpcrl.config.load_and_check import validate_recipe_dict
    from hpcrl.core.algorithms.async_grpo_groups import GroupedAsyncGrpoStep
    from hpcrl.core.data.jsonl import EpochSampler
    from tests.core import recording_policy as stand_ins
    from tests.core.consumer_changes import IS, SEPARATE
    from tests.core.test_consumers_downstream import base_recipes, with_keys

    keys = {
        **SEPARATE,
        **IS,
        "grpo.num_prompts_per_step": 4,
        "policy.train_global_batch_size": 16,
        "async_rl.sampler.name": "in_order",
        "async_rl.min_groups_for_streaming_train": 4,
        "async_rl.max_buffered_rollouts": 8,
    }
    tmp_path.mkdir(parents=True)
    recipe, _ = validate_recipe_dict(with_keys(base_recipes(tmp_path)["grpo"], keys))
    # Changed after validation, so that each test sets only what it varies (a window of 0
    # under ready_first, a buffer of 8) on an otherwise valid recipe.
    settings = {
        "name": "windowed",
        "max_staleness_versions": 1,
        "min_groups_for_streaming_train": 4,
        "max_inflight_prompts": 8,
        "max_buffered_rollouts": 8,
        **async_rl,
    }
    assert recipe.async_rl is not None
    sampler = attrs.evolve(
        recipe.async_rl.sampler,
        name=settings.pop("name"),
        max_staleness_versions=settings.pop("max_staleness_versions"),
    )
    recipe = attrs.evolve(
        recipe, async_rl=attrs.evolve(recipe.async_rl, sampler=sampler, **settings)
    )
    policy = ScriptedFinishPolicy(delays)
    sampler = EpochSampler(stand_ins.rows(), seed=0, shuffle=False)
    return GroupedAsyncGrpoStep(
        policy, recipe, stand_ins.tokenizer(recipe), stand_ins.ScriptedEnv(), sampler
    )


# group 5 finishes first, 0-3 next, 4 and 6-7 much later
DELAYS = [2, 2, 2, 2, 9, 1, 9, 9]


def test_the_streaming_threshold_decides_which_finished_groups_a_step_takes(tmp_path):
    """NeMo RL's min_groups_for_streaming_train: with 1, the step takes group 5 alone as soon
    as it finishes, then the earliest three of the next ones; with the whole step (4) it
    waits until four are ready and takes the earliest dispatched."""
    streaming = grouped_step(tmp_path / "a", DELAYS, min_groups_for_streaming_train=1)
    record = streaming(1)
    assert [g.index for g in streaming.last_taken] == [5, 0, 1, 2]
    assert record["streaming_chunks"] == 2 and record["trajectory_age_steps"] == 0
    whole = grouped_step(tmp_path / "b", DELAYS, min_groups_for_streaming_train=4)
    record = whole(1)
    assert [g.index for g in whole.last_taken] == [0, 1, 2, 3]
    assert record["streaming_chunks"] == 1
    # one optimizer step on the 4 x 4 samples, then the engines refit in flight
    trains = [call for call in whole.policy.inner.calls if call[0] == "train"]
    assert [call[1] for call in trains] == [16]
    assert whole.policy.inner.calls[-1] == ("refit_in_flight", False)


def test_windowed_evicts_groups_older_than_the_window_and_ready_first_keeps_them(tmp_path):
    """Step 2 (trainer version 1): with window 0 the version-0 groups left over are evicted
    untrained and the step waits for groups started on version 1; ready_first evicts nothing
    and takes whichever finished first, of either version."""
    windowed = grouped_step(tmp_path / "a", DELAYS, max_staleness_versions=0)
    windowed(1)
    record = windowed(2)
    assert all(g.start_version == 1 for g in windowed.last_taken)
    assert record["evicted_stale_prompt_groups"] >= 1 and record["trajectory_age_steps"] == 0
    ready_first = grouped_step(tmp_path / "b", DELAYS, name="ready_first")
    ready_first(1)
    record = ready_first(2)
    # ready first across versions: 5 (version 0, finished) and the first three of batch 2,
    # which the gate admitted only once the trainer reached version 1
    assert [(g.index, g.start_version) for g in ready_first.last_taken] == [
        (5, 0),
        (8, 1),
        (9, 1),
        (10, 1),
    ]
    assert record["evicted_stale_prompt_groups"] == 0 and record["trajectory_age_steps"] == 1

"""Shared pieces of the vLLM tests: the tiny model, prompts, a torch-sampler reference and
the check that no engine process outlives its engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from hpcrl.config.recipe import GenerationCfg, VllmCfg
from hpcrl.core.generation.engine import EngineSpec
from hpcrl.core.models.tiny import TINY_SPECS, build_char_tokenizer, build_random_model

# float32 so that greedy parity with the fp32 torch sampler is exact; 32 MiB of KV cache.
VLLM_CFG = VllmCfg(precision="float32", kv_cache_memory_mb=32, max_model_len=256)

PROMPT_TEXTS = [
    "Count: ",
    "What is 2+3? ",
    "a",
    "The quick brown fox jumps",
    "1, 2, 3, ",
    "Hello world",
    "xyz",
    "def f(x):",
    "Q: why? A:",
    "0000",
    "ab ab ab",
    "Zebra",
    "!?",
    "The answer is ",
    "lorem ipsum dolor",
    "9",
]


# vLLM's CPU attention needs head_dim >= 32 (tiny:qwen2 has 16): the shipped tiny:qwen2-vllm.
TINY_VLLM_SPEC = TINY_SPECS["qwen2-vllm"]


def build_tiny_model(folder: Path) -> str:
    """A seeded random tiny Qwen2 + hpcrl's char tokenizer, saved as a local HF folder."""
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(folder)
    model = build_random_model(TINY_VLLM_SPEC, vocab_size=len(tokenizer))
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder)


def vllm_spec(path: str, cfg: VllmCfg = VLLM_CFG, seed: int = 0) -> EngineSpec:
    """The spec of a CPU vLLM engine over the model at ``path`` (what ``VllmEngine`` and
    ``EngineNodeWorkers`` are built from)."""
    return EngineSpec(
        backend="vllm", model_path=path, tokenizer_path=path, device="cpu",
        precision=cfg.precision, seed=seed, max_model_len=None, vllm_cfg=cfg,
    )  # fmt: skip


def encode(tokenizer, texts: Sequence[str] = PROMPT_TEXTS) -> list[list[int]]:
    return [tokenizer(text)["input_ids"] for text in texts]


def responses(out: dict) -> list[list[int]]:
    """Generated token ids of every row."""
    return [
        out["input_ids"][row][out["response_mask"][row].bool()].tolist()
        for row in range(out["input_ids"].shape[0])
    ]


def response_logprobs(out: dict) -> list[torch.Tensor]:
    return [
        out["generation_logprobs"][row][out["response_mask"][row].bool()]
        for row in range(out["input_ids"].shape[0])
    ]


def assert_logprobs_close(out: dict, reference: dict, atol: float) -> None:
    """Each row's response log-probs within `atol` of the reference's (same shapes)."""
    for row, (got, want) in enumerate(
        zip(response_logprobs(out), response_logprobs(reference), strict=True)
    ):
        assert got.shape == want.shape, row
        assert torch.allclose(got, want, atol=atol, rtol=0), (row, (got - want).abs().max())


def torch_sampler_generate(
    model, tokenizer, prompt_ids: list[list[int]], cfg: GenerationCfg, seed: int = 0
) -> dict:
    from hpcrl.core.generation.padding import pad_prompts
    from hpcrl.core.generation.torch_sampler import generate

    input_ids, attention_mask = pad_prompts(prompt_ids, tokenizer.pad_token_id)
    return generate(
        model,
        input_ids,
        attention_mask,
        cfg,
        seed=seed,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tokenizer=tokenizer,
    )


def teacher_forced_logprobs(model, out: dict) -> torch.Tensor:
    """log p(token t | :t) of every row of ``out`` under ``model`` (HF forward, fp32)."""
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"]).logits
    picked = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(
        -1, out["input_ids"][:, 1:, None]
    )[..., 0]
    return torch.cat([torch.zeros(picked.shape[0], 1), picked], dim=1)


def wait_until_gone(pids: Sequence[int], timeout_s: float = 30.0) -> list[int]:
    """The pids still alive (zombies count as gone) after up to ``timeout_s``."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        alive = [pid for pid in pids if _alive(psutil, pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


class WorkerProcesses:
    """What ``watch_worker_processes`` saw: the pids of the workers (Ray actors of the classes
    watched: ``TrainingWorker`` unless told) and of the processes they started (a TP engine's
    vLLM engine core and per-rank workers; Python's multiprocessing resource tracker aside)."""

    def __init__(self, classes: Sequence[str] = ("TrainingWorker",)) -> None:
        self.classes = tuple(classes)
        self.workers: set[int] = set()
        self.started_by_workers: set[int] = set()

    def record(self, psutil) -> None:
        for process in psutil.Process().children(recursive=True):
            try:
                # A child a worker has just forked carries the worker's command line until
                # it execs (seen once on a loaded CI box): a worker's parent is never one.
                if not self._is_worker(process) or self._is_worker(process.parent()):
                    continue
                self.workers.add(process.pid)
                for child in process.children(recursive=True):
                    if "resource_tracker" not in " ".join(child.cmdline()):
                        self.started_by_workers.add(child.pid)
            except psutil.Error:  # ended between the listing and the look
                continue

    def _is_worker(self, process) -> bool:
        if process is None:
            return False
        command = " ".join(process.cmdline())
        return any(name in command for name in self.classes)


@contextmanager
def watch_worker_processes(
    every_s: float = 0.5, classes: Sequence[str] = ("TrainingWorker",)
) -> Iterator[WorkerProcesses]:
    """Records, while the block runs (a whole ``run_training`` in this process, whose worker
    pids a test cannot ask for), every training worker below this process and what it
    started, for ``wait_until_gone`` after the block."""
    import psutil

    seen, stop = WorkerProcesses(classes), threading.Event()

    def poll() -> None:
        while not stop.wait(every_s):
            seen.record(psutil)

    poller = threading.Thread(target=poll, name="watch-worker-processes", daemon=True)
    poller.start()
    try:
        yield seen
    finally:
        stop.set()
        poller.join()


def _alive(psutil, pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def perturbed(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every weight scaled and shifted by a fixed pattern (a stand-in for a training step)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: tensor * 1.5 + 0.05 * torch.randn(tensor.shape, generator=gen)
        for name, tensor in model.state_dict().items()
    }

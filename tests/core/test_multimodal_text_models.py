"""Checkpoints whose architecture is a multimodal wrapper around a text decoder
(``MULTIMODAL_TEXT_MODEL_TYPES``: Gemma 3's and Mistral 3's ``...ForConditionalGeneration``,
NeMo RL's gemma-3-27b-it and Mistral-Medium-3.5 text recipes) train on text through the
Automodel backend's own worker, as NeMo RL trains them: the whole wrapper loaded, only the
language model run, the vision tower frozen.

Tiny random checkpoints of each, saved by transformers (so their keys are in the
checkpoint's own layout, ``language_model.model.*``), go through one in-process worker
(gloo, world size 1): its log-probs equal the wrapper's own forward on text, a few steps on
one batch lower the loss and leave the vision weights untouched, and the weights it refits
to vLLM and the HF folder it exports carry exactly the checkpoint's key names and shapes.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from hpcrl.config.architectures import MULTIMODAL_TEXT_MODEL_TYPES, TRANSFORMERS_5_MODEL_TYPES
from tests.core.parallel_harness import make_batch, masked_nll_loss, reference_logprobs

TEXT = dict(
    vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, head_dim=8,
)  # fmt: skip
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              image_size=28, patch_size=14)  # fmt: skip
#: per model type: the wrapper's config (image tokens above the ids make_batch draws)
CONFIGS: dict[str, dict[str, Any]] = {
    "gemma3": dict(
        text_config=dict(TEXT, query_pre_attn_scalar=8, sliding_window=4, sliding_window_pattern=2),
        vision_config=VISION, mm_tokens_per_image=4, image_token_index=127, boi_token_index=125,
        eoi_token_index=126,
    ),
    "mistral3": dict(
        text_config=dict(TEXT, model_type="mistral", tie_word_embeddings=False),
        vision_config=dict(VISION, model_type="pixtral", head_dim=8), image_token_index=127,
    ),
}  # fmt: skip
#: the ones this Python's transformers 4 builds (tests/transformers5 has the others)
HERE = tuple(t for t in MULTIMODAL_TEXT_MODEL_TYPES if t not in TRANSFORMERS_5_MODEL_TYPES)


def build_tiny(folder: Path, model_type: str, configs: dict[str, dict[str, Any]] = CONFIGS) -> str:
    from transformers import AutoConfig, AutoModelForImageTextToText

    from hpcrl.core.models.tiny import build_char_tokenizer

    config = AutoConfig.for_model(model_type, **configs[model_type])
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(config, dtype=torch.float32).save_pretrained(folder)
    build_char_tokenizer().save_pretrained(folder)
    return str(folder)


def saved_tensors(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def wrapper_logprobs(path: str, batch: dict, model: Any = None) -> torch.Tensor:
    """The wrapper's own forward on text (Gemma 3 with token_type_ids 0, as NeMo RL calls it);
    ``model``: that wrapper already loaded (training it), else loaded from ``path``."""
    from transformers import AutoModelForImageTextToText

    if model is None:
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    # the zero token-type ids NeMo RL passes (text only) to the Gemmas' forward
    type_ids = {"gemma3": "token_type_ids", "gemma4": "mm_token_type_ids"}
    if model.config.model_type not in type_ids:
        return reference_logprobs(model, batch)
    ids = batch["input_ids"]
    extra = {type_ids[model.config.model_type]: torch.zeros_like(ids)}
    logits = model(input_ids=ids, attention_mask=batch["attention_mask"], **extra).logits
    picked = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros(ids.shape[0], 1), picked], dim=1)


@pytest.fixture
def worker_on(tmp_path):
    """Starts the Automodel worker (one gloo rank) on a tiny checkpoint of a model type."""
    import torch.distributed as dist

    from hpcrl.core.backends.automodel.worker import AutomodelWorker
    from hpcrl.core.backends.base import RankInfo
    from tests.recipe_builder import tiny_automodel_recipe

    started: list[Any] = []

    def start(model_type: str, configs: dict[str, dict[str, Any]] = CONFIGS) -> tuple[Any, str]:
        path = build_tiny(tmp_path / model_type, model_type, configs)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)  # fmt: skip
        info = RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                        master_addr="127.0.0.1", master_port=port, device="cpu")  # fmt: skip
        worker = AutomodelWorker()
        started.append(worker)
        worker.setup(tiny_automodel_recipe(micro_batch_size=2, lr=1e-2), info, path)
        return worker, path

    yield start
    for worker in started:
        worker.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def test_every_multimodal_type_has_a_tiny_model_here():
    assert set(CONFIGS) == set(HERE)


@pytest.mark.parametrize("model_type", HERE)
def test_the_worker_trains_the_text_decoder_and_refits_in_the_checkpoint_layout(
    worker_on, tmp_path, model_type
):
    from hpcrl.core.workers.sharding import split_micro_batches

    worker, path = worker_on(model_type)
    checkpoint = saved_tensors(path)
    assert type(worker.model.hf).__name__.endswith("ForConditionalGeneration")
    batch = make_batch(seed=3, batch_size=4)
    mask = batch["attention_mask"].bool()
    got = worker.logprobs(batch)
    torch.testing.assert_close(got[mask], wrapper_logprobs(path, batch)[mask], atol=1e-5, rtol=0)

    tokens = float(batch["token_mask"].sum())
    losses = [
        worker.train_step(split_micro_batches(batch, 2), masked_nll_loss, tokens)["loss"]
        for _ in range(3)
    ]
    assert losses[-1] < losses[0]

    refit = dict(worker.export_hf_weights())
    head = "language_model.lm_head.weight"
    tied = {head} if head not in checkpoint else set()  # Gemma 3 ties it to the embeddings
    assert set(refit) - tied == set(checkpoint)
    for name, saved in checkpoint.items():
        assert refit[name].shape == saved.shape, name
        if "vision_tower" in name or "multi_modal_projector" in name:
            torch.testing.assert_close(refit[name], saved, atol=0, rtol=0, msg=name)
    embed = "language_model.model.embed_tokens.weight"
    assert not torch.equal(refit[embed], checkpoint[embed])  # the decoder did train

    out = tmp_path / "export"
    worker.export_hf(str(out))
    exported = saved_tensors(str(out))
    assert {k: v.shape for k, v in exported.items()} == {k: v.shape for k, v in checkpoint.items()}
    torch.testing.assert_close(exported[embed], refit[embed].cpu())


def wrapper_training(path: str, recipe: Any, batches: list[dict]) -> list[float]:
    """Losses of plain torch training of the whole wrapper (vision frozen) on text."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    for name, param in model.named_parameters():
        param.requires_grad_("language_model" in name or name.startswith("lm_head"))
    cfg = recipe.policy.optimizer
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trained, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    losses = []
    for batch in batches:
        loss, _ = masked_nll_loss(wrapper_logprobs(path, batch, model), batch,
                                  float(batch["token_mask"].sum()))  # fmt: skip
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, recipe.policy.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.slow
def test_fsdp_over_two_workers_trains_gemma3_as_one_process(ray_cluster, tmp_path):
    """FSDP2 shards the frozen vision tower with the trained root weights (mixed
    requires_grad in one group); the sharded run's losses equal one process's."""
    from tests.core.parallel_harness import full_weights, start_policy
    from tests.recipe_builder import tiny_automodel_recipe, with_policy

    path = build_tiny(tmp_path / "gemma3", "gemma3")
    recipe = with_policy(tiny_automodel_recipe(lr=1e-2), model_name=path)
    batches = [make_batch(seed=0)] * 3
    policy = start_policy(recipe, path, world_size=2)
    try:
        losses = [policy.train(batch, masked_nll_loss)["loss"] for batch in batches]
        weights = policy.group.call_same("run", full_weights)[0]
    finally:
        policy.shutdown()
    assert losses == pytest.approx(wrapper_training(path, recipe, batches), rel=1e-4, abs=1e-6)
    assert losses[-1] < losses[0]
    checkpoint = saved_tensors(path)
    vision = "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"
    torch.testing.assert_close(weights["model." + vision], checkpoint[vision], atol=0, rtol=0)


@pytest.mark.parametrize("model_type", HERE)
def test_refit_names_follow_the_layout_the_checkpoint_is_in(tmp_path, model_type):
    """A legacy-layout checkpoint (what transformers 4 writes) gets its own names back; one
    already in the model's layout keeps the model's names."""
    from transformers import AutoModelForImageTextToText

    from hpcrl.core.backends.automodel.multimodal import checkpoint_key_names, saved_key_names

    path = build_tiny(tmp_path / model_type, model_type)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    legacy = saved_key_names(path)
    rename = checkpoint_key_names(model, legacy)
    assert {rename(name) for name in model.state_dict()} - legacy <= {
        "language_model.lm_head.weight"
    }
    assert rename("model.vision_tower.x") == "vision_tower.x"
    own_layout = set(model.state_dict())
    keep = checkpoint_key_names(model, own_layout)
    assert all(keep(name) == name for name in own_layout)
    assert saved_key_names(str(tmp_path / "nowhere")) == set()

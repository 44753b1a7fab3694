"""What a fine-tune trains and what it writes: LoRA adapters through peft (Hu et al. 2022: each targeted weight W
is run as W + (alpha / rank) B A with A [rank, in] and B [out, rank] trained, B starting at zero), optionally the
embeddings and norms too (LongLoRA, Chen et al. 2024, found them needed for long contexts), or every weight.

``TrainableView`` is the lab's training loop's view of the model (posenc.lab.train.train_step runs it): its
forward takes token ids and PoSE position ids stacked, and its state_dict is the trainable weights alone, so a
checkpoint (posenc.lab.checkpoint) holds the adapters, not the frozen model.
"""

from __future__ import annotations

from pathlib import Path

import torch

from posenc._internal.errors import ConfigError

# what DIR/adapters holds besides peft's files with --train-embeddings-norms (LongLoRA keeps them apart the same way)
EMBEDDINGS_NORMS_FILE = "embeddings_norms.safetensors"
# the prefix peft puts before the wrapped transformers model's parameter names
PEFT_PREFIX = "base_model.model."


class TrainableView(torch.nn.Module):
    """``forward(inputs LongTensor [B, 2, W])`` -> logits [B, W, vocab]: row 0 of ``inputs`` the token ids, row 1
    their position ids. ``state_dict()``/``load_state_dict()``: the parameters that require grad, by name."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=inputs[:, 0], position_ids=inputs[:, 1], use_cache=False).logits

    def trainable(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self.trainable().items()}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        own = self.trainable()
        with torch.no_grad():
            for name, p in own.items():
                p.copy_(state_dict[name])
        return torch.nn.modules.module._IncompatibleKeys([], [])


def embeddings_and_norms(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The input embeddings' and every normalization layer's parameters of ``model`` (a tied output head shares
    the embedding's), by name. Norms are the modules whose class name holds "Norm" (RMSNorm, LayerNorm)."""
    chosen = {id(p) for p in model.get_input_embeddings().parameters()}
    for module in model.modules():
        if "norm" in type(module).__name__.lower():
            chosen |= {id(p) for p in module.parameters(recurse=False)}
    return {n: p for n, p in model.named_parameters() if id(p) in chosen}


def make_trainable(model: torch.nn.Module, *, full: bool = False, rank: int = 8, alpha: float = 16.0,
                   target_modules=("q_proj", "k_proj", "v_proj", "o_proj"), embeddings_norms: bool = False,
                   seed: int = 0) -> torch.nn.Module:
    """``model`` ready to train: every weight trainable (``full``), or wrapped by peft with LoRA adapters of
    ``rank`` and ``alpha`` (dropout 0, so a step is deterministic) on ``target_modules``, the rest frozen but the
    embeddings and norms when ``embeddings_norms``. The adapters' A matrices are drawn under ``seed``."""
    if full:
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [m for m in target_modules if m not in names]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(f"target_modules: {', '.join(missing)} not in the model; its linear layers are "
                          f"{', '.join(linear)}")
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(target_modules),
                        bias="none", task_type="CAUSAL_LM")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, config)
    if embeddings_norms:
        for p in embeddings_and_norms(wrapped).values():
            p.requires_grad_(True)
    return wrapped


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "merge_and_unload")


def save_adapters(model: torch.nn.Module, folder: str | Path, embeddings_norms: bool) -> None:
    """Write peft's adapter folder (adapter_config.json, adapter_model.safetensors) into ``folder``, plus the
    trained embeddings and norms (EMBEDDINGS_NORMS_FILE, named as in the transformers model) when they trained."""
    from safetensors.torch import save_file

    model.save_pretrained(str(folder))
    if embeddings_norms:
        tensors = {n.removeprefix(PEFT_PREFIX): p.detach().contiguous().clone()
                   for n, p in embeddings_and_norms(model).items()}
        save_file(tensors, str(Path(folder) / EMBEDDINGS_NORMS_FILE), metadata={"format": "pt"})


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model with the adapters added into its weights (W + (alpha / rank) B A); a model without
    adapters (--full) as it is. peft's merge changes ``model`` in place: the adapters are gone from it after."""
    return model.merge_and_unload() if is_peft(model) else model


def count_parameters(model: torch.nn.Module) -> dict:
    """{"trainable": n, "total": n}: parameters counted once (a tied head is the embedding)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return {"trainable": trainable, "total": total}

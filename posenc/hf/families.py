"""The transformers decoder families whose rotary embedding posenc can hook (``posenc.patch``, with or without an
attention method): their model types and how to find their single ``rotary_emb``."""

from __future__ import annotations

from torch import nn

from posenc._internal.errors import PosencError

# model_type -> families whose attention calls the modelling file's apply_rotary_pos_emb(q, k, cos, sin) with
# cos/sin from model.rotary_emb (transformers 5). Others are refused: their rotary code differs (interleaved
# GPT-J/CodeGen, multimodal M-RoPE, DeepSeek's complex form, per-layer NoPE, ...).
SUPPORTED_MODEL_TYPES = {
    "llama": "Llama", "mistral": "Mistral", "mixtral": "Mixtral", "qwen2": "Qwen2", "qwen2_moe": "Qwen2-MoE",
    "qwen3": "Qwen3", "qwen3_moe": "Qwen3-MoE", "phi3": "Phi-3", "gemma": "Gemma", "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3 (text)", "gpt_neox": "GPT-NeoX",
}


def find_rotary(model: nn.Module, what: str = "patch") -> tuple[nn.Module, str, nn.Module]:
    """-> (parent module, attribute name, rotary module) of the model's single ``rotary_emb`` (transformers 5
    decoders compute cos/sin there once per forward). ``what`` names the caller in the error."""
    found = [(name, module) for name, module in model.named_modules() if name.rsplit(".", 1)[-1] == "rotary_emb"]
    if len(found) != 1:
        raise PosencError(f"{what}: {type(model).__name__} has {len(found)} modules named rotary_emb; expected one "
                          "(a text decoder of a supported family)")
    name, module = found[0]
    parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    return parent, name.rsplit(".", 1)[-1], module


def check_supported(model: nn.Module) -> None:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        families = ", ".join(sorted(set(SUPPORTED_MODEL_TYPES.values())))
        raise PosencError(f"patch: {type(model).__name__} (model_type {model_type!r}) is not supported; posenc.patch "
                          f"knows {families}, whose attention applies RoPE through the modelling file's "
                          "apply_rotary_pos_emb(q, k, cos, sin) with cos/sin from model.rotary_emb")

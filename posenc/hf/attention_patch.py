"""``posenc.patch(model, posenc.SelfExtend(group_size=..., window=...))``, or the same by name,
``posenc.patch(model, method="self-extend", group_size=..., window=...)``: an attention method (posenc.attention's
registry) on a loaded transformers decoder. Both forms reach ``posenc.attention.attention_rule``, which fills the
options left out from the model's trained length (``posenc.rope.contexts.trained_length``).

The hook, without copying any attention code:

1. The model's ``rotary_emb`` is wrapped: it still runs (so transformers' length rules, dynamic NTK or LongRoPE's
   short/long switch, keep their meaning), but returns cos = 1 and sin = 0, so the modelling file's
   ``apply_rotary_pos_emb`` leaves q and k as they are (x * 1 + rotate_half(x) * 0 = x exactly). The KV cache
   therefore holds UNROTATED keys, as Self-Extend's and StreamingLLM's own code keep them.
2. ``config._attn_implementation`` becomes "posenc_rule", an attention function registered with transformers'
   AttentionInterface (and sdpa's mask function under the same name). Each layer calls it with q, k, v; it rotates
   them to the rule's positions and runs ``posenc.attention.kernel.rule_attention`` (blocked, online
   softmax, GQA). Frequencies (inv_freq, attention_scaling) come from the wrapped rotary module, per layer type
   (Gemma 3).

Sliding-window layers (Gemma 3's local layers; Mistral when its window is shorter than the keys) only see keys
inside their window, already within the trained range: they run plain RoPE attention. Gemma 3's local layers run
the band kernel (``posenc.attention.kernel.band_attention``: only the keys inside the window, so a 512-token window
costs T x 512, not T x T) when transformers' mask is its plain sliding mask; otherwise (padding, torch.compile) SDPA
with the mask over the whole square.
Padding (a mask that is not the plain causal one), attention-logit softcapping (Gemma 2) and position ids that are not
past..past+T-1 are refused with a PosencError. ``posenc.unpatch`` restores the rotary module, the attention
implementation and the layers, object for object: logits are transformers' own again, bit for bit.
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from posenc.attention.registry import attention_method_names
from posenc.hf.attention_interface import is_band_mask, register
from posenc._internal.errors import PosencError

IMPLEMENTATION = "posenc_rule"


class RuleRotaryEmbedding(nn.Module):
    """Wraps a transformers XxxRotaryEmbedding: runs it (length rules) and records its frequencies and the position
    ids of the forward, then returns cos = 1, sin = 0 so that q and k pass unrotated into the cache."""

    def __init__(self, original: nn.Module, rule, method: str):  # method: the rule's registered name
        super().__init__()
        self.original, self.rule, self.method = original, rule, method
        self.position_ids: torch.Tensor | None = None
        self._register_rule()

    def _register_rule(self) -> None:
        """Name the rule for compiled graphs (rule_attention_op) by a key that lives as long as this module."""
        self.key = id(self)
        _RULES[self.key] = self.rule
        weakref.finalize(self, _RULES.pop, self.key, None).atexit = False

    def __setstate__(self, state) -> None:
        # a copy (copy.deepcopy, pickle) is a new object with its own rule: it gets its own key
        super().__setstate__(state)
        self._register_rule()

    def frequencies(self, layer_type: str | None) -> tuple[torch.Tensor, float]:
        prefix = "" if layer_type is None else f"{layer_type}_"
        inv = getattr(self.original, f"{prefix}inv_freq", None)
        if inv is None:
            inv = getattr(self.original, "inv_freq")
            prefix = ""
        return inv.detach().float(), float(getattr(self.original, f"{prefix}attention_scaling"))

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None):
        cos, sin = (self.original(x, position_ids) if layer_type is None
                    else self.original(x, position_ids, layer_type))
        self.position_ids = position_ids
        return torch.ones_like(cos), torch.zeros_like(sin)


def _contiguous_offset(position_ids: torch.Tensor | None, t_q: int, t_k: int) -> int:
    """Check that the queries sit at t_k - t_q .. t_k - 1 in every row (no padding, no packed sequences)."""
    if position_ids is None:
        return t_k - t_q
    rows = position_ids.reshape(-1, position_ids.shape[-1])
    want = torch.arange(t_k - t_q, t_k, device=rows.device)
    if rows.shape[-1] != t_q or not bool((rows == want).all()):
        raise PosencError(f"posenc.patch(method=...): position ids must be past..past+T-1 with the same past in every "
                          f"row (no left padding or packed sequences); got {rows[:, :4].tolist()}... for {t_q} "
                          f"queries over {t_k} keys")
    return t_k - t_q


def _check_causal_mask(mask, t_q: int, t_k: int) -> None:
    if mask is None:
        return
    m = mask if mask.dtype == torch.bool else mask == 0
    i = torch.arange(t_k - t_q, t_k, device=m.device)[:, None]
    j = torch.arange(t_k, device=m.device)[None, :]
    if not bool((m == (j <= i)).all()):
        raise PosencError("posenc.patch(method=...): the attention mask is not the plain causal one (padding?); "
                          "attention methods run on unpadded batches")


def rule_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                           sliding_window: int | None = None, softcap: float | None = None, **kwargs):
    """transformers' attention-function interface: query [B, Hq, Tq, D], key/value [B, Hk, Tk, D] (unrotated) ->
    (output [B, Tq, Hq, Dv], None)."""
    rotary: RuleRotaryEmbedding | None = getattr(module, "posenc_rule_rotary", None)
    if rotary is None:
        raise PosencError(f"{type(module).__name__}: config._attn_implementation is {IMPLEMENTATION!r} but the model "
                          "is not patched with an attention method (call posenc.patch(model, method=...))")
    if softcap is not None:
        raise PosencError("posenc.patch(method=...): attention-logit softcapping (Gemma 2) is not supported")
    if dropout:
        raise PosencError(f"posenc.patch(method=...): attention dropout {dropout} is not supported (inference "
                          "only: call model.eval())")
    t_q, t_k = query.shape[-2], key.shape[-2]
    inv_freq, att_scaling = rotary.frequencies(getattr(module, "layer_type", None))
    positions = rotary.position_ids
    if getattr(module, "is_sliding", False):
        window = sliding_window if sliding_window is not None else getattr(module, "sliding_window", None)
        out = _local_attention(query, key, value, attention_mask, positions, inv_freq, att_scaling, scaling, window)
        return out.transpose(1, 2).contiguous(), None
    if torch.compiler.is_compiling():      # the rule's kernel reads its key bands on the host: one opaque op
        out = rule_attention_op(query, key, value, positions, attention_mask, rotary.key, inv_freq, att_scaling,
                                scaling, sliding_window)
    else:
        out = _rule_attention(query, key, value, positions, attention_mask, rotary.rule, inv_freq, att_scaling,
                              scaling, sliding_window)
    return out.transpose(1, 2).contiguous(), None


def _local_attention(query, key, value, mask, positions, inv_freq, att_scaling, scaling, window) -> torch.Tensor:
    """A local layer (Gemma 3): plain RoPE inside its window, whose distances stay below it. query [B, Hq, Tq, D],
    key/value [B, Hk, Tk, D] (unrotated; the cache holds the last Tk keys) -> [B, Hq, Tq, Dv].

    Eager, with transformers' own sliding mask (or none) over contiguous positions: the band kernel
    (``band_attention``), which reads only the keys inside the window, so the layer costs Tq x window, not Tq x Tk.
    Otherwise (under torch.compile, a padded or unknown mask): SDPA over the whole square with the mask."""
    t_q, t_k = query.shape[-2], key.shape[-2]
    if mask is not None and mask.dim() == 4 and mask.shape[-1] != t_k:
        mask = mask[:, :, :, -t_k:]          # (only then: the same tensor object lets is_band_mask keep its answer)
    if (window is not None and not torch.compiler.is_compiling() and query.device.type == "cpu"
            and is_band_mask(mask, t_q, t_k, int(window))
            and _contiguous_offset_or_none(positions, t_q) is not None):
        from posenc.attention.kernel import band_attention

        return band_attention(query, key, value, int(window), inv_freq, attention_scaling=att_scaling,
                              scale=scaling, layout="half")
    return _masked_local_attention(query, key, value, mask, positions, inv_freq, att_scaling, scaling)


def _contiguous_offset_or_none(positions: torch.Tensor | None, t_q: int) -> int | None:
    """The first query's position when every row's positions run last - Tq + 1 .. last (no padding), else None."""
    if positions is None:
        return 0
    rows = positions.reshape(-1, positions.shape[-1])
    if rows.shape[-1] != t_q:
        return None
    first = rows[:, :1]
    ok = bool((rows == first + torch.arange(t_q, device=rows.device)).all()) and bool((first == first[0]).all())
    return int(first[0, 0]) if ok else None


def _masked_local_attention(query, key, value, mask, positions, inv_freq, att_scaling, scaling) -> torch.Tensor:
    """The local layer as SDPA over the whole [Tq, Tk] square with transformers' mask: its cache holds the last keys
    only, so keys sit at last - Tk + 1 .. last (positions offset in the graph: no host sync, traceable)."""
    from posenc.attention.kernel import rotate

    t_q, t_k = query.shape[-2], key.shape[-2]
    last = positions.amax().to(torch.float64) if positions is not None else float(t_k - 1)
    q_pos = torch.arange(t_q, device=query.device, dtype=torch.float64) + (last - t_q + 1)
    k_pos = torch.arange(t_k, device=query.device, dtype=torch.float64) + (last - t_k + 1)
    q = rotate(query, q_pos, inv_freq, att_scaling, "half").to(query.dtype)
    k = rotate(key, k_pos, inv_freq, att_scaling, "half").to(key.dtype)
    return F.scaled_dot_product_attention(q, k, value, attn_mask=mask, is_causal=mask is None and t_q > 1,
                                          scale=scaling, enable_gqa=query.shape[1] != key.shape[1])


def _rule_attention(query, key, value, positions, mask, rule, inv_freq, att_scaling, scaling,
                    sliding_window) -> torch.Tensor:
    """A full-attention layer under ``rule``: its input checks (a window no shorter than the input, no padding,
    contiguous positions), then the kernel. Reads positions and mask by value: eager, or inside rule_attention_op."""
    from posenc.attention.kernel import rule_attention

    t_q, t_k = query.shape[-2], key.shape[-2]
    last = int(positions.max()) if positions is not None else t_k - 1
    if sliding_window is not None and last + 1 > sliding_window:
        raise PosencError(f"posenc.patch(method=...): this layer's sliding window ({sliding_window}) is shorter than "
                          f"the input ({last + 1} tokens); attention methods run on full-attention layers only")
    offset = _contiguous_offset(positions, t_q, t_k)
    _check_causal_mask(mask, t_q, t_k)
    return rule_attention(query, key, value, rule, inv_freq, attention_scaling=att_scaling, scale=scaling,
                          layout="half", q_offset=offset)


# Under torch.compile the rule's kernel is one custom op: the kernel picks its pieces from the key bands of each
# block of queries, read on the host, and checks the positions and the mask by value, none of which a trace can
# follow. A rule is a Python object (plug-ins register their own), so the op names it by its patch's key.
_RULES: dict[int, object] = {}


@torch.library.custom_op("posenc::rule_attention", mutates_args=())
def rule_attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      positions: Optional[torch.Tensor], mask: Optional[torch.Tensor], rule_key: int,
                      inv_freq: torch.Tensor, attention_scaling: float, scaling: Optional[float],
                      sliding_window: Optional[int]) -> torch.Tensor:
    """``_rule_attention`` with the rule of a live patch (``RuleRotaryEmbedding.key``): [B, Hq, Tq, Dv]."""
    rule = _RULES.get(rule_key)
    if rule is None:
        raise PosencError("posenc::rule_attention: the attention method's patch is gone (posenc.unpatch): compile "
                          "the model again after patching it")
    return _rule_attention(query, key, value, positions, mask, rule, inv_freq, attention_scaling, scaling,
                           sliding_window).contiguous()


@rule_attention_op.register_fake
def _(query, key, value, positions, mask, rule_key, inv_freq, attention_scaling, scaling, sliding_window):
    return query.new_empty(query.shape[0], query.shape[1], query.shape[2], value.shape[3])


def _attention_layers(model: nn.Module):
    return [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "is_causal")
            and any(hasattr(m, p) for p in ("q_proj", "qkv_proj"))]


def check_config(config) -> None:
    """Refuse, before loading, a model type posenc.patch(method=...) does not cover (PosencError naming it)."""
    from posenc.hf.families import SUPPORTED_MODEL_TYPES

    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES or model_type == "gpt_neox":
        covered = sorted({v for k, v in SUPPORTED_MODEL_TYPES.items() if k != "gpt_neox"})
        raise PosencError(f"methods: attention methods cover {', '.join(covered)}; this model's model_type is "
                          f"{model_type!r}")


def patch_attention(model: nn.Module, method, *, target: int | None = None, **options) -> nn.Module:
    """Apply attention method ``method`` to ``model``: a rule (``posenc.SelfExtend(window=1024)``), or a method
    name with its options (group_size, window, ...); see the module docstring. target: the length the defaults plan
    for (default 4x the trained length). Returns ``model``."""
    from posenc.attention import as_rule, attention_rule, is_attention_method
    from posenc.extensions import ExtensionSpec, method_names
    from posenc.hf.families import check_supported, find_rotary
    from posenc.rope.contexts import trained_length

    if isinstance(method, str) and method in method_names():
        raise PosencError(f"method: {method!r} rescales RoPE's frequencies; write it into the config instead "
                          f"(posenc extend CONFIG --method {method}); posenc.patch's method= takes "
                          f"attention methods ({', '.join(attention_method_names())})")
    from posenc.attention.spec import is_patch_spec, read_patch_spec

    if is_patch_spec(method) and not (isinstance(method, str) and is_attention_method(method)):
        method = read_patch_spec(method)     # a patch spec: a dict or .json file (posenc tune's patch_spec.json)
    rule = as_rule(method, **options)    # an unknown name or option is refused before the model is looked at
    check_supported(model)     # (a model posenc has patched already is refused by posenc.patch, which calls this)
    if getattr(model.config, "model_type", None) == "gpt_neox":
        raise PosencError("patch: attention methods need a transformers attention function; GPT-NeoX is not covered")
    original = trained_length(model)
    target = 4 * original if target is None else target
    spec = ExtensionSpec(original=original, factor=max(1.0, target / original), rotary_dim=None, target=int(target))
    rule = attention_rule(rule, spec)
    register(IMPLEMENTATION, rule_attention_forward)
    parent, attr, rotary = find_rotary(model)
    wrapper = RuleRotaryEmbedding(rotary, rule, rule.name)
    layers = _attention_layers(model)
    if not layers:
        raise PosencError(f"patch: found no attention layers in {type(model).__name__}")
    wrapper.previous_implementation = model.config._attn_implementation
    setattr(parent, attr, wrapper)
    for layer in layers:  # a plain attribute, not a registered submodule (no second path to it, no state dict entry)
        object.__setattr__(layer, "posenc_rule_rotary", wrapper)
    model.config._attn_implementation = IMPLEMENTATION
    return model


def unpatch_attention(model: nn.Module) -> bool:
    """Undo ``patch_attention``; True when something was undone."""
    done = False
    for name, module in list(model.named_modules()):
        if isinstance(module, RuleRotaryEmbedding):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], module.original)
            model.config._attn_implementation = module.previous_implementation
            done = True
    for layer in model.modules():
        if "posenc_rule_rotary" in vars(layer):
            del layer.posenc_rule_rotary
    return done


def attention_path(model: nn.Module) -> str:
    """In words, the attention code a forward of ``model`` runs, for reports (``posenc eval``'s results.json): the
    attention implementation transformers dispatches to and, under posenc.patch, which posenc kernel runs each kind
    of layer and what runs its pieces on the model's device and dtype; under ``posenc.hf.band_route``, sdpa with the
    sliding layers on the band kernel."""
    from posenc.hf import band_route

    implementation = getattr(model.config, "_attn_implementation", None) or "eager"
    if implementation == band_route.IMPLEMENTATION:
        return band_route.PATH
    # the layers posenc.patch runs on the band (Gemma 3's local layers); transformers' windows are the config's
    sliding = any(getattr(m, "is_sliding", False) for m in _attention_layers(model))
    if implementation != IMPLEMENTATION:
        if sliding or band_route.has_sliding_layers(model.config):
            return f"{implementation} (sliding layers: the whole square with transformers' mask)"
        return implementation
    try:
        parameter = next(model.parameters())
        device, dtype = parameter.device.type, parameter.dtype
    except StopIteration:
        device, dtype = "cpu", torch.float32
    # the kernel's pieces: torch's CPU flash kernel for CPU floats below float64, an exact matmul softmax otherwise
    pieces = ("torch's CPU flash kernel per piece" if device == "cpu" and dtype != torch.float64
              else "matmul + log-sum-exp per piece")
    return f"{IMPLEMENTATION} (blocked rule_attention, {pieces}" + (", band for sliding layers)" if sliding else ")")

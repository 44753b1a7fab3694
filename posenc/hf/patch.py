"""``posenc.patch(model)``: run a loaded transformers model's rotary embedding through posenc's fused kernel.

    >>> model = AutoModelForCausalLM.from_pretrained(path)
    >>> posenc.patch(model)          # same logits; RoPE by posenc.apply_rope_table with cached cos/sin tables
    >>> posenc.unpatch(model)        # back to transformers' own code, object for object

The hook. In transformers 5 the decoder computes ``position_embeddings = self.rotary_emb(hidden, position_ids)``
once per forward (cos and sin of shape [B, T, head_dim], the angles doubled by ``cat((freqs, freqs))``), and every
attention layer calls its modelling file's module-level ``apply_rotary_pos_emb(q, k, cos, sin)`` (q [B, Hq, T, Dh],
k [B, Hk, T, Dh]; rotate_half layout, partial rotary = the first cos.shape[-1] dims). patch() replaces the model's
``rotary_emb`` with ``PosencRotaryEmbedding``, which wraps the original and returns a ``RopeTable`` (float32 cos/sin
rows [*, T, R/2] gathered from a cached table) in place of (cos, sin); the modelling file's ``apply_rotary_pos_emb``
becomes a dispatcher that hands a ``RopeTable`` to ``posenc.apply_rope_table`` (one fused pass over q and one over k:
C on CPU, Triton on CUDA) and passes anything else to transformers' function unchanged. So the swap is per model
(unpatched models of the same family keep transformers' path bit for bit) and nothing of the attention code is copied.
The dispatcher is removed again when the last patched model of its family is unpatched (or garbage collected).

Frequencies stay transformers': before each forward the wrapper calls the original ``rotary_emb`` on the largest
position id alone, so its ``dynamic_rope_update`` (dynamic NTK growth and reset, LongRoPE short/long switch) runs
exactly as it would, then reads ``inv_freq`` and ``attention_scaling`` from it (``{layer_type}_inv_freq`` for
Gemma 3's per-layer-type RoPE). Every rope type transformers implements therefore keeps its meaning. The table of
positions 0..N-1 (angles formed in float64, cos/sin times attention_scaling, kept in float32) is rebuilt only when
those frequencies change or a longer position is needed (doubling).

Numerics. float32 models: logits agree with transformers' to ~1e-6 relative (transformers forms angles in float32,
posenc in float64; the rotation is the same arithmetic). bf16/fp16 models: transformers rounds cos/sin to the
activation dtype and rotates in it; posenc rotates in float32 and rounds once, so results differ by about one
rounding of the dtype (posenc's are the more accurate).
"""

from __future__ import annotations

import importlib
import sys
import threading
import weakref

import torch
from torch import nn

from posenc._internal.errors import PosencError
from posenc.hf.families import SUPPORTED_MODEL_TYPES, check_supported, find_rotary  # noqa: F401 (re-exported)

_lock = threading.Lock()
# modelling module name -> (transformers' apply_rotary_pos_emb, WeakSet of live patched wrappers)
_installed: dict[str, tuple] = {}


class RopeTable:
    """cos and sin rows for the positions of one forward: float32 [T, R/2] (one shared row of positions) or
    [B, T, R/2], already multiplied by attention_scaling. Stands in for transformers' (cos, sin) pair."""

    __slots__ = ("cos", "sin")

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):
        self.cos, self.sin = cos, sin

    def rotate(self, q: torch.Tensor, k: torch.Tensor, unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE on q and k ([B, H, T, Dh] for unsqueeze_dim 1, [B, T, H, Dh] for 2), half layout, first R dims."""
        from posenc.rope.apply import apply_rope_table, math_dtype

        if self.cos.shape[-1] == 0:  # rotary dim 0 (GPT-NeoX with partial_rotary_factor 0): nothing rotates
            return q, k
        cos, sin = self.cos, self.sin
        if cos.dim() == 2:
            cos, sin = cos[None], sin[None]
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        want = math_dtype(q.dtype)
        if cos.dtype != want or cos.device != q.device:
            cos, sin = cos.to(q.device, want), sin.to(q.device, want)
        return (apply_rope_table(q, cos, sin, layout="half"), apply_rope_table(k, cos, sin, layout="half"))


class PosencRotaryEmbedding(nn.Module):
    """Wraps a transformers XxxRotaryEmbedding: same call signature, returns (RopeTable, RopeTable).

    ``original`` keeps computing the frequencies (and their length rules); this module keeps a float32 cos/sin
    table per layer type, rebuilt when the frequencies change.
    """

    def __init__(self, original: nn.Module):
        super().__init__()
        self.original = original
        self._tables: dict = {}   # layer_type -> (inv_freq copy, attention_scaling, cos [N, R/2], sin [N, R/2])

    def _frequencies(self, layer_type):
        prefix = "" if layer_type is None else f"{layer_type}_"
        return getattr(self.original, f"{prefix}inv_freq"), float(getattr(self.original, f"{prefix}attention_scaling"))

    def _table(self, layer_type, needed: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        from posenc.rope.apply import rope_cos_sin

        inv_freq, scaling = self._frequencies(layer_type)
        inv_freq = inv_freq.detach().to(device=device, dtype=torch.float32)
        entry = self._tables.get(layer_type)
        if (entry is None or entry[1] != scaling or entry[2].device != inv_freq.device
                or not torch.equal(entry[0], inv_freq)):
            entry = None
        if entry is None or entry[2].shape[0] < needed:
            n = max(needed, 2 * entry[2].shape[0]) if entry is not None else max(needed, 256)
            cos, sin = rope_cos_sin(torch.arange(n, device=device), inv_freq, scaling)
            entry = (inv_freq.clone(), scaling, cos, sin)
            self._tables[layer_type] = entry
        return entry[2], entry[3]

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None):
        if torch.compiler.is_compiling():
            return self._traced(x, position_ids, layer_type)
        module_name = type(self.original).__module__
        if self not in _installed.get(module_name, ((), ()))[1]:  # a deep copy or unpickled model: route again
            _install_dispatcher(module_name, self)
        first, last = torch.aminmax(position_ids)
        # transformers' own length rule (dynamic / longrope) on the largest position, as its forward would apply it
        last = last.reshape(1, 1)
        self.original(x, last) if layer_type is None else self.original(x, last, layer_type)
        lowest, highest = torch.stack([first, last[0, 0]]).tolist()            # one host sync for both
        rows = position_ids[0] if position_ids.shape[0] == 1 else position_ids
        if lowest < 0:        # a negative position has no table row (indexing would wrap to the end): its own angles
            from posenc.rope.apply import rope_cos_sin

            inv_freq, scaling = self._frequencies(layer_type)
            table = RopeTable(*rope_cos_sin(rows, inv_freq.detach().to(rows.device, torch.float32), scaling))
            return table, table
        cos, sin = self._table(layer_type, highest + 1, position_ids.device)
        table = RopeTable(cos[rows], sin[rows])
        return table, table

    def _traced(self, x, position_ids, layer_type):
        """forward under torch.compile / torch.export: cos/sin of the positions computed in the graph (no host
        sync, no table whose size depends on the positions' values), as the table rows would hold them."""
        from posenc.angles import angles_cos_sin

        last = position_ids.amax().reshape(1, 1)      # transformers' length rule, as in forward (its own graph)
        self.original(x, last) if layer_type is None else self.original(x, last, layer_type)
        inv_freq, scaling = self._frequencies(layer_type)
        rows = position_ids[0] if position_ids.shape[0] == 1 else position_ids
        inv64 = inv_freq.detach().to(device=rows.device, dtype=torch.float32).to(torch.float64)
        table = RopeTable(*angles_cos_sin(rows, inv64, scaling, torch.float32))
        return table, table


def _install_dispatcher(module_name: str, wrapper: PosencRotaryEmbedding) -> None:
    """Make module_name.apply_rotary_pos_emb route RopeTables to posenc (once per module)."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    with _lock:
        if module_name not in _installed:
            original = getattr(module, "apply_rotary_pos_emb", None)
            if not callable(original):
                raise PosencError(f"patch: {module_name} has no apply_rotary_pos_emb to route (transformers changed?)")

            def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
                if isinstance(cos, RopeTable):
                    return cos.rotate(q, k, unsqueeze_dim)
                return original(q, k, cos, sin, unsqueeze_dim)

            dispatcher = apply_rotary_pos_emb
            if isinstance(original, nn.Module):
                dispatcher = _hub_kernel_dispatcher(original, apply_rotary_pos_emb)
            else:
                apply_rotary_pos_emb.__wrapped__ = original
                apply_rotary_pos_emb.__doc__ = (f"posenc dispatcher: RopeTable -> posenc.apply_rope_table, else "
                                                f"transformers' {module_name}.apply_rotary_pos_emb")
            _installed[module_name] = (original, weakref.WeakSet())
            module.apply_rotary_pos_emb = dispatcher
        if wrapper not in _installed[module_name][1]:
            _installed[module_name][1].add(wrapper)
            # a patched model that is garbage collected releases its hold too
            weakref.finalize(wrapper, _release_dispatcher, module_name, None).atexit = False


def _hub_kernel_dispatcher(original: nn.Module, route) -> nn.Module:
    """The dispatcher as an object of transformers' own class: with the ``kernels`` package installed, a modelling
    file's apply_rotary_pos_emb is a hub-kernel module object (``use_kernelized_func``), every attention layer
    keeps a private one, and pickle rebuilds those as ``type(module.apply_rotary_pos_emb)()``. A plain function
    there made ``torch.load`` of any pickled model of the family fail while one was patched; an object of another
    class would be rebuilt into unpickled models and loop through the kernel routing. So: a fresh object of the
    same class, whose instance ``forward`` routes posenc's tables and hands everything else to ``original``."""
    import types

    dispatcher = type(original)()

    def forward(self, *args, **kwargs):
        return route(*args, **kwargs)

    dispatcher.forward = types.MethodType(forward, dispatcher)
    return dispatcher


def _release_dispatcher(module_name: str, wrapper: PosencRotaryEmbedding | None) -> None:
    """Forget ``wrapper``; give the module transformers' function back when no patched model of it is left."""
    with _lock:
        entry = _installed.get(module_name)
        if entry is None:
            return
        if wrapper is not None:
            entry[1].discard(wrapper)
        if not any(True for _ in entry[1]):  # iterating skips wrappers already collected
            sys.modules[module_name].apply_rotary_pos_emb = entry[0]
            del _installed[module_name]


def is_patched(model: nn.Module) -> bool:
    """True when ``model``'s rotary embedding runs through posenc."""
    return any(isinstance(m, PosencRotaryEmbedding) for m in model.modules())


KERNEL = "posenc's RoPE kernel"


def patched_with(model: nn.Module) -> str | None:
    """What ``posenc.patch`` has put into ``model``: KERNEL, "the attention method 'NAME'", or None."""
    from posenc.hf.attention_patch import RuleRotaryEmbedding

    for m in model.modules():
        if isinstance(m, PosencRotaryEmbedding):
            return KERNEL
        if isinstance(m, RuleRotaryEmbedding):
            return f"the attention method {m.method!r}"
    return None


def patch(model: nn.Module, method=None, **options) -> nn.Module:
    """Swap the rotary application of a loaded transformers causal LM for posenc's fused kernel; returns ``model``.

    With ``method``, an attention method, the model's attention runs that method instead
    (posenc/hf/attention_patch.py). ``method`` is a typed rule, ``posenc.patch(model, posenc.SelfExtend(
    group_size=4, window=1024))``, or a registered name with the rule's fields as options, ``posenc.patch(model,
    method="self-extend", group_size=4, window=1024)``: the two forms are the same rule (self-extend, rerope,
    leaky-rerope, dca, sinks; options group_size, window, leak, chunk_size, local_window, n_sink). Fields left out
    are derived from the model's trained length; ``target`` = the length those defaults plan for. ``method`` may
    also be a patch spec, a dict or a .json file ``{"method": "rerope", "window": 16}`` (posenc.attention.spec;
    posenc tune writes one).

    Supported: the model types in ``SUPPORTED_MODEL_TYPES`` (Llama, Mistral, Mixtral, Qwen2/3 and their MoE
    variants, Phi-3, Gemma 1/2/3-text, GPT-NeoX). Anything else raises PosencError naming the class. Patching a
    model patched with the kernel again, without a method, does nothing; any other second patch is refused with a
    PosencError naming what the model is patched with (``posenc.unpatch(model)`` first). The frequencies, attention
    scaling and length rules stay transformers' (see the module docstring for the hook and the numerics).
    """
    if not isinstance(model, nn.Module):
        raise PosencError(f"patch: expected a transformers model (torch.nn.Module), got {type(model).__name__}")
    if options and method is None:
        raise PosencError(f"patch: options {', '.join(sorted(options))} need method=... (an attention method)")
    current = patched_with(model)
    if current == KERNEL and method is None:
        return model
    if current is not None:
        raise PosencError(f"patch: the model is already patched with {current}; posenc.unpatch(model) first, "
                          f"then patch it again")
    if method is not None:
        from posenc.hf.attention_patch import patch_attention

        return patch_attention(model, method, **options)
    check_supported(model)
    parent, attr, rotary = find_rotary(model)
    wrapper = PosencRotaryEmbedding(rotary)
    _install_dispatcher(type(rotary).__module__, wrapper)
    setattr(parent, attr, wrapper)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo ``patch``: the model gets its original rotary module back (the same object); the modelling file's
    apply_rotary_pos_emb is transformers' again once no patched model of that family remains. Unpatched models
    are returned unchanged. An attention method (``patch(model, method=...)``) is undone too."""
    from posenc.hf.attention_patch import unpatch_attention

    unpatch_attention(model)
    for name, module in list(model.named_modules()):
        if isinstance(module, PosencRotaryEmbedding):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], module.original)
            _release_dispatcher(type(module.original).__module__, module)
    return model

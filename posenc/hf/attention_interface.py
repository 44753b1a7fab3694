"""transformers' attention interface as posenc's attention routes use it: registering an implementation (with
sdpa's masks) and recognising transformers' plain sliding-window mask.

Both routes need these: ``posenc.hf.attention_patch`` (attention methods, implementation "posenc_rule") and
``posenc.hf.band_route`` (plain evaluation, "posenc_band"); they live here so that neither route imports the other.
"""

from __future__ import annotations

import weakref

import torch


def register(name: str, forward) -> None:
    """Register ``forward`` as transformers' attention implementation ``name`` (AttentionInterface), with sdpa's
    mask function under the same name, so that a model whose ``config._attn_implementation`` is ``name`` gets the
    very masks transformers makes for sdpa (a forward that falls back to sdpa hands them on unchanged)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(name, forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)


def is_band_mask(mask: torch.Tensor | None, t_q: int, t_k: int, window: int, rows: int = 1024) -> bool:
    """True when ``mask`` ([B, 1 or H, Tq, Tk], bool or additive; None counts as causal) keeps exactly the keys
    i - window < j <= i for query i = Tk - Tq + n: transformers' sliding mask of an unpadded batch.

    transformers hands every sliding layer of a forward the same mask tensor, so the answer is kept for that tensor
    (while it lives and is not written to): one check per forward, not one per layer. A block of rows at a time,
    the columns outside its band only need to be all masked (a fast reduction), the band's own columns are compared."""
    if mask is None:
        return t_k <= window     # no mask: plain causal, a band only while every key is inside the window
    if mask.dim() != 4 or mask.shape[-2] != t_q or mask.shape[-1] != t_k:
        return False
    key = (t_q, t_k, window, mask._version)
    ref, known, answer = _BAND_CHECK
    if ref is not None and ref() is mask and known == key:
        return answer
    answer = _band_rows_match(mask, t_q, t_k, window, rows)
    _BAND_CHECK[:] = [weakref.ref(mask), key, answer]
    return answer


_BAND_CHECK: list = [None, None, None]    # [weak reference to the last mask checked, its key, the answer]


def _band_rows_match(mask: torch.Tensor, t_q: int, t_k: int, window: int, rows: int) -> bool:
    for a in range(0, t_q, rows):
        b = min(t_q, a + rows)
        first, last = t_k - t_q + a, t_k - t_q + b            # the block's queries, as key indices [first, last)
        lo, hi = max(0, first - window + 1), last             # the only columns any of them may keep
        block = mask[:, :, a:b]
        kept = block if block.dtype == torch.bool else block == 0
        if bool(kept[..., :lo].any()) or bool(kept[..., hi:].any()):
            return False
        i = torch.arange(first, last, device=mask.device)[:, None]
        j = torch.arange(lo, hi, device=mask.device)[None, :]
        if not bool((kept[..., lo:hi] == ((j <= i) & (j > i - window))).all()):
            return False
    return True

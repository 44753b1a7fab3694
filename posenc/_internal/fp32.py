"""``Float32Buffers``: modules whose frequency / slope buffers stay float32 when the module is cast.

``model.half()`` or ``model.to(torch.bfloat16)`` casts every floating-point buffer, and a bf16 inv_freq is off by up
to 0.4%: at position 1500 that is radians of angle error. Buffers named in ``float32_buffers`` follow device moves
but keep their dtype (the math that reads them runs in float32 or wider whatever the activations).
"""

from __future__ import annotations

from torch import nn


class Float32Buffers(nn.Module):
    """Mixin: the buffers named in ``float32_buffers`` keep their dtype through ``.half()`` / ``.to(dtype)``."""

    float32_buffers: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        saved = {name: self._buffers[name] for name in self.float32_buffers if self._buffers.get(name) is not None}
        super()._apply(fn, recurse)
        for name, old in saved.items():
            self._buffers[name] = old.to(self._buffers[name].device)
        return self

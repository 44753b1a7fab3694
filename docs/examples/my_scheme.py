import torch
import posenc
from posenc.schemes import Scheme


@posenc.register_scheme("mine", description="learned per-head linear distance penalty")
class LearnedSlopes(Scheme):
    biases = True

    def __init__(self, n_heads):
        super().__init__()
        self.slope = torch.nn.Parameter(torch.full((n_heads, 1, 1), 0.1))

    def bias(self, q, k, ctx):  # -> [heads, queries, keys] (or [batch, heads, ...]), added to the attention logits
        distance = ctx.distance().abs().unsqueeze(-3)  # [1, Tq, Tk], or [B, 1, Tq, Tk] for per-row positions
        return -self.slope * distance

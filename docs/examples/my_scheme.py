import torch
import posenc
from posenc.schemes import Scheme


@posenc.register_scheme("mine", description="learned per-head linear distance penalty")
class LearnedSlopes(Scheme):
    biases = True

    def __init__(self, n_heads):
        super().__init__()
        self.slope = torch.nn.Parameter(torch.full((n_heads, 1, 1), 0.1))

    def bias(self, q, k, ctx):  # -> [heads, queries, keys], added to the attention logits
        return -self.slope * ctx.distance().abs()

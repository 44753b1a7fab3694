"""The ``xpos`` scheme: q and k against the paper's formula as a plain loop (the lesson's RoPE loop times
zeta_j^(+-n/B)), for shared and per-row positions; q.k a function of the offset only."""

import pytest
import torch

from posenc import reference
from posenc.rope.apply import default_inv_freq
from posenc.schemes import AttentionContext, make_scheme


def _loop(row, pos, *, key, gamma=0.4, scale_base=512.0):
    d = len(row)
    rotated = reference.apply_rope_half(row, pos, inv_freq=default_inv_freq(d).tolist())
    out = list(rotated)
    for j in range(d // 2):
        s = ((2 * j / d + gamma) / (1 + gamma)) ** ((-pos if key else pos) / scale_base)
        out[j], out[j + d // 2] = rotated[j] * s, rotated[j + d // 2] * s
    return out


@pytest.mark.parametrize("per_row", [False, True])
def test_rotate_qk_is_the_papers_formula(per_row):
    s = make_scheme("xpos", d_model=32, n_heads=2, max_len=64)           # head dim 16, layout "half"
    q, k = torch.randn(2, 2, 5, 16, dtype=torch.float64), torch.randn(2, 2, 5, 16, dtype=torch.float64)
    pos = torch.tensor([[0, 3, 9, 100, 700], [1, 2, 3, 4, 5]]) if per_row else torch.arange(40, 45)
    got_q, got_k = s.rotate_qk(q, k, AttentionContext(pos, pos))
    rows = pos if per_row else pos.expand(2, -1)
    for b in range(2):
        for h in range(2):
            for t in range(5):
                p = float(rows[b, t])
                torch.testing.assert_close(got_q[b, h, t], torch.tensor(_loop(q[b, h, t].tolist(), p, key=False),
                                                                        dtype=torch.float64), rtol=1e-9, atol=1e-9)
                torch.testing.assert_close(got_k[b, h, t], torch.tensor(_loop(k[b, h, t].tolist(), p, key=True),
                                                                        dtype=torch.float64), rtol=1e-9, atol=1e-9)
    assert s.capabilities.rotates and not s.capabilities.extendable and not s.capabilities.length_dependent


def test_scores_depend_only_on_the_offset():
    s = make_scheme("xpos", d_model=32, n_heads=2, max_len=64, xpos_scale_base=64.0)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)

    def score(n, m):
        qn = s.rotate_qk(q, k, AttentionContext(torch.tensor([n]), torch.tensor([n])))[0]
        km = s.rotate_qk(q, k, AttentionContext(torch.tensor([m]), torch.tensor([m])))[1]
        return float((qn * km).sum())

    assert score(30, 10) == pytest.approx(score(530, 510), rel=1e-9)
    assert abs(score(200, 0)) != pytest.approx(abs(score(200, 200)), rel=1e-3)  # it does decay with distance

import torch, posenc
torch.manual_seed(0)
for dtype in (torch.float32,):
    for layout in ("interleaved", "half"):
        q = torch.randn(2, 8, 300, 128, dtype=dtype, device="cuda")
        k = torch.randn(2, 2, 300, 128, dtype=dtype, device="cuda")
        positions = torch.arange(300, device="cuda")[None, None] + torch.tensor([[[0]], [[5000]]], device="cuda")
        got_q, _ = posenc.apply_rope_qk(q, k, positions, layout=layout, rotary_dim=96)
        ref_q, _ = posenc.apply_rope_qk(q.cpu(), k.cpu(), positions.cpu(), layout=layout, rotary_dim=96)
        ex_q, _ = posenc.apply_rope_qk(q.cpu().double(), k.cpu().double(), positions.cpu(), layout=layout, rotary_dim=96)
        d = (got_q.cpu() - ref_q).abs()
        print(layout, "gpu-cpu max", d.max().item(), "per batch", d.amax(dim=(1, 2, 3)).tolist(),
              "rot dims", d[..., :96].max().item(), "pass dims", d[..., 96:].max().item(),
              "gpu-exact", (got_q.cpu().double() - ex_q).abs().max().item(), "cpu-exact", (ref_q.double() - ex_q).abs().max().item())
        idx = (d == d.max()).nonzero()[0].tolist(); print("  worst at", idx)

"""What a task sees when ``posenc eval`` runs it: the lab's ``Evaluation`` over a transformers model.

Every task (lm, passkey, copy, a plug-in's) runs through its own ``evaluate(ev)`` (called by
``posenc.lab.tasks.checks.evaluate_task``, as in the lab). ``ModelEvaluation`` differs from the lab's in what the
model is, not in what a task does:

- ``ev.model``: the lab's LogitsModel adapter over the loaded model (posenc.hf.eval.adapter.logits_model);
- ``ev.encode``/``ev.decode``: the model's tokenizer (a byte tokenizer: the bytes themselves, as in the lab);
- ``ev.run.corpus.val``: the scored text as the model's tokens (after ``--eval-offset``);
- ``ev.map``: before each item the model runs one token, so transformers' dynamic-NTK rule returns to the original
  frequencies and every length is scored with its own;
- ``ev.measure``: each scored length's cost (wall and CPU seconds, tokens/s, model FLOP/s against this machine's
  matmul peak, peak memory) goes into its row;
- rows carry the model's name, ``std`` None and, for a tokenizer other than bytes, ``unit`` "token"; a length past
  the model's positions is an n/a row naming the limit.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from posenc.hf.loading import input_device
from posenc.hf.throughput import reset_peak_memory
from posenc.lab.context import Evaluation, Meter


def text_codec(tokenizer) -> tuple:
    """-> (encode, decode, byte_level) of a model's tokenizer: text -> the ids the model reads for a prompt, and
    back (special tokens dropped). A byte tokenizer (posenc export's) is the lab's own codec: the bytes."""
    from posenc.hf.tokenizer import is_byte_tokenizer
    from posenc.lab.context import byte_decode, byte_encode

    if is_byte_tokenizer(tokenizer):
        return byte_encode, byte_decode, True

    def encode(text: str) -> list[int]:
        return list(tokenizer(text)["input_ids"])

    def decode(ids) -> str:
        return tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    return encode, decode, False


@torch.no_grad()
def reset_length_state(model) -> None:
    """One token at position 0: transformers' dynamic-NTK rule drops back to the original frequencies."""
    model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=input_device(model)), use_cache=False)


class CostMeter(Meter):
    """Times the scoring of one length (wall and process CPU seconds) from a fresh peak-memory mark."""

    def __init__(self, ev: "ModelEvaluation", length: int, stride: int | None):
        self.ev, self.length, self.stride = ev, length, stride
        reset_peak_memory()
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def cost(self, result) -> dict:
        """n_scored and ``row_cost``'s fields for a scored result ({"n_scored", ...}); none for an n/a length."""
        if result is None:
            return {}
        return {"n_scored": result["n_scored"], **row_cost(self.ev.hf_model, self.length, self.stride, result,
                                                            self.wall, self.ev.matmul_peak(), self.cpu)}


def row_cost(model, length: int, stride: int | None, result: dict | None, seconds: float, peak,
             cpu_seconds: float | None = None) -> dict:
    """What scoring one length cost: wall and process CPU seconds, tokens/s, model FLOP/s (posenc.hf.throughput.
    model_flops over the windows run, per wall second) and its fraction of the measured matmul peak, peak resident
    memory (and CUDA's). On a shared machine wall time includes waiting for a core: CPU seconds say how much work."""
    from posenc.hf.throughput import model_flops, peak_memory

    out = {"wall_s": round(seconds, 2)}
    if cpu_seconds is not None:
        out["cpu_s"] = round(cpu_seconds, 2)
    memory = peak_memory()
    out["peak_rss_bytes"] = memory["rss_bytes"]
    if "cuda_bytes" in memory:
        out["peak_cuda_bytes"] = memory["cuda_bytes"]
    if result is None or seconds <= 0:
        return out
    scored = result["n_scored"]
    windows = scored // length if stride is None else 1 + max(0, scored - length) // stride
    flops = model_flops(model, length, windows)
    out.update(tokens_per_s=round(windows * length / seconds, 1), flops_per_s=round(flops / seconds),
               model_flops=flops)
    if peak:
        out["fraction_of_matmul_peak"] = round(flops / seconds / peak, 4)
    return out


@dataclass(kw_only=True)
class ModelEvaluation(Evaluation):
    """The lab's Evaluation of a loaded transformers model (see the module docstring). ``meta``: the eval's meta,
    where the machine's matmul peak is recorded the first time a length is measured."""

    hf_model: object
    model_name: str
    limit: int | None = None
    unit: str | None = None
    meta: dict | None = None
    peak_settings: tuple = ("cpu", torch.float32)

    @property
    def unsupported_note(self) -> str:
        return f"n/a (positions limited to {self.limit})"

    def row(self, eval_len: int, metric: str, value, **extra) -> dict:
        row = super().row(eval_len, metric, value, **extra)
        row.setdefault("std", None)
        row["model"] = self.model_name
        if self.unit:
            row["unit"] = self.unit
        return row

    def map(self, fn, items, *, cost=None) -> list:
        def fresh(item):
            reset_length_state(self.hf_model)
            return fn(item)

        return super().map(fresh, items, cost=cost)

    @torch.no_grad()
    def generate(self, ids, n_new: int) -> list[int]:
        """Greedy decoding with the KV cache (transformers' generate) of the model's token ids: at most ``n_new``
        new ids, fewer where the model writes its EOS token."""
        x = torch.tensor([list(ids)], dtype=torch.long, device=input_device(self.hf_model))
        config = getattr(self.hf_model, "generation_config", None)
        pad = getattr(config, "pad_token_id", None)
        pad = pad if pad is not None else getattr(config, "eos_token_id", None)
        pad = pad[0] if isinstance(pad, (list, tuple)) else pad
        out = self.hf_model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n_new, do_sample=False,
                                     pad_token_id=0 if pad is None else pad)
        return [int(t) for t in out[0, x.shape[1]:].tolist()]

    @contextlib.contextmanager
    def measure(self, length: int, stride: int | None = None):
        meter = CostMeter(self, length, stride)
        yield meter
        meter.stop()

    def matmul_peak(self) -> float | None:
        """The yardstick of the rows' achieved FLOP/s: this machine's matmul at these threads (measured once)."""
        if self.meta is None:
            return None
        if "matmul_peak_flops" not in self.meta:
            from posenc.hf.throughput import matmul_peak

            device, dtype = self.peak_settings
            self.meta["matmul_peak_flops"] = round(matmul_peak(dtype, device=device))
            self.meta["matmul_peak_dtype"] = str(dtype).replace("torch.", "")
        return self.meta["matmul_peak_flops"]

"""Running a GGUF file in llama.cpp itself (through llama-cpp-python, the ``engines`` set-up): the per-token
log-probabilities llama.cpp gives a sequence of token ids, for comparing an extended GGUF with transformers.

llama.cpp reads the RoPE scaling from the file (what ``posenc extend MODEL.gguf --out NEW.gguf`` writes) exactly
as ``llama-cli -m NEW.gguf -c L`` does. One difference from llama-cpp-python's own ``Llama()`` defaults is chosen
here on purpose: llama-cpp-python passes YaRN's beta_fast 32 and beta_slow 1 to every context, which override the
file's ``rope.scaling.yarn_beta_fast`` / ``yarn_beta_slow``; this module passes llama.cpp's "not set" (-1), so the
file's values govern, as in llama.cpp's own tools.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import numpy as np

from posenc._internal.errors import ConfigError


def available() -> bool:
    """True when llama-cpp-python is installed (``bash scripts/setup.sh engines``)."""
    return importlib.util.find_spec("llama_cpp") is not None


def versions() -> dict:
    """{"llama-cpp-python": its version, "llama.cpp": the system info line of the build it carries}."""
    import llama_cpp

    return {"llama-cpp-python": llama_cpp.__version__,
            "llama.cpp": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}


def token_logprobs(gguf_path: str | os.PathLike, ids: Sequence[int], *, threads: int | None = None,
                   flash_attn: bool = True, batch: int = 512) -> np.ndarray:
    """log p(ids[i + 1] | ids[: i + 1]) under llama.cpp, for i = 0 .. n - 2: a float64 array [n - 1].

    gguf_path: a GGUF file; its context is ``len(ids)`` tokens, its RoPE scaling the file's own.
    ids: [n] token ids of the file's vocabulary (n >= 2), evaluated in one sequence, ``batch`` tokens at a time.
    threads: llama.cpp's threads (default: torch's intra-op thread count, as posenc eval uses).
    ConfigError (one line) when llama-cpp-python is missing, the ids are out of the vocabulary or too few.
    """
    if not available():
        raise ConfigError("llama.cpp: llama-cpp-python is not installed; run `bash scripts/setup.sh engines` "
                          "(it builds llama.cpp from source, about 6 minutes on 2 cores)")
    import llama_cpp

    ids = [int(i) for i in ids]
    if len(ids) < 2:
        raise ConfigError(f"ids: expected at least 2 token ids, got {len(ids)}")
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    llm = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=len(ids), n_batch=batch, n_ubatch=batch,
                          n_threads=threads, n_threads_batch=threads, logits_all=True, flash_attn=flash_attn,
                          yarn_beta_fast=-1.0, yarn_beta_slow=-1.0, yarn_attn_factor=-1.0, verbose=False)
    try:
        vocab = llm.n_vocab()
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ConfigError(f"ids: {len(bad)} token ids outside the file's vocabulary of {vocab} (first {bad[0]})")
        llm.eval(ids)
        return _target_logprobs(np.asarray(llm.scores[: len(ids) - 1]), ids[1:])
    finally:
        llm.close()


def _target_logprobs(logits: np.ndarray, targets: Sequence[int], rows: int = 1024) -> np.ndarray:
    """log_softmax(logits)[i, targets[i]] in float64, ``rows`` rows at a time (logits [n, vocab] float32)."""
    out = np.empty(len(targets))
    t = np.asarray(targets)
    for s in range(0, len(targets), rows):
        block = logits[s:s + rows].astype(np.float64)
        peak = block.max(axis=1, keepdims=True)
        lse = peak[:, 0] + np.log(np.exp(block - peak).sum(axis=1))
        out[s:s + rows] = block[np.arange(len(block)), t[s:s + rows]] - lse
    return out


# llama.cpp's rope types (include/llama.h): how it pairs the dims it rotates
ROPE_TYPES = {-1: "none", 0: "norm: pairs (2j, 2j + 1)", 2: "neox: pairs (j, j + d/2)", 8: "mrope", 24: "vision",
              40: "imrope"}


def read_hparams(gguf_path: str | os.PathLike) -> dict:
    """What llama.cpp itself reads from a GGUF file: the model loaded (memory-mapped, on the CPU, no context) and
    asked for its trained context, its RoPE frequency scale (1 / the linear or YaRN factor) and rope type.

    -> {"context_length": int, "rope_freq_scale": float, "rope_type": str, "llama.cpp": version}.
    ConfigError (one line) when llama-cpp-python is missing or llama.cpp cannot load the file."""
    if not available():
        raise ConfigError("llama.cpp: llama-cpp-python is not installed; run `bash scripts/setup.sh engines`")
    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    with suppress_stdout_stderr(disable=False):       # llama.cpp logs every metadata key to stderr
        model = llama_cpp.llama_model_load_from_file(os.fsencode(os.fspath(gguf_path)), params)
    if not model:
        raise ConfigError(f"{gguf_path}: llama.cpp could not load the file")
    try:
        code = int(llama_cpp.llama_model_rope_type(model))
        return {"context_length": int(llama_cpp.llama_model_n_ctx_train(model)),
                "rope_freq_scale": float(llama_cpp.llama_model_rope_freq_scale_train(model)),
                "rope_type": ROPE_TYPES.get(code, f"code {code}"), "llama.cpp": llama_cpp.__version__}
    finally:
        llama_cpp.llama_model_free(model)

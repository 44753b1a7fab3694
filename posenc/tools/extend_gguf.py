"""``posenc extend MODEL.gguf --method M --target-length L --out NEW.gguf``: a GGUF file llama.cpp runs extended.

The rope numbers are the ones ``posenc extend`` writes into a config.json for the same file and method
(``extend_config``, transformers 5.x form: the extension-method registry and posenc.rope.scaling own them); this
module only says how llama.cpp reads each one, and copies everything else. The new file holds every metadata entry
and every tensor of the input (tensor data copied byte for byte, never re-quantized) with:

- ``<arch>.context_length`` = the target length (what ``-c 0`` gives in llama.cpp);
- linear: ``<arch>.rope.scaling.type`` "linear", ``.factor`` s;
- yarn: type "yarn", ``.factor`` s, ``.original_context_length`` L0, ``.yarn_beta_fast`` / ``.yarn_beta_slow``
  (posenc.rope.scaling.yarn_betas; llama.cpp computes the attention factor 0.1 ln s + 1 itself, as transformers'
  default does, so no attention-factor key is written);
- ntk: ``<arch>.rope.freq_base`` = the raised base (what the config.json's rope_theta holds);
- llama3: a ``rope_freqs.weight`` tensor (rotary_dim / 2 float32 divisors: the original frequency over the
  llama3 one, pair by pair; llama.cpp divides each angle by it) and no scaling type;
- longrope: type "longrope", ``.original_context_length`` L0, ``.attn_factor`` (the LongRoPE attention factor)
  and ``rope_factors_long.weight`` / ``rope_factors_short.weight`` (the config's long / short factor lists).

Which architecture reads what is llama.cpp's (src/llama-model.cpp's common hyper-parameter loader reads the
rope.scaling keys for every architecture; src/models/<arch>.cpp decides whether per-frequency factor tensors reach
``ggml_rope_ext``): only the llama graph passes them (``model.get_rope_factors``), so llama3 and longrope are
refused for qwen2 and gemma3, where the tensors would be ignored. Gemma 3's scaling reaches only its
full-attention layers in llama.cpp (as in transformers), so its numbers are those of those layers' RoPE. Dynamic
NTK (llama.cpp has none), and every attention method but Self-Extend, are refused with the reason; Self-Extend is
llama.cpp's run-time group attention, so its flags are printed and no file is written. The write is atomic
(posenc._internal.atomic.atomic_path): an interrupted write leaves no file under the output name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc._internal.errors import ConfigError

# the llama.cpp architectures posenc writes RoPE scaling for (each checked by tests/tools/test_extend_gguf.py)
ARCHITECTURES = ("llama", "qwen2", "gemma3")
# the architectures whose llama.cpp graph passes per-frequency factor tensors to ggml_rope_ext (src/models/llama.cpp:
# model.get_rope_factors; src/models/qwen2.cpp and gemma3.cpp pass none)
FACTOR_TENSOR_ARCHITECTURES = ("llama",)
FACTOR_TENSOR_METHODS = ("llama3", "longrope")
# why llama.cpp cannot run a frequency method as posenc means it
REFUSED = {
    "dynamic": "llama.cpp has no dynamic NTK (its rope scaling types are none, linear, yarn and longrope): the base "
               "would stay fixed at every length; use --method ntk (a fixed base sized for the target) or yarn",
}
SELF_EXTEND = "self-extend"


@dataclass
class GGUFExtension:
    """What ``plan_gguf_extension`` decides: the metadata to set ({key: (value, GGUFValueType)}, replacing an
    entry of that name or added), the tensors to add ({name: float32 array}), the llama.cpp flags that give the same
    scaling to the ORIGINAL file (None when llama.cpp has no flag for it), the flags for the new file, the extend
    result it comes from (the config.json form) and notes."""

    architecture: str
    metadata: dict[str, tuple[Any, Any]]
    tensors: dict[str, Any]
    original_flags: list[str] | None
    new_flags: list[str]
    result: Any
    notes: list[str] = field(default_factory=list)


def _key(arch: str, template: str) -> str:
    return template.format(arch=arch)


def check_method(method: str, architecture: str) -> None:
    """ConfigError (one line) unless llama.cpp runs ``method`` on ``architecture`` as posenc means it."""
    from posenc.attention.registry import ATTENTION_METHODS

    if method in ATTENTION_METHODS and method != SELF_EXTEND:
        raise ConfigError(f"--method {method}: llama.cpp has no {method} attention (of the attention methods it "
                          "runs only Self-Extend, as group attention at run time), so no GGUF can carry it")
    if method in REFUSED:
        raise ConfigError(f"--method {method}: {REFUSED[method]}")
    if architecture not in ARCHITECTURES:
        raise ConfigError(f"GGUF architecture {architecture!r}: posenc writes llama.cpp RoPE scaling for "
                          f"{', '.join(ARCHITECTURES)} (checked against llama.cpp's loader); write a config.json "
                          "with --out config.json instead")
    if method in FACTOR_TENSOR_METHODS and architecture not in FACTOR_TENSOR_ARCHITECTURES:
        raise ConfigError(f"--method {method}: llama.cpp's {architecture} graph passes no per-frequency factor "
                          f"tensor to its RoPE (only {', '.join(FACTOR_TENSOR_ARCHITECTURES)} does), so the "
                          f"{method} factors would be ignored; use linear, yarn or ntk")


def check_unscaled(model) -> None:
    """ConfigError unless the GGUF file (a posenc.gguf.GGUFModel) runs unscaled in llama.cpp: no rope.scaling type
    other than none / a factor-1 linear, no rope factor tensors (extending a scaled file would stack two scalings)."""
    from gguf import MODEL_TENSOR, TENSOR_NAMES

    kind, factor = model.scaling.get("type"), model.scaling.get("factor")
    scaled = kind not in (None, "none", "linear") or (factor not in (None, 0, 0.0, 1, 1.0))
    names = {TENSOR_NAMES[t] + ".weight" for t in (MODEL_TENSOR.ROPE_FREQS, MODEL_TENSOR.ROPE_FACTORS_LONG,
                                                     MODEL_TENSOR.ROPE_FACTORS_SHORT)}
    present = sorted(names & set(model.tensors))
    if scaled or present:
        shown = ", ".join([f"{k}={v}" for k, v in model.scaling.items()] + present)
        raise ConfigError(f"{model.path}: the file already carries RoPE scaling ({shown}); extend writes llama.cpp "
                          "scaling for an unscaled GGUF only (two scalings would stack)")


def extend_source(model, method: str):
    """What ``posenc.tools.extend.extend_config`` computes the numbers from for the GGUF file ``model`` (a
    posenc.gguf.GGUFModel): its path. ConfigError first for a method or architecture llama.cpp cannot run as posenc
    means it, or a file already scaled."""
    check_method(method, model.architecture)
    check_unscaled(model)
    return model.path


def llama_cpp_form(model, result) -> GGUFExtension:
    """What to write into a copy of the GGUF file ``model`` for ``result`` (the ExtendResult, transformers 5.x
    form, that ``extend_config`` gave for ``extend_source(model, method)``); see the module docstring."""
    from posenc.rope.layers import global_rope_entry

    arch = model.architecture
    # Gemma 3: llama.cpp scales only the full-attention layers (the sliding-window ones keep their own base and
    # scale 1 whatever rope.scaling says: src/llama-model.cpp's rope_freq_base_train_swa / rope_freq_scale_train_swa),
    # as transformers does, so the numbers are extend's global entry (posenc.rope.layers' rule)
    rope = global_rope_entry(result.config) or result.config["rope_parameters"]
    build = _FORMS[rope["rope_type"] if result.method != "ntk" else "ntk"]
    metadata, tensors, flags, notes = build(arch, rope, result)
    # (type None: the file's own type for the entry is kept)
    metadata = {f"{arch}.context_length": (result.config["max_position_embeddings"], None), **metadata}
    new_flags = ["-c", str(result.config["max_position_embeddings"])]
    return GGUFExtension(arch, metadata, tensors, flags, new_flags, result, notes)


def _linear(arch, rope, result):
    from gguf import GGUFValueType as T, Keys

    s = float(rope["factor"])
    meta = {_key(arch, Keys.Rope.SCALING_TYPE): ("linear", T.STRING),
            _key(arch, Keys.Rope.SCALING_FACTOR): (s, T.FLOAT32)}
    return meta, {}, ["--rope-scaling", "linear", "--rope-scale", f"{s:g}"], []


def _yarn(arch, rope, result):
    from gguf import GGUFValueType as T, Keys

    from posenc.rope.layers import global_rope_config
    from posenc.rope.scaling import yarn_betas

    s, original = float(rope["factor"]), int(rope["original_max_position_embeddings"])
    fast, slow = yarn_betas(global_rope_config(result.config))
    meta = {_key(arch, Keys.Rope.SCALING_TYPE): ("yarn", T.STRING),
            _key(arch, Keys.Rope.SCALING_FACTOR): (s, T.FLOAT32),
            _key(arch, Keys.Rope.SCALING_ORIG_CTX_LEN): (original, T.UINT32),
            _key(arch, Keys.Rope.SCALING_YARN_BETA_FAST): (float(fast), T.FLOAT32),
            _key(arch, Keys.Rope.SCALING_YARN_BETA_SLOW): (float(slow), T.FLOAT32)}
    flags = ["--rope-scaling", "yarn", "--rope-scale", f"{s:g}", "--yarn-orig-ctx", str(original),
             "--yarn-beta-fast", f"{fast:g}", "--yarn-beta-slow", f"{slow:g}"]
    notes = [f"YaRN's attention factor 0.1 ln s + 1 = {result.check['attention_scaling']:.6g} is computed by llama.cpp "
             "itself from the factor (as transformers' default); llama.cpp rounds the correction range as "
             "transformers does by default"]
    return meta, {}, flags, notes


def _ntk(arch, rope, result):
    from gguf import GGUFValueType as T, Keys

    import numpy as np

    # GGUF holds the base as float32 (llama.cpp's too): the flag gives the same float32 value as the file
    theta = float(np.float32(rope["rope_theta"]))
    return ({_key(arch, Keys.Rope.FREQ_BASE): (theta, T.FLOAT32)}, {}, ["--rope-freq-base", f"{theta:.9g}"],
            [f"static NTK is a new base: {arch}.rope.freq_base {float(rope['rope_theta']):.9g} (float32 "
             f"{theta:.9g})"])


def _divisors(result, seq_len: int):
    """Per pair, the original inverse frequency over the scaled one (float32 [rotary_dim / 2]) for the written
    config at ``seq_len``: what llama.cpp's factor tensors hold (it divides each angle by them)."""
    import numpy as np

    from posenc.rope.apply import default_inv_freq
    from posenc.rope.layers import global_rope_config
    from posenc.rope.scaling import rope_parameters

    rc = global_rope_config(result.config)
    inv, _ = rope_parameters(rc, seq_len)
    return (default_inv_freq(rc.rotary_dim, rc.theta).double() / inv.double()).numpy().astype(np.float32)


def _llama3(arch, rope, result):
    from gguf import MODEL_TENSOR, TENSOR_NAMES

    name = TENSOR_NAMES[MODEL_TENSOR.ROPE_FREQS] + ".weight"
    notes = [f"llama3 scaling lives in the {name} tensor (llama.cpp has no flag for it): run the new file"]
    return {}, {name: _divisors(result, result.target_length)}, None, notes


def _longrope(arch, rope, result):
    import numpy as np
    from gguf import GGUFValueType as T, Keys, MODEL_TENSOR, TENSOR_NAMES

    original = int(rope["original_max_position_embeddings"])
    attention = float(result.check["attention_scaling"])
    meta = {_key(arch, Keys.Rope.SCALING_TYPE): ("longrope", T.STRING),
            _key(arch, Keys.Rope.SCALING_ORIG_CTX_LEN): (original, T.UINT32),
            _key(arch, Keys.Rope.SCALING_ATTN_FACTOR): (attention, T.FLOAT32)}
    tensors = {TENSOR_NAMES[MODEL_TENSOR.ROPE_FACTORS_LONG] + ".weight": np.asarray(rope["long_factor"], np.float32),
               TENSOR_NAMES[MODEL_TENSOR.ROPE_FACTORS_SHORT] + ".weight": np.asarray(rope["short_factor"],
                                                                                     np.float32)}
    notes = [f"llama.cpp uses the long factors whenever the context per sequence (-c / --parallel, padded to 256) "
             f"exceeds {original}, whatever the input's length; transformers switches on the input's length"]
    return meta, tensors, None, notes


_FORMS = {"linear": _linear, "yarn": _yarn, "ntk": _ntk, "llama3": _llama3, "longrope": _longrope}


# ---- writing ---------------------------------------------------------------------------------------------------

def write_gguf_extension(path: str | os.PathLike, out: str | os.PathLike, plan: GGUFExtension) -> Path:
    """Write a copy of the GGUF file ``path`` to ``out`` with ``plan``'s metadata and tensors; every tensor of the
    input is copied byte for byte. Atomic: the file is built beside ``out`` and moved into place at the end (an
    error, Ctrl-C or SIGTERM deletes it). The caller has checked ``out`` (posenc._internal.outputs.check_output)."""
    from gguf import GGUFReader

    from posenc._internal.atomic import atomic_path

    reader = GGUFReader(path)
    with atomic_path(out, make_parents=False) as tmp:
        _write(reader, tmp, plan)
    return Path(out)


def _write(reader, tmp: Path, plan: GGUFExtension) -> None:
    import numpy as np
    from gguf import GGUFValueType, GGUFWriter, Keys

    writer = GGUFWriter(tmp, plan.architecture, endianess=reader.endianess)
    pending = dict(plan.metadata)
    alignment = reader.fields.get(Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    for f in reader.fields.values():
        if f.name == Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue                    # written by GGUFWriter itself / the reader's own header fields
        vtype = f.types[0]
        sub_type = f.types[-1] if vtype == GGUFValueType.ARRAY else None
        value, new_type = pending.pop(f.name, (f.contents(), None))
        writer.add_key_value(f.name, value, new_type or vtype, sub_type=sub_type)
    for key, (value, vtype) in pending.items():
        writer.add_key_value(key, value, vtype or GGUFValueType.UINT32)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    for name, array in plan.tensors.items():
        writer.add_tensor_info(name, array.shape, np.float32, array.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    for array in plan.tensors.values():
        writer.write_tensor_data(array)
    writer.close()


# ---- command line ----------------------------------------------------------------------------------------------

def self_extend_flags(path: str | os.PathLike, target_length: int) -> tuple[list[str], Any]:
    """llama.cpp's group-attention flags for Self-Extend on the GGUF file ``path`` up to ``target_length`` (the
    rule posenc.attention resolves for its trained length), and the rule. llama.cpp wants the width a multiple of
    the group size, so W is rounded down to one (at least G)."""
    from posenc.attention.registry import attention_rule
    from posenc.extensions import ExtensionSpec
    from posenc.gguf import read_gguf
    from posenc.rope.layers import global_rope_config
    from posenc.rope.contexts import trained_length

    model = read_gguf(path)
    original = trained_length(global_rope_config(model.config))
    if original is None or target_length <= original:
        raise ConfigError(f"--target-length {target_length}: must be longer than the trained context ({original})")
    spec = ExtensionSpec(original=original, factor=target_length / original, rotary_dim=None, target=target_length)
    rule = attention_rule(SELF_EXTEND, spec)
    g = rule.group_size
    w = max(g, rule.window // g * g)
    return ["--grp-attn-n", str(g), "--grp-attn-w", str(w), "-c", str(target_length)], rule


def format_plan(plan: GGUFExtension, src: str, out: str) -> str:
    """What ``posenc extend ... --out NEW.gguf`` prints: the entries written, the llama.cpp flags, the notes."""
    r = plan.result
    lines = [f"extend: {r.method} x{r.factor:g}  {r.original_context:,} -> {r.target_length:,} tokens "
             f"(GGUF for llama.cpp, {plan.architecture})", f"wrote {out} (every tensor of {src} copied unchanged)"]
    lines += [f"  {key} = {_shown(value)}" for key, (value, _) in plan.metadata.items()]
    lines += [f"  tensor {name} [{array.size}] float32" for name, array in plan.tensors.items()]
    lines.append(f"llama.cpp: llama-cli -m {out} {' '.join(plan.new_flags)}")
    if plan.original_flags:
        lines.append(f"  the same scaling on the original file: llama-cli -m {src} "
                     f"{' '.join(plan.original_flags + plan.new_flags)}")
    lines.append("transformers' GGUF loader reads context_length and freq_base but no rope.scaling key or factor "
                 "tensor: for transformers, write the config.json (--out config.json)")
    lines.append("notes:")
    lines += [f"  - {note}" for note in plan.notes + list(r.notes)]
    return "\n".join(lines)


def _shown(value) -> str:
    return f"{value:.9g}" if isinstance(value, float) else str(value)


def print_self_extend(src: str, target_length: int) -> None:
    """What ``posenc extend MODEL.gguf --method self-extend --out NEW.gguf`` prints (it writes no file)."""
    flags, rule = self_extend_flags(src, target_length)
    print(f"extend: no file written: llama.cpp runs Self-Extend at run time as group attention (G {rule.group_size}, "
          f"W {rule.window} from posenc's rule), not from GGUF metadata; its llama-completion and llama-passkey "
          f"tools take: llama-completion -m {src} {' '.join(flags)}")

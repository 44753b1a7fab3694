"""Loading a model for every ``posenc`` command that runs one (eval, search, posenc.patch's callers): a local
transformers folder, a GGUF file (dequantized by transformers) or a folder ``posenc export`` wrote from a lab
model, with the safety checks made before and after.

Checked before anything is loaded: the folder (config.json, weights, tokenizer; ``--config`` a JSON object
transformers reads as a model config; no remote code), the device and the attention implementation. At load,
weights that do not fit the config (missing, unexpected or reshaped keys, e.g. a Llama --config for a GPT-NeoX
folder) are refused with a few of the keys (``posenc.hf.weights``: that model would run with random weights), a
pickled weights file holding objects other than tensors is refused unread, and a damaged safetensors file is one
line. What a loaded model's config says about positions (its trained length, its hard position limit, the method
a config file applies) is read here too, from ``posenc.rope.describe`` below the tools.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
from pathlib import Path

import torch

from posenc._internal.outputs import TOKENIZER_FILES, WEIGHT_FILES
from posenc._internal.validate import is_int
from posenc._internal.devices import check_device
from posenc._internal.errors import ConfigError
from posenc.hf.quiet import quiet_transformers

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def _is_gguf(path) -> bool:
    from posenc.gguf import is_gguf

    return is_gguf(path)


def model_files(folder: str | os.PathLike, tokenizer: bool = False) -> list[Path]:
    """The files of a local model folder its outputs depend on, sorted: config.json, the weights (shards and their
    index) and, with ``tokenizer``, the tokenizer files. What a resumable record fingerprints (an interrupted eval,
    a LongRoPE search checkpoint). A GGUF file is its own config, weights and tokenizer."""
    if _is_gguf(folder):
        return [Path(folder)]
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and (
        p.name == "config.json" or p.suffix in (".safetensors", ".bin") or p.name in WEIGHT_FILES
        or (tokenizer and p.name in TOKENIZER_FILES)))


# model_type -> config attribute holding a hard position limit (a learned table, MPT's ALiBi tensor)
_POSITION_LIMITS = {"gpt2": "n_positions", "mpt": "max_seq_len", "gpt_neo": "max_position_embeddings",
                    "opt": "max_position_embeddings", "gpt_bigcode": "n_positions", "biogpt": "max_position_embeddings"}


def attn_implementations() -> list[str]:
    """The attention implementations this transformers registers (eager, sdpa, flex_attention, flash_attention_N,
    paged|...); a model may still refuse one it does not support, which ``load_causal_lm`` reports."""
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        registered = list(ALL_ATTENTION_FUNCTIONS.valid_keys())
    except (ImportError, AttributeError):  # a transformers without the registry
        registered = ["sdpa", "flash_attention_2", "flex_attention"]
    return ["eager"] + [k for k in registered if k != "eager"]


def check_attn_implementation(value, name: str = "attn_implementation") -> str | None:
    """``value`` if transformers knows that attention implementation (or it names a Hub kernel, "org/repo"), else
    ConfigError listing the known ones. None: the model's default."""
    if value is None:
        return None
    known = attn_implementations()
    if not isinstance(value, str) or not (value in known or "/" in value
                                          or (value.startswith("paged|") and value[len("paged|"):] in known)):
        raise ConfigError(f"{name}: expected one of {', '.join(known)} (or a Hub kernel 'org/repo'), got {value!r}")
    return value


def _one_line(exc: BaseException, limit: int = 240) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_config(model_dir: str | os.PathLike, config_file: str | os.PathLike | None = None):
    """The transformers config of ``model_dir`` (its config.json) or ``config_file``; ConfigError naming the file
    when it is not a JSON object transformers reads as a model config (a JSON list, no model_type, ...)."""
    from transformers import AutoConfig

    folder = Path(model_dir)
    if config_file is None and _is_gguf(folder):
        from posenc.hf.gguf import load_config

        return load_config(folder)
    if config_file is None:
        path, label = folder / "config.json", f"model {model_dir}: config.json"
        if not path.is_file():
            raise FileNotFoundError(f"model {model_dir}: no config.json (expected a local transformers model folder)")
    else:
        path, label = Path(config_file), f"config {config_file} (--config)"
        if not path.is_file():
            raise FileNotFoundError(f"config {config_file}: no such config file")
    from posenc._internal.json_io import loads

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label}: not a JSON file ({_one_line(exc)}); expected a transformers config") from None
    data = loads(text, label)
    if not isinstance(data, dict):
        raise ConfigError(f"{label}: expected a JSON object (a transformers config.json), got a JSON "
                          f"{type(data).__name__.replace('dict', 'object')}")
    from posenc.hf.remote_code import NO_REMOTE_CODE, check_config_code, is_remote_code_refusal, remote_code_error

    check_config_code(data, label)
    try:
        return AutoConfig.from_pretrained(str(path if config_file is not None else folder), local_files_only=True,
                                          **NO_REMOTE_CODE)
    except (ValueError, KeyError, TypeError) as exc:
        if is_remote_code_refusal(exc):
            raise remote_code_error(label) from None
        raise ConfigError(f"{label}: transformers does not read it as a model config: {_one_line(exc)}") from None


def check_model_folder(model_dir: str | os.PathLike, config_file: str | os.PathLike | None = None,
                       tokenizer: bool = True):
    """A local model folder that can be evaluated: its config (or ``config_file``) reads, weights and (when
    ``tokenizer``) tokenizer files are there; ConfigError naming what is missing otherwise. -> the config."""
    folder = Path(model_dir)
    if _is_gguf(folder):
        from posenc.hf.gguf import checked

        checked(folder)              # (a missing file, an architecture or quantization transformers cannot load)
        return read_config(folder, config_file)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"model {model_dir}: no config.json (expected a local transformers model folder)")
    config = read_config(folder, config_file)
    check_model_files(folder, config, tokenizer)
    return config


def check_model_files(model_dir: str | os.PathLike, config, tokenizer: bool = True) -> None:
    """ConfigError unless the weights and (when ``tokenizer``) the tokenizer files of ``model_dir`` are there
    (``config``: its transformers config, already read). A GGUF file holds both."""
    folder = Path(model_dir)
    if _is_gguf(folder):
        return
    if not any((folder / f).is_file() for f in WEIGHT_FILES) and not getattr(config, "transformers_weights", None):
        raise ConfigError(f"model {model_dir}: no weights (expected {', '.join(WEIGHT_FILES[:-1])} or "
                          f"{WEIGHT_FILES[-1]} beside config.json)")
    if tokenizer and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"model {model_dir}: no tokenizer (expected tokenizer.json or tokenizer_config.json with "
                          "its vocabulary files beside config.json; posenc export writes the byte tokenizer)")


def load_causal_lm(model_dir: str, *, method: str | None = None, factor: float | None = None,
                   replace_scaling: bool = False, device: str = "cpu", dtype: str = "float32",
                   device_map: str | None = None, attn_implementation: str | None = None,
                   config_file: str | None = None, unscaled: bool = False, log=print, progress: bool = True):
    """Load a local causal LM (offline), optionally with an extension method written into its config.
    ``config_file``: load with this config instead of the folder's config.json (a searched LongRoPE config).
    ``unscaled``: load with the config's RoPE scaling removed (``posenc.tools.extend.unscaled_config``: plain RoPE
    at the trained base and original context), for an attention method that replaces the scaling.

    -> (model in eval mode, its config as loaded, the ExtendResult or None). ``device_map="auto"`` needs
    accelerate: without it the model is loaded on ``device`` and ``log`` says so. Raises ConfigError when the
    weights do not fit the config (missing, unexpected or reshaped keys: a model with random weights), for an
    unknown device or an attention implementation the model cannot use. progress False: no transformers bars.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    folder = Path(model_dir)
    config = check_model_folder(folder, config_file, tokenizer=False)
    check_device(device)
    check_attn_implementation(attn_implementation)
    extended = None
    if method not in (None, "none"):
        from posenc.hf.scaling import extend_for_factor

        extended = extend_for_factor(config.to_dict(), method, factor, replace=replace_scaling)
        config = type(config).from_dict(extended.config)
    elif unscaled:
        from posenc.hf.scaling import transformers_major
        from posenc.tools.extend import unscaled_config

        config = type(config).from_dict(unscaled_config(config.to_dict(),
                                                        transformers_version=min(transformers_major(), 5)))
    # the loading info is checked below; a shape mismatch is reported there too, not raised by transformers
    from posenc.hf.remote_code import NO_REMOTE_CODE, is_remote_code_refusal, remote_code_error

    kwargs = dict(config=config, dtype=DTYPES[dtype], local_files_only=True, output_loading_info=True,
                  ignore_mismatched_sizes=True)
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if _is_gguf(folder):        # transformers dequantizes it: from_pretrained(its folder, gguf_file=its name)
        from posenc.hf.gguf import split

        kwargs["gguf_file"] = split(folder)[1]
        folder = Path(split(folder)[0])
    if device_map == "auto":
        if importlib.util.find_spec("accelerate") is None:
            log(f"note: --device-map auto needs accelerate (pip install accelerate); loading on {device} instead")
            device_map = None
        else:
            kwargs["device_map"] = "auto"
    try:
        with quiet_transformers(progress):
            model, info = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs, **NO_REMOTE_CODE)
    except pickle.UnpicklingError as exc:
        raise unsafe_weights_error(folder, exc) from None
    except SafetensorError as exc:
        from posenc.hf.weights import damaged_weights_error

        raise damaged_weights_error(folder, exc) from None
    except (ValueError, ImportError) as exc:
        text = _one_line(exc)
        if is_remote_code_refusal(exc):
            raise remote_code_error(f"model {model_dir}") from None
        if attn_implementation and ("attention" in text.lower() or "attn" in text.lower()):
            raise ConfigError(f"attn_implementation {attn_implementation!r} (--attn-implementation): this model "
                              f"cannot use it here: {text}") from None
        if "Unrecognized configuration class" in text:
            raise ConfigError(f"{'config ' + str(config_file) if config_file else 'model ' + str(model_dir)}: "
                              f"transformers has no causal LM for model_type {config.model_type!r}") from None
        raise
    from posenc.hf.weights import refuse_unloaded_weights

    refuse_unloaded_weights(info, Path(model_dir) if _is_gguf(model_dir) else folder, config_file,
                            type(model).__name__)
    model.eval()
    if device_map is None:
        model.to(device)
    return model, config, extended


def unsafe_weights_error(folder: Path, exc: BaseException) -> ConfigError:
    """The one-line refusal of a pickled weights file torch's restricted unpickler refused: it says the file is
    unsafe and what it tried to load, and (unlike torch's message) never suggests loading it unrestricted."""
    blocked = [line.strip() for line in str(exc).splitlines() if "GLOBAL" in line or "Unsupported" in line]
    detail = f" ({blocked[0][:160]})" if blocked else ""
    return ConfigError(f"model {folder}: a pickled weights file holds objects other than tensors{detail}; it is "
                       "unsafe to load, and posenc loads only plain weights: use the model's safetensors files")


def load_tokenizer(model_dir: str):
    """The folder's tokenizer; ConfigError naming the folder when it has none or transformers cannot build it."""
    from transformers import AutoTokenizer

    folder = Path(model_dir)
    if _is_gguf(folder):
        from posenc.hf.gguf import load_tokenizer as gguf_tokenizer

        return gguf_tokenizer(folder)
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"model {model_dir}: no tokenizer (expected tokenizer.json or tokenizer_config.json with "
                          "its vocabulary files beside config.json; posenc export writes the byte tokenizer)")
    from posenc.hf.remote_code import NO_REMOTE_CODE, is_remote_code_refusal, remote_code_error

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, **NO_REMOTE_CODE)
    except (ValueError, OSError, KeyError, TypeError) as exc:
        if is_remote_code_refusal(exc):
            raise remote_code_error(f"model {model_dir}: its tokenizer") from None
        raise ConfigError(f"model {model_dir}: transformers cannot build its tokenizer: {_one_line(exc)}") from None


def position_limit(config) -> int | None:
    """The longest input the architecture can encode at all (a learned table, MPT's ALiBi tensor); None if none."""
    attr = _POSITION_LIMITS.get(getattr(config, "model_type", None))
    value = getattr(config, attr, None) if attr else None
    return int(value) if value else None


def exported_train_len(model_dir) -> int | None:
    """The training length ``posenc export`` recorded in the folder's posenc_export.json (None when the folder is
    not a posenc export, or the record lacks it): an MPT or GPT-2 config holds only the position limit."""
    from posenc._internal.json_io import loads

    path = Path(model_dir) / "posenc_export.json"
    try:
        record = loads(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, ConfigError):
        return None
    if not isinstance(record, dict):
        return None
    value = record.get("train_len")
    lab_model = record.get("lab_model")
    if value is None and isinstance(lab_model, dict):   # an export from before train_len was recorded
        value = lab_model.get("max_len")
    return value if is_int(value) and value > 0 else None


def original_context(config, model_dir=None) -> int | None:
    """The context the model was trained for, as posenc reads the config (None when unknown); for a posenc export
    (``model_dir`` holding posenc_export.json) the training length the export recorded, since an ALiBi (MPT) or
    sinusoidal (GPT-2) export's config holds only its position limit, or the architecture's default."""
    from posenc.rope.contexts import trained_length
    from posenc.rope.describe import inspect_config

    if model_dir is not None:
        recorded = exported_train_len(model_dir)
        if recorded is not None:
            return recorded

    fallback = position_limit(config) or getattr(config, "max_position_embeddings", None)
    try:
        report = inspect_config(config.to_dict())
    except (ValueError, KeyError, TypeError):  # e.g. a GPT-NeoX export of a NoPE model (rotary dim 0)
        return fallback
    if report.get("rope"):
        return trained_length(config) or fallback
    return report.get("claimed_context") or fallback


def config_method(config) -> str:
    """The extension method a loaded config file already applies (its rope_type, when that names a registered
    method, e.g. a searched ``longrope``), else "none": the label of rows measured with ``--config``."""
    from posenc.extensions import method_names

    params = getattr(config, "rope_parameters", None)
    rope_type = params.get("rope_type") if isinstance(params, dict) else None
    return rope_type if rope_type in method_names() else "none"


def input_device(model) -> torch.device:
    return model.get_input_embeddings().weight.device

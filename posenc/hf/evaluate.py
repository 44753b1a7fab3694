"""``posenc eval MODEL_DIR``: the lab's length-extrapolation measurements on any local transformers causal LM.

    posenc eval exported/rope --eval-lens 128,256,512 --methods none,yarn,dynamic --factor 4
    posenc eval ~/models/Qwen2.5-0.5B --eval-lens 2048,8192 --tasks lm,passkey --dtype bfloat16 --device cuda

Protocols are the lab's own code, called through a thin adapter (posenc.hf.lab_bridge.LogitsModel):
- perplexity: ``posenc.lab.evaluate.lm_eval``, non-overlapping windows of each eval length (context restarts at
  every window) and the sliding window (``--sliding-stride``: -1 = half the length, 0 = off); about
  ``--eval-tokens`` tokens scored per length, over the lab corpus's validation split (``--data`` as in the lab; a
  file's last 10% of bytes, a folder's hashed ~10% of files), or the whole text with ``--data-split all``. A text
  too short for every length to score the tokens asked (after ``--eval-offset``) is refused, naming the numbers.
- passkey: ``posenc.lab.evaluate.passkey_eval`` over the lab's episodes (``posenc.lab.data.passkey_example``):
  greedy decoding of a 5-digit key hidden at each ``--passkey-depths`` fraction.
Tokens: with the byte tokenizer of an exported lab model the stream is the corpus bytes themselves and the numbers
equal the lab's (same windows, same episodes, same keys). Any other tokenizer encodes the UTF-8 text (invalid
bytes become U+FFFD) and eval lengths count its tokens; a passkey episode then has as many characters as fit the
length in tokens, and the answer is the first 5 characters of the decoded continuation, leading spaces dropped.

Extension methods (``--methods linear,yarn,...`` with ``--factor F``) go through transformers' own code: the
scaling is written into the loaded config by ``posenc.tools.extend.extend_config`` (the lab's meaning of the method
at F, see posenc.hf.scaling) and the model is reloaded with that config. Before each length the model runs one
token, which makes transformers' dynamic-NTK rule return to the original frequencies, so every length is scored
with its own frequencies (as the lab does) whatever ran before.

Loading: ``--device``/``--dtype``; ``--device-map auto`` spreads a large model over the visible GPUs and the CPU
through accelerate (when installed; otherwise a note and a plain load); attention is the model's default
implementation (SDPA) unless ``--attn-implementation`` says otherwise.
Outputs: the lab's tables (each task's report section: rows = model and method, e.g. "rope + YaRN, zero-shot",
columns = length) are printed; with ``--out DIR`` also results.json ({meta, results, curves}: the lab's row schema
{task, scheme, scaling, finetuned, train_len, eval_len, metric, value, std, seed, protocol, depth} and per-position
losses), report.md and the lab's plots (posenc.lab.report through posenc.hf.lab_bridge), written atomically; a
folder already holding results.json or report.md (a lab run, an earlier eval) is replaced only with ``--overwrite``.
Each finished method's rows are saved at once; ``--resume`` continues an interrupted eval in --out with the same
arguments (the settings, model files and data are checked), keeping the methods it finished.

Checked before anything long runs: the flags (lists without empty entries, --factor only with an extension method,
--device present on this machine, an --attn-implementation transformers knows, --threads), the model folder
(config.json, weights, tokenizer; --config a JSON object transformers reads) and --out's writability. At load,
weights that do not fit the config (missing, unexpected or reshaped keys, e.g. a Llama --config for a GPT-NeoX
folder) are refused with a few of the keys: that model would run with random weights.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import math
import os
import pickle
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import torch

from posenc._outputs import TOKENIZER_FILES, WEIGHT_FILES, check_output
from posenc._validate import is_int
from posenc.devices import check_device
from posenc.hf.quiet import quiet_transformers
from posenc.hf.throughput import reset_peak_memory
from posenc.machine import cpu_model
from posenc.errors import ConfigError, DataError

HELP = "Evaluate a local transformers causal LM: perplexity vs length, passkey, extension methods via its config."

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
# the built-in tasks whose measurement here is tokenizer-aware (lengths in the model's tokens, passkey episodes
# sized to fit them): posenc eval runs them with its own protocols below; every other registered task (a plug-in's
# replacement of one of these included) runs through the task interface on the lab's LogitsModel adapter
# (``run_task``)
TOKENIZER_AWARE = ("lm", "passkey")
# logits of one forward are [rows, T, vocab] float32: cap them near 256 MiB unless --batch-tokens says otherwise
_LOGIT_BUDGET = 1 << 26
# what --out receives; a folder already holding one of them (a lab run, an earlier eval) needs --overwrite
OUTPUT_FILES = ("results.json", "report.md", "ppl_vs_length.png", "per_position_loss.png", "passkey_accuracy.png")

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


@dataclass
class EvalSettings:
    """What ``evaluate_model`` measures. Lengths count the model's tokens."""

    eval_lens: list[int] = field(default_factory=lambda: [128, 256, 512, 1024])
    tasks: list[str] = field(default_factory=lambda: ["lm"])
    methods: list[str] = field(default_factory=lambda: ["none"])   # "none" = the config as it is
    factor: float | None = None             # extension factor for methods other than none
    # attention methods' options, "method.option" -> value (e.g. {"self-extend.window": 1024})
    method_options: dict = field(default_factory=dict)
    replace_scaling: bool = False           # allow replacing a scaling the config already has
    config: str | None = None               # a config file to load the model with (e.g. posenc search's output)
    data: str | None = None                 # corpus (lab semantics): None = the CPython stdlib
    data_split: str = "validation"          # what of it is scored: the lab's validation split, or "all"
    eval_tokens: int = 49152
    eval_offset: int = 0                    # tokens of the text skipped before the first window
    sliding_stride: int = -1                # -1: half the sliding length; 0: off; S: stride
    sliding_lens: list[int] = field(default_factory=list)   # empty: the longest eval length
    sliding_tokens: int | None = None       # tokens scored per sliding length; None: eval_tokens (the lab's rule)
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    device_map: str | None = None           # "auto": accelerate's placement over GPUs and CPU
    attn_implementation: str | None = None  # None: the model's default (SDPA where supported)
    batch_tokens: int | None = None         # tokens per forward; None: as many windows as keep logits ~256 MiB
    # the settings registered tasks declare (passkey_depths, passkey_trials, a plug-in's own): name -> value
    options: dict = field(default_factory=dict)

    def __init__(self, **settings):
        """Fields by name; a setting a registered task declares (``passkey_trials=2``) goes into ``options``."""
        names = {f.name for f in fields(EvalSettings)}
        options = dict(settings.pop("options", None) or {})
        options.update({k: settings.pop(k) for k in list(settings) if k not in names})
        for f in fields(EvalSettings):
            if f.name != "options":
                default = f.default_factory() if f.default_factory is not MISSING else f.default
                setattr(self, f.name, settings.get(f.name, default))
        self.options = options

    def to_dict(self) -> dict:
        """As results.json records them: the declared task settings flat beside the fields."""
        out = asdict(self)
        return {**out, **out.pop("options")}

    def validate(self) -> "EvalSettings":
        from posenc._validate import check_choice, check_distinct, check_float, check_int
        from posenc.hf.lab_bridge import DATA_SPLITS

        from posenc._settings import check_settings
        from posenc.lab.tasks.registry import TASK_SETTINGS, TASKS

        for name in ("eval_lens", "tasks", "methods"):
            if not getattr(self, name):
                raise ConfigError(f"{name}: expected at least one entry, got none")
        for name in ("eval_lens", "sliding_lens", "tasks", "methods"):
            check_distinct(getattr(self, name), name, error=ConfigError)
        from posenc.lab.presets import SIZE_LIMITS
        from posenc.tools.contexts import MAX_CONTEXT

        # every length and count has a bound (a context no config states; the lab's token and trial bounds)
        self.eval_lens = [check_int(n, "eval_lens", min=2, max=MAX_CONTEXT, error=ConfigError) for n in self.eval_lens]
        self.sliding_lens = [check_int(n, "sliding_lens", min=2, max=MAX_CONTEXT, error=ConfigError)
                             for n in self.sliding_lens]
        for t in self.tasks:
            check_choice(t, "tasks", TASKS, error=ConfigError)
        self.options = check_settings(TASK_SETTINGS, self.options)
        if "passkey" in own_protocols(self.tasks) and not self.options["passkey_depths"]:
            raise ConfigError("passkey_depths: expected at least one entry, got none")
        attention = attention_methods(self.methods)
        for m in self.methods:
            if m not in attention:
                check_method(m)
        self.options_for(None)
        if any(m != "none" and m not in attention for m in self.methods):
            if self.factor is None:
                raise ConfigError("factor: extension methods need --factor F (target / original context), e.g. 4")
            check_float(self.factor, "factor", min=1.0, max=float(MAX_CONTEXT), error=ConfigError)
        elif self.factor is not None and attention:
            # the target the rules' defaults plan for
            check_float(self.factor, "factor", min=1.0, max=float(MAX_CONTEXT), error=ConfigError)
        elif self.factor is not None:
            raise ConfigError(f"factor: {self.factor!r} given, but only extension methods use it and methods is "
                              f"{','.join(self.methods)}: pass --methods with a method (e.g. --methods none,yarn) "
                              "or drop --factor")
        check_int(self.eval_tokens, "eval_tokens", min=1, max=SIZE_LIMITS["eval_tokens"], error=ConfigError)
        check_int(self.eval_offset, "eval_offset", min=0, max=SIZE_LIMITS["eval_tokens"], error=ConfigError)
        if self.sliding_tokens is None:   # both protocols score one text, as the lab's get_preset keeps them
            self.sliding_tokens = self.eval_tokens
        check_int(self.sliding_tokens, "sliding_tokens", min=1, max=SIZE_LIMITS["sliding_tokens"], error=ConfigError)
        check_int(self.sliding_stride, "sliding_stride", min=-1, error=ConfigError)
        if self.sliding_stride > min(self.sliding_lens or [max(self.eval_lens)]):
            raise ConfigError(f"sliding_stride: expected -1 (auto), 0 (off) or at most the sliding length, got "
                              f"{self.sliding_stride}")
        check_choice(self.dtype, "dtype", DTYPES, error=ConfigError)
        check_choice(self.data_split, "data_split", DATA_SPLITS, error=ConfigError)
        if self.device_map is not None:
            check_choice(self.device_map, "device_map", ("auto",), error=ConfigError)
        if self.batch_tokens is not None:
            check_int(self.batch_tokens, "batch_tokens", min=1, max=MAX_CONTEXT, error=ConfigError)
        check_device(self.device)
        check_attn_implementation(self.attn_implementation)
        return self

    def options_for(self, method: str | None) -> dict:
        """``method``'s options from method_options ({option: value}); None: check every key ("method.option" for
        an attention method of ``methods`` and one of its options) and return {}."""
        from posenc.extensions.catalogue import method_options

        return method_options(self.method_options, attention_methods(self.methods), method, "method_options")


def method_choices() -> tuple[str, ...]:
    """Every name --methods takes: none, the frequency methods a config edit expresses, the attention methods."""
    from posenc.attention import attention_method_names
    from posenc.hf.lab_bridge import config_methods

    return ("none", *config_methods(), *attention_method_names())


def check_method(name) -> str:
    """``name`` if --methods takes it as a config edit (none or a frequency method); ConfigError listing every name
    --methods takes for an unknown one, or saying what to use instead for a registered method eval cannot run."""
    from posenc._validate import check_choice
    from posenc.extensions import METHODS
    from posenc.hf.lab_bridge import check_config_method

    if name not in METHODS:
        check_choice(name, "methods", method_choices(), error=ConfigError)
    return check_config_method(name, "methods", also=("none",))


def own_protocols(tasks) -> set[str]:
    """The entries of ``tasks`` posenc eval measures with its own tokenizer-aware protocol (``TOKENIZER_AWARE``):
    lm and passkey as posenc registers them. A plug-in's replacement (``register_task("lm", replace=True)``) runs
    through its own evaluate() like any other task, so its rows and its report section go together."""
    from posenc.lab.tasks import get_task
    from posenc.lab.tasks.lm import LanguageModelling
    from posenc.lab.tasks.passkey import Passkey

    builtin = {"lm": LanguageModelling, "passkey": Passkey}
    return {t for t in tasks if t in TOKENIZER_AWARE and type(get_task(t)) is builtin[t]}


def attention_methods(methods) -> tuple[str, ...]:
    """The entries of ``methods`` that change attention (posenc.attention's registry): applied to the loaded model by
    posenc.patch, not written into its config."""
    from posenc.attention import is_attention_method

    return tuple(m for m in methods if is_attention_method(m))


# ---- checks made before anything is loaded ----------------------------------------------------------------------

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
    from posenc._json import loads

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


def check_out_folder(out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """``out_dir`` as a folder ``write_outputs`` may write into, checked before any evaluation: not a file, not
    holding any of ``OUTPUT_FILES`` (results.json, report.md, the plots) unless ``overwrite`` (a lab run's, an
    earlier eval's), and writable."""
    from posenc._atomic import check_writable_folder

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out {out_dir}: exists and is not a folder")
    held = [name for name in OUTPUT_FILES if (out / name).exists()]
    if held and not overwrite:
        listed = held[0] if len(held) == 1 else f"{', '.join(held[:-1])} and {held[-1]}"
        what = "a lab run or an earlier eval"
        try:
            if json.loads((out / "results.json").read_text(encoding="utf-8"))["meta"].get("incomplete"):
                what = ("an interrupted eval: --resume continues it with the same settings, --overwrite runs "
                        "every method again")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        raise ConfigError(f"out {out_dir}: already holds {listed} ({what}); pass overwrite (--overwrite) to replace "
                          "them, or choose another folder")
    check_writable_folder(out, f"out {out_dir} (--out)")
    return out


# ---- loading ---------------------------------------------------------------------------------------------------

def load_causal_lm(model_dir: str, *, method: str | None = None, factor: float | None = None,
                   replace_scaling: bool = False, device: str = "cpu", dtype: str = "float32",
                   device_map: str | None = None, attn_implementation: str | None = None,
                   config_file: str | None = None, log=print, progress: bool = True):
    """Load a local causal LM (offline), optionally with an extension method written into its config.
    ``config_file``: load with this config instead of the folder's config.json (a searched LongRoPE config).

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
    from posenc._json import loads

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
    from posenc.tools.inspect import inspect_config

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


# ---- tokens ----------------------------------------------------------------------------------------------------

def token_stream(tokenizer, data: torch.Tensor, needed: int) -> tuple[torch.Tensor, bool]:
    """The validation text as the model's tokens (at least ``needed`` when the text has them) -> (tokens, bytes?).

    A byte tokenizer gets the bytes themselves (exactly the lab's stream); any other encodes the UTF-8 text,
    growing the encoded prefix until ``needed`` tokens are there.
    """
    from posenc.hf.tokenizer import is_byte_tokenizer

    if is_byte_tokenizer(tokenizer):
        return data, True
    raw = bytes(data.numpy().tobytes())
    chars = max(4 * needed, 4096)
    while True:
        text = raw[:chars].decode("utf-8", errors="replace")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= needed or chars >= len(raw):
            return torch.tensor(ids, dtype=torch.long), False
        chars *= 2


class _Bar:
    """A tqdm bar counting forward passes (one per batch of windows)."""

    def __init__(self, desc: str, total: int | None, enabled: bool):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=desc, leave=False, disable=not enabled, dynamic_ncols=True,
                        mininterval=0.5, unit="batch")

    def tick(self):
        self.bar.update(1)

    def close(self):
        self.bar.close()


def logits_model(model, *, max_len: int | None, bar: _Bar | None = None, tokenizer=None, byte_level: bool = True,
                 batch_tokens: int = 1 << 16):
    """A ``LogitsModel`` over a transformers causal LM: forward = logits of input_ids (no cache), generate = greedy.

    For the byte tokenizer, generate continues the byte prompts directly; otherwise prompts are decoded to text,
    encoded with ``tokenizer`` and the continuation decoded back to characters (ASCII codes, '?' for others).
    """
    from posenc.hf.lab_bridge import LogitsModel

    device = input_device(model)
    pad = getattr(tokenizer, "pad_token_id", None) or getattr(tokenizer, "eos_token_id", None) or 0

    def forward(tokens):
        out = model(input_ids=tokens.to(device), use_cache=False).logits
        if bar is not None:
            bar.tick()
        return out

    scored = chunked_losses(model)

    def token_losses(tokens, targets):
        out = scored(tokens, targets)
        if bar is not None:
            bar.tick()
        return out

    def generate(prompts, n_new):
        rows = max(1, batch_tokens // max(1, prompts.shape[1]))
        outs = []
        for chunk in prompts.split(rows):
            if byte_level:
                got = model.generate(chunk.to(device), max_new_tokens=n_new, min_new_tokens=n_new,
                                     do_sample=False, pad_token_id=pad)[:, chunk.shape[1]:]
                outs.append(got.cpu())
                continue
            for row in chunk.tolist():
                ids = tokenizer(bytes(row).decode("ascii", errors="replace"), return_tensors="pt")["input_ids"]
                got = model.generate(ids.to(device), max_new_tokens=n_new + 3, do_sample=False, pad_token_id=pad)
                text = tokenizer.decode(got[0, ids.shape[1]:], skip_special_tokens=True).lstrip()[:n_new]
                text = text.ljust(n_new, "?")
                outs.append(torch.tensor([[ord(c) if ord(c) < 128 else ord("?") for c in text]]))
                if bar is not None:
                    bar.tick()
        return torch.cat(outs)

    return LogitsModel(forward, generate, max_len=max_len, parameters=model.parameters,
                       token_losses=scored and token_losses)


# positions whose logits are computed at once by chunked_losses: [rows, 1024, vocab] float32 (200 MB at 49k words)
LOSS_CHUNK = 1024


def chunked_losses(model, chunk: int = LOSS_CHUNK):
    """-> ``losses(ids [B, T], targets [B, T]) -> float32 [B, T]``: next-token cross-entropy computed from the
    decoder's hidden states [B, T, hidden] with the output head applied ``chunk`` positions at a time, so the
    [B, T, vocab] float32 logits (6.4 GB at 32k tokens and 49k words) never exist at once. None for a model whose
    logits are not plainly head(hidden) (a final soft-cap, a logit scale...): checked once against the model's own
    forward on a few tokens, and such a model is scored from its full logits instead."""
    import torch.nn.functional as F

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings()
    if decoder is None or head is None:
        return None
    device = input_device(model)

    def losses(ids, targets):
        ids, targets = ids.to(device), targets.to(device)
        hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
        out = torch.empty(targets.shape, dtype=torch.float32)
        for s in range(0, ids.shape[1], chunk):
            logits = head(hidden[:, s:s + chunk]).float()
            out[:, s:s + chunk] = F.cross_entropy(logits.transpose(1, 2), targets[:, s:s + chunk],
                                                  reduction="none").cpu()
        return out

    probe = torch.arange(1, 9, device=device)[None] % model.get_input_embeddings().weight.shape[0]
    try:
        with torch.no_grad():
            mine = head(decoder(input_ids=probe, use_cache=False).last_hidden_state).float()
            theirs = model(input_ids=probe, use_cache=False).logits.float()
    except (TypeError, AttributeError, ValueError):
        return None
    # (rounding apart, equal: another matmul kernel may sum in another order; a soft-cap or scale is far off)
    scale = float(theirs.abs().max()) or 1.0
    return losses if torch.allclose(mine, theirs, rtol=1e-3, atol=1e-4 * scale) else None


def passkey_chars(tokenizer, n_tokens: int, byte_level: bool) -> int | None:
    """Characters of a passkey episode that fill ``n_tokens`` of the model's tokens (None if none fits)."""
    from posenc.hf.lab_bridge import passkey_key_digits, passkey_prompt

    if byte_level:
        try:
            passkey_prompt(n_tokens, 0.5, "0" * passkey_key_digits())
        except ValueError:
            return None
        return n_tokens

    def count(chars):
        prompt, answer = passkey_prompt(chars, 0.5, "0" * passkey_key_digits())
        return len(tokenizer(prompt + answer)["input_ids"])

    try:
        chars = n_tokens
        for _ in range(4):  # proportional steps, then walk down to the largest that fits
            chars = max(1, int(chars * n_tokens / count(chars)))
        while count(chars) > n_tokens:
            chars -= max(1, (count(chars) - n_tokens) * 2)
        return chars
    except ValueError:  # passkey_prompt: too short for the key sentence and question
        return None


# ---- the evaluation ------------------------------------------------------------------------------------------------

def _row(task, scheme, scaling, train_len, eval_len, metric, value, seed, **extra) -> dict:
    row = {"task": task, "scheme": scheme, "scaling": scaling, "finetuned": False, "train_len": train_len,
           "eval_len": eval_len, "metric": metric, "value": value, "std": None, "seed": seed, "protocol": None,
           "depth": None}
    row.update(extra)
    if value is not None and not math.isfinite(value):
        row["value"], row["note"] = None, "diverged (non-finite)"
    return row


@torch.no_grad()
def _reset_length_state(model) -> None:
    """One token at position 0: transformers' dynamic-NTK rule drops back to the original frequencies."""
    model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=input_device(model)), use_cache=False)


def _cost(model, length: int, stride: int | None, result: dict | None, seconds: float, peak,
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


def _windows(n_tokens: int, length: int, stride: int | None) -> int:
    """About how many windows lm_eval scores (for the progress bar only)."""
    return max(1, n_tokens // length) if stride is None else 1 + max(0, n_tokens - length) // stride


def lm_jobs(s: EvalSettings) -> list[tuple[int, int | None, str]]:
    """(length, stride or None, protocol) of each perplexity measurement: non-overlapping windows at every eval
    length, then the sliding window at each sliding length (none with sliding_stride 0)."""
    jobs = [(L, None, "non-overlapping") for L in s.eval_lens]
    if s.sliding_stride:
        for L in s.sliding_lens or [max(s.eval_lens)]:
            stride = s.sliding_stride if s.sliding_stride > 0 else max(1, L // 2)
            jobs.append((L, stride, f"sliding (stride {stride})"))
    return jobs


def tokens_needed(length: int, stride: int | None, n_tokens: int) -> int:
    """Tokens of text the lab's lm_eval reads to score all it is asked at ``length``: its whole windows of the
    ``n_tokens`` budget (non-overlapping) or the budget itself (sliding), and the last window's next token."""
    from posenc.lab.tasks.lm import scored_tokens

    return (scored_tokens(n_tokens, length) if stride is None else max(n_tokens, length)) + 1


def scored_stream(s: EvalSettings, tokenizer, limit: int | None) -> tuple[torch.Tensor, bool, dict, str]:
    """The tokens perplexity is scored on (after --eval-offset) -> (tokens, byte tokens?, the data's provenance,
    which part of it is scored in words). DataError naming the numbers when the text is too short for some length
    (``limit``: lengths past the model's positions are not scored) to score the tokens asked: lengths scored on
    fewer tokens than asked, and on different tokens from each other, would be compared as equals."""
    from posenc.hf.lab_bridge import scored_text

    data, data_meta, scored = scored_text(s.data, s.data_split)
    need = [(tokens_needed(L, stride, s.eval_tokens if stride is None else s.sliding_tokens), L, stride)
            for L, stride, _ in lm_jobs(s) if limit is None or L <= limit]
    stream, byte_level = token_stream(tokenizer, data, s.eval_offset + max((job[0] for job in need), default=2))
    left = len(stream) - s.eval_offset
    short = [job for job in need if job[0] > left]
    if short:
        n, L, stride = max(short, key=lambda job: (job[0], job[2] is None))   # (a tie: the eval_tokens job)
        budget = ("eval_tokens" if stride is None else "sliding_tokens", s.eval_tokens if stride is None
                  else s.sliding_tokens)
        text = f"the text ({data_meta.get('source')}, scored on {scored}) has {len(stream)} tokens"
        lead = (f"eval_offset: {text}; skipping {s.eval_offset} leaves {max(0, left)}" if s.eval_offset
                else f"data: {text}")
        raise DataError(f"{lead}, fewer than the {n} that {budget[0]} {budget[1]} reads at length {L}"
                        f"{'' if stride is None else ' (sliding)'}; every length must score the tokens asked: lower "
                        f"{'eval_offset or ' if s.eval_offset else ''}{budget[0]}"
                        f"{' or score all of the text (data_split all)' if s.data_split == 'validation' else ''}, "
                        "or give a longer text")
    return stream[s.eval_offset:], byte_level, data_meta, scored


@torch.no_grad()
def evaluate_model(model_dir: str, settings: EvalSettings | None = None, *, progress: bool = True,
                   log=print, on_method_done: Callable[[dict], None] | None = None,
                   resume: dict | None = None, out: str | os.PathLike | None = None) -> dict:
    """Measure ``model_dir`` as ``settings`` says; -> {"meta", "results", "curves"} (the lab's row schema).

    ``on_method_done(doc)``: called after each method with the document so far (meta.incomplete names the methods
    still to run), so a caller can save finished work before a long run ends (``posenc eval --out`` does).
    ``resume``: such a document of an interrupted run; its finished methods are kept, not run again, when it was
    made with the same settings, model files and data (ConfigError naming what differs otherwise).
    ``out``: the folder a registered task run through its evaluate() may write into (``run.out``; None: a
    temporary folder, removed after).

    Rows of method "none" carry scaling "none", except with ``settings.config``: then the method that config applies
    (``config_method``: "longrope" for a searched config), so the lab's tables label them "rope + LongRoPE"."""
    from posenc.hf.lab_bridge import passkey_rate, perplexity
    from posenc.tools.inspect import detect_scheme

    s = (settings or EvalSettings()).validate()
    config = check_model_folder(model_dir, s.config)
    # every method's config edit before the first evaluation: a method this model cannot take (no RoPE, a scaling
    # already there without --replace, per-layer RoPE) is refused now, not after the earlier methods have run
    from posenc.hf.scaling import extend_for_factor

    attention = attention_methods(s.methods)
    for method in s.methods:
        if method in attention:
            from posenc.hf.attention_patch import check_config

            check_config(config)
        elif method != "none":
            extend_for_factor(config.to_dict(), method, s.factor, replace=s.replace_scaling)
    t_start = time.perf_counter()
    tokenizer = load_tokenizer(model_dir)
    longest = max(s.eval_lens + s.sliding_lens)
    stream, scored, own = None, None, own_protocols(s.tasks)
    if "lm" in own:
        stream, byte_level, data_meta, scored = scored_stream(s, tokenizer, position_limit(config))
    else:
        from posenc.hf.tokenizer import is_byte_tokenizer

        data_meta, byte_level = None, is_byte_tokenizer(tokenizer)
    name = Path(model_dir).name
    rows: list[dict] = []
    unit = {} if byte_level else {"unit": "token"}       # the lab's tables title perplexity by it
    meta: dict = {"model": str(model_dir), "config": s.config, "byte_tokens": byte_level, "settings": s.to_dict(),
                  "model_files": model_identity(model_dir, s.config), "methods": {},
                  "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  "python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
                  "threads": torch.get_num_threads(), "data": data_meta, "scored_text": scored, "timings_s": {},
                  "cpu": cpu_model()}
    curves: dict[str, list[float]] = {}  # the lab's per-position losses at the longest non-overlapping length
    if "lm" in own:       # the yardstick of the rows' achieved FLOP/s: this machine's matmul at these threads
        from posenc.hf.throughput import matmul_peak

        peak_dtype = DTYPES["bfloat16" if s.dtype in ("float32", "fp32") else s.dtype]
        meta["matmul_peak_flops"] = round(matmul_peak(peak_dtype, device=s.device if s.device_map is None
                                                      else "cpu"))
        meta["matmul_peak_dtype"] = str(peak_dtype).replace("torch.", "")
    earlier_wall = 0.0
    if resume is not None:
        check_resumable(resume, meta)
        old = resume["meta"]
        rows, curves = list(resume["results"]), dict(resume["curves"])
        meta.update(methods=dict(old["methods"]), timings_s=dict(old["timings_s"]), started=old["started"],
                    resumed=[*old.get("resumed", []), {
                        "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                        "kept": list(old["timings_s"])}])
        earlier_wall = float(old.get("wall_s") or 0.0)
        log(f"resuming: kept {', '.join(old['timings_s'])}; running "
            f"{', '.join(m for m in s.methods if m not in old['timings_s'])}")
    for method in s.methods:
        if method in meta["timings_s"]:
            continue                     # finished before the interruption (resume)
        t0 = time.perf_counter()
        model, config, extended = load_causal_lm(model_dir, method=None if method in attention else method,
                                                 factor=s.factor,
                                                 replace_scaling=s.replace_scaling, device=s.device, dtype=s.dtype,
                                                 device_map=s.device_map, attn_implementation=s.attn_implementation,
                                                 config_file=s.config, log=log, progress=progress)
        rule = None
        if method in attention:  # kind "attention": the loaded model's attention runs the method's rule
            from posenc.hf.patch import patch

            base = original_context(config)
            patch(model, method=method, target=None if s.factor is None or base is None else round(s.factor * base),
                  **s.options_for(method))
            rule = next(m.rule for m in model.modules() if hasattr(m, "rule") and hasattr(m, "original"))
        scheme = detect_scheme(config.to_dict())[0]
        scaling = method if method != "none" or s.config is None else config_method(config)
        train_len = extended.original_context if extended else original_context(config, model_dir)
        limit = position_limit(config)
        vocab = model.get_output_embeddings().weight.shape[0]
        budget = s.batch_tokens or max(longest, _LOGIT_BUDGET // vocab)
        meta["methods"][method] = {"scheme": scheme, "original_context": train_len, "position_limit": limit,
                                   "rope_parameters": getattr(config, "rope_parameters", None),
                                   "changes": extended.changes if extended else [],
                                   "attention_rule": rule and {"name": rule.name, **rule.params(), "keeps": rule.keeps},
                                   "attn_implementation": getattr(model.config, "_attn_implementation", None),
                                   "device_map": getattr(model, "hf_device_map", None)}
        common = dict(model=name)
        if "lm" in own:
            for L, stride, protocol in lm_jobs(s):
                if limit is not None and L > limit:
                    rows.append(_row("lm", scheme, scaling, train_len, L, "ppl", None, s.seed, protocol=protocol,
                                     note=f"n/a (positions limited to {limit})", **common, **unit))
                    continue
                per_batch = max(1, budget // L)
                n_tokens = s.eval_tokens if stride is None else s.sliding_tokens
                bar = _Bar(f"{method} ppl L={L}{'' if stride is None else ' sliding'}",
                           math.ceil(_windows(n_tokens, L, stride) / per_batch), progress)
                _reset_length_state(model)
                reset_peak_memory()
                t_len, cpu_len = time.perf_counter(), time.process_time()
                r = perplexity(logits_model(model, max_len=limit, bar=bar), stream, L, n_tokens=n_tokens,
                               stride=stride, device=input_device(model), batch_tokens=budget)
                bar.close()
                cost = _cost(model, L, stride, r, time.perf_counter() - t_len, meta.get("matmul_peak_flops"),
                             time.process_time() - cpu_len)
                rows.append(_row("lm", scheme, scaling, train_len, L, "ppl", r and r["ppl"], s.seed,
                                 protocol=protocol, n_scored=r and r["n_scored"], **cost, **common, **unit))
                if r is not None and stride is None and L == max(s.eval_lens):
                    curves[f"{scheme}|{scaling}|zs|{s.seed}"] = [round(x, 4) for x in r["per_position"]]
        if "passkey" in own:
            for L in s.eval_lens:
                chars = passkey_chars(tokenizer, L, byte_level)
                depths, trials = s.options["passkey_depths"], s.options["passkey_trials"]
                bar = _Bar(f"{method} passkey L={L}", len(depths) * (1 if byte_level else trials), progress)
                for depth in depths:
                    if chars is None or (limit is not None and L > limit):
                        why = "too short for the passkey episode" if chars is None else f"positions limited to {limit}"
                        rows.append(_row("passkey", scheme, scaling, train_len, L, "exact_match", None, s.seed,
                                         depth=depth, note=f"n/a ({why})", **common))
                        continue
                    _reset_length_state(model)
                    adapter = logits_model(model, max_len=None, bar=bar, tokenizer=tokenizer, byte_level=byte_level,
                                           batch_tokens=budget)
                    v = passkey_rate(adapter, chars, depth, n_trials=trials, seed=s.seed,
                                     device=input_device(model))
                    if byte_level:
                        bar.tick()
                    rows.append(_row("passkey", scheme, scaling, train_len, L, "exact_match", v, s.seed, depth=depth,
                                     chars=chars, **common))
                bar.close()
        for task in s.tasks:
            if task not in own:
                rows += run_task(task, model, s, scheme=scheme, scaling=scaling, train_len=train_len, limit=limit,
                                 tokenizer=tokenizer, byte_level=byte_level, batch_tokens=budget, progress=progress,
                                 model_name=name, out=out)
        meta["timings_s"][method] = round(time.perf_counter() - t0, 1)
        del model
        left = s.methods[s.methods.index(method) + 1:]
        if on_method_done is not None and left:
            partial = {**meta, "incomplete": f"methods still to run: {', '.join(left)}",
                       "wall_s": round(earlier_wall + time.perf_counter() - t_start, 1)}
            on_method_done({"meta": partial, "results": list(rows), "curves": dict(curves)})
    meta["wall_s"] = round(earlier_wall + time.perf_counter() - t_start, 1)
    return {"meta": meta, "results": rows, "curves": curves}


@dataclass
class EvalTaskSettings:
    """The settings a registered task reads (``ev.cfg``) when posenc eval runs it: the lab's names for what an eval
    has (train_len is the model's original context), and the tasks' declared settings in ``options``."""

    train_len: int | None
    eval_lens: list[int]
    options: dict
    eval_tokens: int
    sliding_stride: int
    sliding_lens: list[int]
    sliding_tokens: int
    seeds: list[int]
    train_until: float = 0.0


def run_task(task_name: str, model, s: EvalSettings, *, scheme: str, scaling: str, train_len: int | None,
             limit: int | None, tokenizer, byte_level: bool, batch_tokens: int, progress: bool,
             model_name: str, out: str | os.PathLike | None = None) -> list[dict]:
    """Rows of registered task ``task_name`` on a loaded transformers ``model``, through the lab's task interface:
    its own ``evaluate(ev)`` with ``ev.model`` the lab's LogitsModel adapter over the model (``logits_model``:
    forward = logits of token ids, generate = greedy; positions past ``limit`` unsupported). The task's token ids go
    to the model as they are (the lab's byte vocabulary: meaningful for byte-level models such as exported lab
    models). Nothing here names a task: a plug-in task runs as the built-ins do, under the lab's contract
    (``posenc.lab.tasks.checks.evaluate_task``: a row that breaks it is the task's error, naming its file).
    ``run.out`` is ``out`` (--out), else a temporary folder removed after: never the current directory."""
    import tempfile

    from posenc.lab.context import Evaluation, Run
    from posenc.lab.data import load_corpus
    from posenc.lab.tasks import get_task
    from posenc.lab.tasks.checks import evaluate_task

    task = get_task(task_name)
    cfg = EvalTaskSettings(train_len=train_len, eval_lens=list(s.eval_lens), options=dict(s.options),
                           eval_tokens=s.eval_tokens, sliding_stride=s.sliding_stride,
                           sliding_lens=list(s.sliding_lens), sliding_tokens=s.sliding_tokens, seeds=[s.seed])
    task.check(cfg)
    adapter = logits_model(model, max_len=limit, tokenizer=tokenizer, byte_level=byte_level,
                           batch_tokens=batch_tokens)
    with tempfile.TemporaryDirectory(prefix="posenc-eval-task-") as temporary:
        folder = Path(out if out is not None else temporary)
        folder.mkdir(parents=True, exist_ok=True)
        run = Run(cfg=cfg, corpus=load_corpus(s.data) if task.needs_corpus else None, device=input_device(model),
                  out=folder, progress=progress, log=lambda *_: None)
        ev = Evaluation(run=run, model=adapter, task=task_name, scheme=scheme, scaling=scaling, seed=s.seed)
        return [{**row, "std": row.get("std"), "model": model_name} for row in evaluate_task(task, ev)]


def model_identity(model_dir: str | os.PathLike, config_file: str | os.PathLike | None = None) -> list[dict]:
    """Fingerprints of what an eval's numbers depend on besides its settings: the model's files (config, weights,
    tokenizer) and the ``--config`` file it is loaded with."""
    from posenc._fingerprint import file_fingerprint

    files = model_files(model_dir, tokenizer=True) + ([Path(config_file)] if config_file else [])
    return [file_fingerprint(p) for p in files]


def check_resumable(doc: dict, meta: dict) -> None:
    """ConfigError unless ``doc`` (an earlier run's results.json) is an interrupted eval that this run (its
    ``meta`` so far: settings, model files, data) may continue: the same settings, model files and data."""
    old = doc.get("meta")
    if not (isinstance(old, dict) and all(k in doc for k in ("results", "curves"))
            and all(k in old for k in ("timings_s", "methods", "started"))):
        raise ConfigError("resume: the folder's results.json is not a posenc eval's (no meta, results, curves, "
                          "methods and timings): pass --overwrite to replace it")
    finished = old["timings_s"]
    if not old.get("incomplete"):
        raise ConfigError("resume: the eval in the folder is complete; nothing to resume (pass --overwrite to run "
                          "it again)")
    settings = old.get("settings")
    if isinstance(settings, dict):      # a setting added since that eval ran is its default there (same numbers)
        settings = {**{k: v for k, v in EvalSettings().to_dict().items() if k not in settings}, **settings}
    if settings != meta["settings"]:
        differ = sorted(k for k in set(meta["settings"]) | set(settings or {})
                        if (settings or {}).get(k) != meta["settings"].get(k))
        shown = "; ".join(f"{k}: {(settings or {}).get(k)!r} then, {meta['settings'].get(k)!r} now" for k in differ)
        raise ConfigError(f"resume: the interrupted eval ran other settings ({shown}); resume with the same "
                          "arguments, or pass --overwrite to start again")
    if old.get("model_files") != meta["model_files"]:         # (by content: the folder may be named otherwise now)
        raise ConfigError(f"resume: the model's files ({meta['model']}: config, weights, tokenizer or --config) "
                          "differ from the interrupted eval's; pass --overwrite to start again")
    if old.get("data") != meta["data"]:
        raise ConfigError("resume: the evaluation text differs from the interrupted eval's (--data); pass "
                          "--overwrite to start again")
    unknown = [m for m in finished if m not in meta["settings"]["methods"]]
    if unknown:
        raise ConfigError(f"resume: the interrupted eval finished methods {unknown} that these settings do not "
                          "run; pass --overwrite to start again")


def _lab_readable(doc: dict) -> bool:
    """The lab's tables and plots place lengths against the training length: they need it on every row."""
    return bool(doc["results"]) and all(r.get("train_len") for r in doc["results"])


def report_tables(doc: dict) -> str:
    """The lab's tables for these rows (posenc.lab.report.main_table: one per task and protocol, rows = model and
    method side by side); ``side_by_side`` when the model's original context is unknown."""
    from posenc.hf.lab_bridge import lab_tables

    return lab_tables(doc) if _lab_readable(doc) else side_by_side(doc)


def side_by_side(doc: dict) -> str:
    """Markdown tables: perplexity per protocol (rows = method, columns = eval length), then passkey."""
    rows = doc["results"]
    out = []
    for task, metric, key in (("lm", "ppl", "protocol"), ("passkey", "exact_match", "depth")):
        sel = [r for r in rows if r["task"] == task and r["metric"] == metric]
        if not sel:
            continue
        lens = sorted({r["eval_len"] for r in sel})
        groups: dict = {}
        for r in sel:
            groups.setdefault((r["scaling"], r[key] if task == "lm" else "mean over depths"), {}).setdefault(
                r["eval_len"], []).append(r["value"])
        title = "perplexity" if task == "lm" else "passkey exact match"
        out.append(f"{title}\n\n| method | {'protocol' if task == 'lm' else ''} | "
                   + " | ".join(str(L) for L in lens) + " |\n|---|---|" + "---|" * len(lens))
        for (method, sub), by_len in groups.items():
            cells = []
            for L in lens:
                vals = by_len.get(L)
                if not vals:
                    cells.append("-")
                elif any(v is None for v in vals):
                    cells.append("n/a")
                else:
                    v = sum(vals) / len(vals)
                    cells.append(f"{v:.3f}" if task == "lm" else f"{v:.2f}")
            out.append(f"| {method} | {sub} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _write_results(doc: dict, out_dir: str) -> Path:
    from posenc._atomic import atomic_write_json

    path = Path(out_dir) / "results.json"
    atomic_write_json(path, doc)
    return path


def write_outputs(doc: dict, out_dir: str, *, overwrite: bool = False) -> list[Path]:
    """results.json, the lab's plots and report.md into ``out_dir`` (created) -> the paths written. A folder already
    holding any of them (a lab run, an earlier eval) is refused unless ``overwrite``, which also removes an earlier
    run's plot this one does not make."""
    from posenc._atomic import atomic_write_text
    from posenc.hf.lab_bridge import lab_plots

    out = check_out_folder(out_dir, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    written = [_write_results(doc, out)]
    plots = lab_plots(doc, out) if _lab_readable(doc) else []
    written += [out / name for name in plots]
    written.append(atomic_write_text(out / "report.md", report_markdown(doc, plots)))
    for name in OUTPUT_FILES:          # an earlier run's plot this run did not make would sit beside its report
        if out / name not in written and (out / name).is_file():
            (out / name).unlink()
    return written


def _data_line(meta: dict) -> str:
    """report.md's line on the text perplexity was scored on: its source and which part of it (--data-split)."""
    data, split = meta["data"], meta["settings"].get("data_split", "validation")
    scored = meta.get("scored_text") or "its validation split"
    size = data.get("val_bytes") if split == "validation" else (data.get("train_bytes") or 0) + (data.get("val_bytes")
                                                                                                 or 0)
    return (f"- data: {data.get('source')} ({data.get('n_files')} files); scored: {scored}, {size} bytes, from "
            f"token {meta['settings'].get('eval_offset') or 0} (--eval-offset)")


def report_markdown(doc: dict, plots: list[str] = ()) -> str:
    """report.md: what was measured, on what, how long; the lab's tables and plots."""
    meta, s = doc["meta"], doc["meta"]["settings"]
    tokens = ("the model's byte tokenizer: the corpus bytes, the lab's stream" if meta["byte_tokens"]
              else "the model's tokenizer (lengths count its tokens)")
    data = meta.get("data") or {}
    lines = [f"# posenc eval: `{meta['model']}`", "",
             f"Measured wall time: **{meta['wall_s']:.0f} s** on {s['device']} ({s['dtype']}, {meta['threads']} "
             f"threads), started {meta['started']}; Python {meta['python']}, torch {meta['torch']}, "
             f"{meta['platform']}, {meta.get('cpu', 'CPU not recorded')}.", "", "## Settings", "",
             f"- tasks: {', '.join(s['tasks'])}; evaluation lengths: {s['eval_lens']} tokens; tokens: {tokens}",
             f"- perplexity: about {s['eval_tokens']} tokens scored per length "
             f"({s.get('sliding_tokens') or s['eval_tokens']} per sliding length); "
             f"sliding stride {s['sliding_stride']} "
             f"(-1: half the length, 0: off) on {s['sliding_lens'] or [max(s['eval_lens'])]}"]
    if "passkey_depths" in s:     # (absent when a plug-in replaced the passkey task)
        lines.append(f"- passkey: depths {s['passkey_depths']}, {s['passkey_trials']} trials per cell, seed "
                     f"{s['seed']}")
    if data:
        lines.append(_data_line(meta))
    for method, m in meta["methods"].items():
        what = ("the config as it is" if method == "none" else
                f"{method} on attention through posenc.patch" if attention_methods([method]) else
                f"{method} at factor {s['factor']:g}")
        lines.append(f"- method {method}: {what}; scheme {m['scheme']}, original context {m['original_context']}, "
                     f"attention {m['attn_implementation']}"
                     + (f"; config: {'; '.join(m['changes'])}" if m["changes"] else ""))
    lines += ["", "## Results", "", report_tables(doc), ""]
    lines += [line for name in plots for line in (f"![{name}]({name})", "")]
    lines += ["## Timings (s)", "", "| method | load + evaluate |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in meta["timings_s"].items()]
    return "\n".join(lines) + "\n"


# ---- command line ------------------------------------------------------------------------------------------------

def _names(text: str) -> list[str]:
    """Comma-separated names, none of them empty (as the lab's list flags: '' and 'a,,b' are refused)."""
    from posenc.argtypes import items

    return items(text, "names")


def add_arguments(parser) -> None:
    # the lab's list flags: an empty entry ('96,,192', '') is refused, not skipped; a bad one says what is expected
    from posenc._settings import parse_options
    from posenc.argtypes import ints
    from posenc.hf.lab_bridge import DATA_SPLITS

    parser.add_argument("model", help="a local transformers causal LM folder (config.json, weights, tokenizer) or "
                                      "a .gguf file (loaded by transformers; posenc convert makes a folder of it)")
    parser.add_argument("--eval-lens", type=ints, default=[128, 256, 512, 1024], help="lengths in tokens")
    parser.add_argument("--tasks", type=_names, default=["lm"],
                        help="registered tasks, comma-separated (lm, passkey, copy, a plug-in's)")
    parser.add_argument("--methods", type=_names, default=["none"],
                        help="none and/or extension methods: written into the config (linear,ntk,dynamic,yarn,...) "
                             "or applied to attention by posenc.patch (self-extend,rerope,leaky-rerope,dca,sinks)")
    parser.add_argument("--method-options", type=parse_options, default={},
                        help="attention methods' options, method.option=value,... (e.g. "
                             "self-extend.group_size=8,self-extend.window=1024,sinks.n_sink=4)")
    parser.add_argument("--factor", type=float, default=None, help="extension factor (target / original context)")
    parser.add_argument("--replace", action="store_true", help="replace a rope scaling the config already has")
    parser.add_argument("--config", default=None,
                        help="load the model with this config file instead of its config.json (posenc search output)")
    parser.add_argument("--data", default=None,
                        help="text file or folder (default: the CPython stdlib, as the lab); perplexity scores its "
                             "validation split, as the lab does: a file's last 10%% of bytes, a folder's files whose "
                             "sha256(relative path) starts below 26 (about 10%%); --data-split all scores all of it")
    parser.add_argument("--data-split", default="validation", choices=DATA_SPLITS,
                        help="what of the --data text perplexity scores: validation (default: the lab's validation "
                             "split, the text a lab model was not trained on) or all (a file's bytes in order; a "
                             "folder's training files, then its validation files)")
    parser.add_argument("--eval-tokens", type=int, default=49152,
                        help="tokens scored per length (whole windows of it); a text too short for every length "
                             "to score them, after --eval-offset, is refused")
    parser.add_argument("--eval-offset", type=int, default=0,
                        help="tokens of the text skipped before the first window (windows at a fixed offset: "
                             "--eval-offset 16384 --eval-tokens 16384 scores the second 16k window alone)")
    parser.add_argument("--sliding-stride", type=int, default=-1, help="-1: half the length; 0: off; S: stride")
    parser.add_argument("--sliding-lens", type=ints, default=[], help="lengths for the sliding protocol")
    parser.add_argument("--sliding-tokens", type=int, default=None,
                        help="tokens scored per sliding length (default: --eval-tokens), as posenc lab's flag")
    # the settings registered tasks declare (--passkey-depths, --passkey-trials, ...): one flag each, as in posenc lab
    from posenc._settings import add_setting_flags
    from posenc.lab.tasks.registry import TASK_SETTINGS

    add_setting_flags(parser, TASK_SETTINGS)
    parser.add_argument("--task-options", type=parse_options, default=None, metavar="KEY=VALUE,...",
                        help="settings declared by tasks, key=value,key=value (a plug-in's own too)")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="import a Python file or module that registers tasks (repeatable), as posenc lab does")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random passkey keys (default 0)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                        help="weights and activations (default float32)")
    parser.add_argument("--device-map", default=None, choices=["auto"], help="auto: accelerate's multi-device load")
    parser.add_argument("--attn-implementation", default=None, help="eager, sdpa, flash_attention_2 (default: model's)")
    parser.add_argument("--batch-tokens", type=int, default=None, help="tokens per forward (default: from vocab)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default or 0: torch's own)")
    parser.add_argument("--out", default=None, help="folder for results.json, report.md and the plots")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted eval in --out (same arguments): finished methods are kept")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace results.json / report.md already in --out")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (transformers' too)")


# EvalSettings' names that differ from their flags' (posenc.cli shows setting names in messages as flags)
FLAG_ALIASES = {"replace_scaling": "--replace"}


def check_threads(threads, name: str = "threads") -> int | None:
    """CPU threads for torch: None or 0 = torch's own choice, else a count up to the lab's own limit (ConfigError
    naming ``name``): torch.set_num_threads refuses a negative count only with its own RuntimeError."""
    from posenc._validate import check_int
    from posenc.lab.presets import SIZE_LIMITS

    return None if threads is None else check_int(threads, name, min=0, max=SIZE_LIMITS["threads"], error=ConfigError)


def run(args) -> int:
    threads = check_threads(args.threads)
    from posenc.lab.tasks.registry import TASK_SETTINGS
    from posenc.plugins import load_plugins

    load_plugins(args.plugin)           # before the settings are checked: a plug-in's task is an ordinary name
    options = dict(args.task_options or {})
    options.update({name: getattr(args, name) for name in TASK_SETTINGS if getattr(args, name, None) is not None})
    settings = EvalSettings(eval_lens=args.eval_lens, tasks=args.tasks, methods=args.methods, factor=args.factor,
                            method_options=args.method_options, replace_scaling=args.replace, config=args.config,
                            data=args.data, data_split=args.data_split,
                            eval_tokens=args.eval_tokens, eval_offset=args.eval_offset,
                            sliding_stride=args.sliding_stride, sliding_lens=args.sliding_lens,
                            sliding_tokens=args.sliding_tokens, options=options,
                            seed=args.seed, device=args.device, dtype=args.dtype, device_map=args.device_map,
                            attn_implementation=args.attn_implementation, batch_tokens=args.batch_tokens).validate()
    earlier = None
    if args.out:        # never into the model's folder, over its --config or --data, or over a model file
        check_output(args.out, f"out {args.out} (--out)", writes=OUTPUT_FILES,
                     inputs=[("model", args.model), ("--config", args.config), ("--data", args.data)])
    if args.resume:
        earlier = read_interrupted(args.out, args.overwrite)
    elif args.out:      # (evaluate_model checks the model folder first thing)
        check_out_folder(args.out, args.overwrite)
    if threads:
        torch.set_num_threads(threads)
    # with --out, each finished method's rows are saved at once (results.json, atomically): an interrupted run
    # keeps them, marked incomplete; the full results, report and plots replace them at the end
    def saved(partial: dict) -> None:     # (the folder is made with the first results: a refused run leaves none)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        _write_results(partial, args.out)
    doc = evaluate_model(args.model, settings, progress=not args.no_progress,
                         on_method_done=saved if args.out else None, resume=earlier, out=args.out)
    print(report_tables(doc))
    if args.out:
        # (the folder was checked before the run; what it holds now is this run's own partial results)
        written = write_outputs(doc, args.out, overwrite=True)
        print(f"wrote {', '.join(p.name for p in written)} into {args.out}")
    print(f"wall {doc['meta']['wall_s']:.1f} s")
    return 0


def read_interrupted(out_dir: str | None, overwrite: bool = False) -> dict:
    """The results.json of the interrupted eval in ``out_dir`` that ``--resume`` continues (checked against this
    run's settings and model by ``evaluate_model``); ConfigError naming the flag otherwise."""
    if not out_dir:
        raise ConfigError("resume (--resume): continues an interrupted eval in --out; pass --out DIR")
    if overwrite:
        raise ConfigError("resume (--resume) and overwrite (--overwrite) contradict each other: --resume keeps the "
                          "finished methods, --overwrite runs them again; pass one")
    path = Path(out_dir) / "results.json"
    from posenc._json import loads

    try:
        doc = loads(path.read_text(encoding="utf-8"), f"resume (--resume): {path}")
    except FileNotFoundError:
        raise ConfigError(f"resume (--resume): {out_dir} holds no results.json, so no eval to continue; run "
                          "without --resume") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"resume (--resume): cannot read {path} ({exc}); pass --overwrite to replace it") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"resume (--resume): {path} is not a posenc eval's results; pass --overwrite to replace it")
    return doc


def eval_main(argv: list[str] | None = None) -> int:
    """``posenc eval`` as a function (exit status; errors as one line on stderr)."""
    from posenc.hf.command import run_command

    return run_command("eval", add_arguments, run, argv, FLAG_ALIASES)

"""What posenc refuses about the weights transformers loaded (or failed to load) for a model: one owner for
``posenc eval`` (posenc.hf.evaluate.load_causal_lm) and ``posenc convert`` (posenc.hf.gguf.load_model).

A weight missing, left over or of another shape than the config's model means parts of it run with transformers'
random initialisation: scoring or converting that model would pass noise off under the model's name, so it is an
error (``refuse_unloaded_weights``). A safetensors file the safetensors package cannot open is named
(``damaged_weights_error``).
"""

from __future__ import annotations

from pathlib import Path

from posenc._internal.errors import ConfigError


def _text(exc, limit: int) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def damaged_weights_error(folder: Path, exc: BaseException) -> ConfigError:
    """The one-line refusal of a safetensors weights file the safetensors package cannot read (cut short,
    overwritten), naming the file: the first of the folder's whose header does not open."""
    from safetensors import SafetensorError, safe_open

    named = f"a .safetensors file in {folder}"
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except (SafetensorError, OSError):
            named = str(path)
            break
    return ConfigError(f"model {folder}: {named} is not a readable safetensors file ({_text(exc, 120)}); it "
                       "is damaged or cut short: save or download it again")


def refuse_unloaded_weights(info: dict, source: Path, config_file, architecture: str) -> None:
    """ConfigError listing a few keys when from_pretrained (``info``: its loading info) left parameters at their
    random initialisation (missing, or of another shape) or found weights the model has no place for. ``source``:
    the model folder, or the .gguf file (whose metadata is then the config); ``config_file``: the --config given
    instead of the model's own, or None."""
    from posenc.gguf import is_gguf

    def names(keys):
        return sorted(k[0] if isinstance(k, (tuple, list)) else str(k) for k in keys or ())

    problems = []
    for label, keys in (("missing", names(info.get("missing_keys"))),
                        ("unexpected", names(info.get("unexpected_keys"))),
                        ("of another shape", names(info.get("mismatched_keys")))):
        if keys:
            problems.append(f"{len(keys)} {label} ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''})")
    if info.get("error_msgs"):
        problems.append(f"errors: {_text(info['error_msgs'][0], 120)}")
    if not problems:
        return
    keys = f"(keys {'; '.join(problems)}), so parts of it would run with random weights"
    if not config_file and is_gguf(source):     # its metadata is the config: advice about the file, not config.json
        raise ConfigError(f"model {source}: the tensors in the file do not fit the {architecture} its metadata "
                          f"builds {keys}; the metadata does not describe the tensors (a damaged or mis-written "
                          "file)")
    where = f"config {config_file} (--config)" if config_file else f"model {source}: config.json"
    raise ConfigError(f"{where}: the weights in {source} do not fit the {architecture} this config builds "
                      f"{keys}; give a config of the weights' own architecture")

"""posenc never runs code from a model folder: the one owner of that rule.

A transformers model folder may name its own Python files (``auto_map`` in config.json or tokenizer_config.json);
transformers then asks "[y/N]" on a terminal and, on "y", imports them. Every place posenc loads a config, a
tokenizer or a model passes ``NO_REMOTE_CODE`` (``trust_remote_code=False``), so the question is never asked, and
a folder that can only be loaded with its own code is refused with one line (``refuse_remote_code``). A folder
whose model_type transformers knows loads with transformers' own code, whatever its auto_map says.
"""

from __future__ import annotations

from posenc._internal.errors import ConfigError

# keyword arguments for every from_pretrained / from_config posenc calls
NO_REMOTE_CODE = {"trust_remote_code": False}
NEVER = "posenc never runs code from a model folder"


def remote_code_error(label: str, detail: str = "") -> ConfigError:
    """The one-line refusal for a folder that needs its own code (``label``: "model DIR: config.json")."""
    detail = f" ({detail})" if detail else ""
    return ConfigError(f"{label}: loading it needs the Python code in the model folder{detail}; {NEVER}: use a "
                       "model whose architecture transformers itself has")


def check_config_code(data: dict, label: str) -> None:
    """ConfigError when the config mapping ``data`` (a config.json) can only be built by the folder's own code: an
    ``auto_map`` and a model_type transformers does not know."""
    auto_map = data.get("auto_map")
    if not auto_map:
        return
    try:
        from transformers import CONFIG_MAPPING

        known = data.get("model_type") in CONFIG_MAPPING
    except ImportError:
        known = False
    if not known:
        files = sorted({str(v).split(".")[0] for v in (auto_map.values() if isinstance(auto_map, dict) else [])
                        if isinstance(v, str)})
        raise remote_code_error(label, f"auto_map names {', '.join(f + '.py' for f in files) or 'its code'}; "
                                       f"model_type {data.get('model_type')!r} is not one transformers has")


def is_remote_code_refusal(exc: BaseException) -> bool:
    """Whether transformers raised ``exc`` because it would have had to run the folder's code."""
    return "trust_remote_code" in str(exc) or "custom code" in str(exc)

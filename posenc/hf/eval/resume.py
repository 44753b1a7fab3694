"""``posenc eval --resume``: what an interrupted eval recorded (its settings, model files, data) and the check that
this run may continue it, keeping the methods it finished."""

from __future__ import annotations

import os
from pathlib import Path

from posenc._internal.errors import ConfigError
from posenc.hf.eval.settings import EvalSettings
from posenc.hf.loading import model_files


def model_identity(model_dir: str | os.PathLike, config_file: str | os.PathLike | None = None) -> list[dict]:
    """Fingerprints of what an eval's numbers depend on besides its settings: the model's files (config, weights,
    tokenizer) and the ``--config`` file it is loaded with."""
    from posenc._internal.fingerprint import file_fingerprint

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


def read_interrupted(out_dir: str | None, overwrite: bool = False) -> dict:
    """The results.json of the interrupted eval in ``out_dir`` that ``--resume`` continues (checked against this
    run's settings and model by ``evaluate_model``); ConfigError naming the flag otherwise."""
    if not out_dir:
        raise ConfigError("resume (--resume): continues an interrupted eval in --out; pass --out DIR")
    if overwrite:
        raise ConfigError("resume (--resume) and overwrite (--overwrite) contradict each other: --resume keeps the "
                          "finished methods, --overwrite runs them again; pass one")
    path = Path(out_dir) / "results.json"
    from posenc._internal.json_io import loads

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

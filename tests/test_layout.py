"""The top level of posenc shows the subject: its loose modules are encodings (and the command's entry points); the
plumbing lives in posenc._internal, with the names users and plug-ins need public at the top level."""

from __future__ import annotations

from pathlib import Path

import posenc

PKG = Path(posenc.__file__).resolve().parent
# what a reader opening posenc/ should find beside the subpackages: positional encodings and their math, the
# `posenc` command, and the GGUF reader the tools share
TOP_LEVEL = {"__init__", "__main__", "cli", "absolute", "alibi", "angles", "irope", "perplexity", "pose", "positions",
             "randomized", "reference", "temperature", "gguf", "gguf_layout"}


def test_the_top_level_holds_encodings_not_plumbing():
    loose = {p.stem for p in PKG.glob("*.py")}
    assert loose <= TOP_LEVEL, f"new top-level modules {sorted(loose - TOP_LEVEL)}: plumbing goes in posenc/_internal/"
    assert (PKG / "_internal" / "__init__.py").is_file()


def test_the_public_names_of_the_plumbing_are_reachable_without_internal_paths():
    import posenc._internal.errors as errors
    import posenc._internal.settings as settings
    from posenc.errors import ConfigError, PosencError  # the documented path of the error classes

    assert PosencError is errors.PosencError is posenc.PosencError
    assert ConfigError is errors.ConfigError is posenc.ConfigError and issubclass(ConfigError, PosencError)
    assert posenc.Setting is settings.Setting
    try:
        posenc.load_rope_config({"rope_theta": 10000.0})      # bad input raises the public class
    except posenc.PosencError as e:
        assert "head_dim" in str(e) or "hidden_size" in str(e)
    else:
        raise AssertionError("a config without a head size was accepted")

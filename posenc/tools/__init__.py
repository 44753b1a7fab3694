"""Practitioner tools, each a CLI subcommand and a Python function:

    inspect_config(path)                       ``posenc inspect``  what a config.json does with positions
    extend_config(path, target_length, method) ``posenc extend``   a config extended to a longer context
    pick.pick(target_context, train_context)   ``posenc pick``     the positional-encoding picker (docs/picker.md)
    plot_sinusoidal / plot_rope / plot_scaling / plot_alibi / plot_decay   ``posenc plot KIND``

Names load lazily: importing posenc.tools pulls in neither matplotlib nor transformers. (``pick`` is also the
submodule's name, so import the function as ``from posenc.tools.pick import pick``.)
"""

from __future__ import annotations

from posenc._internal.lazy import lazy_exports

_EXPORTS = {
    "inspect_config": "posenc.tools.inspect",
    "format_report": "posenc.tools.inspect",
    "extend_config": "posenc.tools.extend",
    "format_recommendation": "posenc.tools.pick",
    "plot_sinusoidal": "posenc.tools.plot",
    "plot_rope": "posenc.tools.plot",
    "plot_scaling": "posenc.tools.plot",
    "plot_alibi": "posenc.tools.plot",
    "plot_decay": "posenc.tools.plot",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""Quiet loading: transformers' load report and, when asked, every progress bar it draws while loading or saving
(its own switch, huggingface_hub's, and the GGUF loader's plain tqdm bar)."""

from __future__ import annotations

import contextlib
import functools
import logging


@contextlib.contextmanager
def quiet_transformers(progress: bool = True):
    """While loading or saving: transformers' own load report is not logged (``load_causal_lm`` raises its own error
    with the keys instead), and with ``progress`` False its progress bars ("Loading weights", "Writing model shards",
    the GGUF loader's) are off; all restored after."""
    from transformers.utils import logging as hf_logging

    def no_report(record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)

    logger = logging.getLogger("transformers.modeling_utils")
    logger.addFilter(no_report)
    bars = hf_logging.is_progress_bar_enabled()
    hub_off = None
    if not progress and bars:
        try:
            from huggingface_hub.utils import are_progress_bars_disabled

            hub_off = are_progress_bars_disabled()
        except ImportError:
            pass
        hf_logging.disable_progress_bar()
    # transformers' GGUF loader calls tqdm itself ("Converting and de-quantizing GGUF tensors"), past the switch above
    gguf_utils = None
    if not progress:
        try:
            import transformers.modeling_gguf_pytorch_utils as gguf_utils
        except ImportError:
            pass
    gguf_bar = getattr(gguf_utils, "tqdm", None)
    if gguf_bar is not None:
        gguf_utils.tqdm = functools.partial(gguf_bar, disable=True)
    try:
        yield
    finally:
        if gguf_bar is not None:
            gguf_utils.tqdm = gguf_bar
        logger.removeFilter(no_report)
        if not progress and bars:
            hf_logging.enable_progress_bar()
            if hub_off:
                from huggingface_hub.utils import disable_progress_bars

                disable_progress_bars()

"""``posenc eval``'s public names at the path users import them from; the code lives in ``posenc.hf.eval`` (one
module per job) and ``posenc.hf.loading`` (loading a model)."""

from __future__ import annotations

# re-exports only: the public names of posenc eval, from their modules
from posenc.hf.eval.adapter import chunked_losses, logits_model, passkey_chars, token_stream  # noqa: F401
from posenc.hf.eval.command import HELP, add_arguments, eval_main, run  # noqa: F401
from posenc.hf.eval.loop import evaluate_model  # noqa: F401
from posenc.hf.eval.report import OUTPUT_FILES, report_tables, write_outputs  # noqa: F401
from posenc.hf.eval.resume import check_resumable  # noqa: F401
from posenc.hf.eval.settings import EvalSettings  # noqa: F401
from posenc.hf.loading import (DTYPES, load_causal_lm, load_tokenizer, model_files, original_context,  # noqa: F401
                               read_config)

"""``posenc eval MODEL_DIR``, one module per job: the lab's length-extrapolation measurements on any local transformers causal LM.

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

Modules: ``settings`` (EvalSettings and its checks), ``loop`` (evaluate_model: load each method, run each task),
``adapter`` (the model as the lab's tasks see it), ``resume`` (continuing an interrupted eval), ``report``
(tables, results.json, report.md, plots) and ``command`` (the flags and the run). Loading a model is
``posenc.hf.loading``'s, shared with ``posenc search``.
"""

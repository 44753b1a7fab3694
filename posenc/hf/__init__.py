"""posenc and Hugging Face transformers models: patch, export, evaluate, search.

    patch.py       ``posenc.patch(model)`` / ``posenc.unpatch(model)``: posenc's fused RoPE kernel with cached cos/sin
                   tables inside a loaded transformers model (Llama, Mistral, Qwen2/3, Phi-3, Gemma, GPT-NeoX families)
    export.py      ``posenc.export_lab_model(...)`` / ``posenc export``: a lab checkpoint as a transformers model folder
                   (GPT-NeoX for RoPE and NoPE, GPT-2 for learned and sinusoidal, MPT for bias-free ALiBi)
    tokenizer.py   the byte-level tokenizer (256 tokens, id = byte value) written beside an exported model
    evaluate.py    ``posenc eval MODEL_DIR``: the lab's perplexity protocols and passkey grid on any local causal LM,
                   optionally with a RoPE extension method written into its config
    search.py      ``posenc.search_model(...)`` / ``search_main``: LongRoPE's factor search on a model folder,
                   candidates run by transformers' own longrope code; the searched config is written beside the model
    request_yarn.py  ``posenc.hf.request_yarn.generate(model, ids, max_new_tokens, factors=...)``: request-sized YaRN,
                   the smallest factor of a set covering prompt + new tokens, chosen per request (1: unscaled)
    lab_bridge.py  the one module here that reads the lab (checkpoints, TinyLM anatomy, lm_eval, passkey episodes,
                   corpus splits, report tables and plots)

transformers is imported only when one of these functions runs; ``import posenc`` stays cheap.
"""

"""Additive attention biases learned or computed from positions (and, for CoPE, from the attention itself).

Each module has a functional core taking explicit query and key positions (so decoding with a KV cache, where the
new queries sit after the cached keys, gives the same rows as a full forward) and a thin ``nn.Module`` holding the
learned parameters. Every bias has shape [..., n_heads, q_len, k_len] and is added to the attention logits;
the causal mask stays attention's job.

    t5       T5's learned bias over log-spaced relative-position buckets (Raffel et al. 2020)
    kerple   KERPLE's log / power distance kernels with learned positive parameters (Chi et al. 2022)
    fire     FIRE: an MLP of the progressively normalised log distance (Li et al. 2023)
    cope     CoPE: contextual positions counted by sigmoid gates (Golovneva et al. 2024)
    positions  helpers shared by all of them (relative positions, end-aligned positions for a KV cache)
"""

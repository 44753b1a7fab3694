"""Multimodal (M-RoPE) and 2-D (axial) RoPE against transformers' own rotary classes and position builders."""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers", reason="transformers is the oracle here")
transformers.logging.set_verbosity_error()

from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2_vl  # noqa: E402

from posenc import Rotary, rope_parameters  # noqa: E402
from posenc._internal.errors import ConfigError, PosencError  # noqa: E402
from posenc.rope.config import load_rope_config, vision_config_of, vision_rope_config  # noqa: E402
from posenc.rope.mm_positions import mrope_position_ids, vision_position_ids  # noqa: E402
from posenc.rope.multiaxis import (apply_axial_rope, apply_mrope, apply_mrope_qk, mrope_axes,  # noqa: E402
                                   multi_axis_cos_sin, position_axes)

FIXTURES = "tests/fixtures/configs"


def _hf_text(family: str, section, head_dim: int = 32, rope: dict | None = None):
    """(config, rotary embedding, apply function) of a transformers M-RoPE text model family."""
    import importlib

    spec = {"qwen2_vl": ("qwen2_vl", "Qwen2VLTextConfig", "Qwen2VLRotaryEmbedding"),
            "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLTextConfig", "Qwen2_5_VLRotaryEmbedding"),
            "qwen3_vl": ("qwen3_vl", "Qwen3VLTextConfig", "Qwen3VLTextRotaryEmbedding"),
            "qwen3_5": ("qwen3_5", "Qwen3_5TextConfig", "Qwen3_5TextRotaryEmbedding"),
            "glm4v": ("glm4v", "Glm4vTextConfig", "Glm4vTextRotaryEmbedding")}[family]
    conf = importlib.import_module(f"transformers.models.{spec[0]}.configuration_{spec[0]}")
    model = importlib.import_module(f"transformers.models.{spec[0]}.modeling_{spec[0]}")
    params = {"rope_type": "default", "rope_theta": 1e4, **(rope or {})}
    if section is not None:
        params["mrope_section"] = list(section)
    if family == "qwen3_5":
        params.setdefault("partial_rotary_factor", 1.0)
    config = getattr(conf, spec[1])(hidden_size=64, num_attention_heads=2, head_dim=head_dim, num_hidden_layers=1,
                                    intermediate_size=64, vocab_size=32, max_position_embeddings=64,
                                    rope_parameters=params)
    return config, getattr(model, spec[2])(config), model.apply_rotary_pos_emb


# ----------------------------------------------------------------------------------------- axis layouts

def _hf_axes(family: str, section, pairs: int) -> list[int]:
    """Which position row drives each pair in transformers: recompose a probe whose row a holds the value a."""
    _, emb, _ = _hf_text(family, section, head_dim=2 * pairs)
    probe = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 1, pairs).clone()
    out = emb.recomposition_frequencies(probe)[0, 0]
    return (out[0::2] if family == "glm4v" else out[:pairs]).long().tolist()   # GLM-4V repeat_interleaves


@pytest.mark.parametrize("family,interleaved", [("qwen2_vl", False), ("qwen3_vl", True), ("glm4v", False)])
@pytest.mark.parametrize("section", [(16, 24, 24), (24, 20, 20), (2, 3, 3), (11, 11, 10), (1, 0, 3)])
def test_mrope_axes_match_transformers(family, interleaved, section):
    pairs = sum(section)
    assert mrope_axes(section, pairs, interleaved=interleaved).tolist() == _hf_axes(family, section, pairs)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(section=st.lists(st.integers(0, 12), min_size=3, max_size=3).filter(lambda s: sum(s) > 0))
def test_interleaved_axes_law(section):
    """Qwen3-VL's order: pair j follows h / w while j % 3 selects them and their sections last, t otherwise."""
    axes = mrope_axes(section, interleaved=True).tolist()
    assert axes == _hf_axes("qwen3_vl", section, sum(section))
    for axis in (1, 2):
        assert axes.count(axis) == min(section[axis], len(range(axis, sum(section), 3)))


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "glm4v"])
def test_family_default_sections_and_order(family):
    """A config without mrope_section gets the family's default, in the order its rotary hard-codes."""
    config, emb, _ = _hf_text(family, None, head_dim=2 * sum(emb_default(family)))
    assert "mrope_section" not in config.to_dict()["rope_parameters"]
    axes = position_axes(config)
    pairs = axes.numel()
    probe = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 1, pairs).clone()
    out = emb.recomposition_frequencies(probe)[0, 0]
    assert axes.tolist() == (out[0::2] if family == "glm4v" else out[:pairs]).long().tolist()


def emb_default(family):
    from posenc.rope.config import MROPE_FAMILIES
    return MROPE_FAMILIES[family][0]


def test_bad_sections():
    with pytest.raises(ConfigError, match="must add up to the number of rotary pairs"):
        mrope_axes([16, 24, 24], 60)
    with pytest.raises(ConfigError, match="interleaved M-RoPE needs 3 sections"):
        mrope_axes([4, 4], interleaved=True)
    with pytest.raises(ConfigError, match="mrope_section must be a list"):
        mrope_axes("16,24,24")
    with pytest.raises(ConfigError, match="must add up"):
        Rotary.from_config({"head_dim": 32, "rope_scaling": {"type": "mrope", "mrope_section": [4, 4, 4]}})


# ------------------------------------------------------------------------------------ M-RoPE rotation

@pytest.mark.parametrize("family,section,rope", [
    ("qwen2_vl", (4, 6, 6), None),
    ("qwen2_5_vl", (2, 7, 7), {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    ("qwen3_vl", (6, 5, 5), None),
    ("qwen3_5", (6, 5, 5), {"rope_type": "linear", "factor": 2.0}),
    ("glm4v", (4, 6, 6), None),
])
def test_rotary_with_three_row_positions_matches_transformers(family, section, rope):
    config, emb, apply = _hf_text(family, section, rope=rope)
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 9, 32), torch.randn(2, 1, 9, 32)
    positions = torch.randint(0, 60, (3, 2, 9))
    cos, sin = emb(q, positions)
    want_q, want_k = apply(q, k, cos, sin)
    rot = Rotary.from_config(config)                   # layout from the family: half, GLM-4V interleaved
    assert rot.n_axes == 3 and rot.layout == ("interleaved" if family == "glm4v" else "half")
    got_q, got_k = rot(q, k, positions)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=2e-5)
    assert rot.attention_scaling == pytest.approx(emb.attention_scaling)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(section=st.lists(st.integers(0, 6), min_size=3, max_size=3).filter(lambda s: sum(s) > 0),
       interleaved=st.booleans(), offset=st.integers(0, 5000), batched=st.booleans())
def test_text_positions_equal_plain_rope(section, interleaved, offset, batched):
    """Equal rows (text) give exactly plain RoPE, whichever way the rows are passed."""
    d = 2 * sum(section)
    mrope = Rotary(d, 1e4, layout="half", mrope_section=list(section), mrope_interleaved=interleaved)
    plain = Rotary(d, 1e4, layout="half")
    q = torch.randn(2, 3, 7, d)
    text = torch.arange(7) + offset
    text = text.expand(2, 7) if batched else text
    want = plain(q, q, text)[0]
    for positions in (text, text.expand(3, *text.shape) if batched else text.expand(3, 1, 7)):
        torch.testing.assert_close(mrope(q, q, positions)[0], want, rtol=0, atol=0)


def test_functional_mrope_equals_module_and_transformers():
    config, emb, apply = _hf_text("qwen2_vl", (4, 6, 6))
    torch.manual_seed(1)
    q, k = torch.randn(1, 2, 5, 32), torch.randn(1, 2, 5, 32)
    positions = torch.randint(0, 40, (3, 1, 5))
    want = apply(q, k, *emb(q, positions))
    got = apply_mrope_qk(q, k, positions, mrope_section=[4, 6, 6], layout="half")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(apply_mrope(q, positions, mrope_section=[4, 6, 6], layout="half"), got[0])
    inv, _ = rope_parameters(config)
    cos, sin = multi_axis_cos_sin(positions, inv, mrope_axes([4, 6, 6]))
    torch.testing.assert_close(cos, emb(q, positions)[0][..., :16].float(), rtol=0, atol=1e-6)


def test_mrope_positions_follow_the_length_rule():
    """Dynamic NTK grows with the largest position on any row, as transformers' dynamic_rope_update does."""
    rot = Rotary(16, rope_type="dynamic", factor=2.0, max_position_embeddings=32, mrope_section=[2, 3, 3])
    rot.cos_sin(torch.tensor([[[3, 4]], [[5, 60]], [[1, 2]]]))
    assert rot.max_seq_len_cached == 61
    torch.testing.assert_close(rot.inv_freq, rope_parameters(rot.config, 61)[0])


@pytest.mark.parametrize("positions, match", [
    (torch.zeros(2, 1, 5, dtype=torch.long), r"\[3, batch, seq\]"),
    (torch.zeros(3, 2, 4, dtype=torch.long), r"\[3, \.\.\.\] with \.\.\. \[seq\]"),
    (torch.zeros(3, 5, dtype=torch.long), r"got \[3, 5\]; a 2-D tensor reads as text positions \[batch, seq\]: "
                                          r"pass 3-axis positions as \[3, batch, seq\]"),
])
def test_bad_mrope_positions(positions, match):
    rot = Rotary(32, layout="half", mrope_section=[4, 6, 6])
    with pytest.raises(PosencError, match=match):
        rot(torch.randn(1, 2, 5, 32), torch.randn(1, 2, 5, 32), positions)


# --------------------------------------------------------------------------------------- axial (vision)

def _vision_case(kind: str):
    if kind == "qwen2_vl":
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
        config = Qwen2VLVisionConfig(embed_dim=64, num_heads=2, hidden_size=96, depth=1)
        return config, qwen2_vl.Qwen2VLVisionRotaryEmbedding(config), "vision"
    if kind == "qwen2_5_vl":
        from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as m
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
        config = Qwen2_5_VLVisionConfig(hidden_size=64, num_heads=2, depth=1, out_hidden_size=96)
        return config, m.Qwen2_5_VLVisionRotaryEmbedding(config), "vision"
    from transformers.models.pixtral import modeling_pixtral as m
    from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig
    config = PixtralVisionConfig(hidden_size=64, num_attention_heads=2, head_dim=32, num_hidden_layers=1)
    return config, m.PixtralVisionRotaryEmbedding(config), "pixtral"


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl", "pixtral"])
def test_axial_rotary_matches_transformers_vision_towers(kind):
    config, emb, style = _vision_case(kind)
    rot = Rotary.from_config(config)
    assert rot.config.rope_type == ("axial_pixtral" if kind == "pixtral" else "axial") and rot.n_axes == 2
    grid = torch.tensor([[1, 4, 6], [2, 2, 4]])
    positions = vision_position_ids(grid, spatial_merge_size=1 if kind == "pixtral" else 2)   # [2, N]
    n = positions.shape[1]
    torch.manual_seed(2)
    q, k = torch.randn(1, 2, n, 32), torch.randn(1, 2, n, 32)
    cos, sin = emb(q, positions.T)                         # transformers takes [N, 2] (row, column)
    if style == "vision":                                   # Qwen vision attention: [N, heads, dim]
        want = qwen2_vl.apply_rotary_pos_emb_vision(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin)
        want = tuple(w.transpose(0, 1)[None] for w in want)
    else:
        from transformers.models.pixtral.modeling_pixtral import apply_rotary_pos_emb
        want = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    got = rot(q, k, positions)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(apply_axial_rope(q, positions, rope_type=rot.config.rope_type), got[0],
                               rtol=0, atol=0)
    # transformers keeps d/4 frequencies and uses them for rows and columns; Pixtral its d/2 even / odd split
    want = emb.inv_freq if kind == "pixtral" else torch.cat([emb.inv_freq, emb.inv_freq])
    torch.testing.assert_close(rot.inv_freq, want, rtol=0, atol=0)


@pytest.mark.parametrize("name,model_type,head_dim", [
    ("qwen2-vl-7b-instruct", "qwen2_vl_vision", 80), ("qwen2.5-vl-7b-instruct", "qwen2_5_vl_vision", 80),
    ("qwen3-vl-8b-instruct", "qwen3_vl_vision", 72), ("pixtral-12b", "pixtral", 64),
    ("mistral-small-3.1-24b-instruct", "pixtral", 64), ("pixtral-12b-vision", "pixtral", 64),
])
def test_vision_towers_of_published_configs_match_transformers(name, model_type, head_dim):
    """The vision tower's frequencies as transformers' vision config + rotary class compute them from the file."""
    import importlib
    import json

    raw = json.load(open(f"{FIXTURES}/{name}.json"))
    rc = vision_rope_config(raw)
    assert rc.head_dim == rc.rotary_dim == head_dim
    vision = raw.get("vision_config", raw)
    family = model_type.removesuffix("_vision")
    conf = importlib.import_module(f"transformers.models.{family}.configuration_{family}")
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    config_cls = next(getattr(conf, n) for n in dir(conf) if n.endswith("VisionConfig"))
    emb_cls = next(getattr(modeling, n) for n in dir(modeling) if n.endswith("VisionRotaryEmbedding"))
    keys = {k: v for k, v in vision.items() if not k.startswith("_") and k != "model_type"}
    emb = emb_cls(config_cls(**keys))
    inv, _ = rope_parameters(rc)
    want = emb.inv_freq if model_type == "pixtral" else torch.cat([emb.inv_freq, emb.inv_freq])
    torch.testing.assert_close(inv, want, rtol=0, atol=0)


@pytest.mark.parametrize("image_size, patch_size", [(56, 14), (42, 14), (28, 7)])
def test_llama4_vision_rope_matches_transformers(image_size, patch_size):
    """Llama 4's vision tower: axial RoPE with interleaved pairs, the column on the first half of the pairs, patch
    coordinates + 1 and a CLS token (last) left unrotated; from the vision config or the whole model's config."""
    from transformers.models.llama4.configuration_llama4 import Llama4Config, Llama4VisionConfig
    from transformers.models.llama4.modeling_llama4 import Llama4VisionRotaryEmbedding, vision_apply_rotary_emb

    from posenc.rope.mm_positions import llama4_vision_position_ids

    config = Llama4VisionConfig(hidden_size=64, num_attention_heads=2, image_size=image_size, patch_size=patch_size,
                                num_hidden_layers=1, intermediate_size=64, vision_output_dim=64,
                                projector_input_dim=64, projector_output_dim=64)
    freqs = Llama4VisionRotaryEmbedding(config)(torch.zeros(1))
    positions = llama4_vision_position_ids(image_size, patch_size)
    n = positions.shape[1]
    assert n == (image_size // patch_size) ** 2 + 1 and positions[:, -1].tolist() == [0, 0]
    torch.manual_seed(0)
    q, k = torch.randn(1, n, 2, 32), torch.randn(1, n, 2, 32)              # [B, N, heads, D] as transformers
    want = vision_apply_rotary_emb(q, k, freqs)
    for source in (config.to_dict(), Llama4Config(vision_config=config.to_dict()).to_dict()):
        assert vision_rope_config(source).rope_type == "axial"
        rot = Rotary.from_config(vision_config_of(source))         # the tower's own config: its pair layout too
        assert rot.n_axes == 2 and rot.layout == "interleaved"
        got = rot(q.transpose(1, 2), k.transpose(1, 2), positions)
        for g, w in zip(got, want):
            torch.testing.assert_close(g.transpose(1, 2), w, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[0][:, :, -1], q.transpose(1, 2)[:, :, -1], rtol=0, atol=0)   # CLS: angle 0


def test_published_llama4_vision_tower_reads_as_axial_rope():
    import json

    rc = vision_rope_config(json.load(open(f"{FIXTURES}/llama-4-scout.json")))
    assert rc.rope_type == "axial" and rc.head_dim == 88 and rc.theta == 10000.0


def test_axial_of_an_unverified_vision_family_is_refused():
    with pytest.raises(ConfigError, match="rope_type 'axial' of model_type 'gemma4_vision'.*pair layout may differ"):
        load_rope_config({"model_type": "gemma4_vision", "head_dim": 64,
                          "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0}})
    assert load_rope_config({"head_dim": 64, "rope_parameters": {"rope_type": "axial"}}).rope_type == "axial"


def test_vision_position_ids_refuse_an_empty_grid_list():
    with pytest.raises(PosencError, match="grid_thw must hold at least one"):
        vision_position_ids(torch.zeros(0, 3, dtype=torch.long))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(grids=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=3),
       merge=st.sampled_from([1, 2]))
def test_vision_position_ids_match_transformers(grids, merge):
    from transformers.vision_utils import get_vision_position_ids

    grid = torch.tensor([[t, h * merge, w * merge] for t, h, w in grids])
    torch.testing.assert_close(vision_position_ids(grid, merge), get_vision_position_ids(grid, merge).T)


# -------------------------------------------------------------------------------- get_rope_index parity

def _hf_rope_index(family: str, merge: int, tokens_per_second=None):
    import importlib

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    model_cls = {"qwen2_vl": "Qwen2VLModel", "qwen2_5_vl": "Qwen2_5_VLModel", "qwen3_vl": "Qwen3VLModel"}[family]
    cls = getattr(module, model_cls)
    fake = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=types.SimpleNamespace(
        spatial_merge_size=merge, tokens_per_second=tokens_per_second)))
    fake.get_vision_position_ids = types.MethodType(cls.get_vision_position_ids, fake)
    return types.MethodType(cls.get_rope_index, fake)


_SEGMENT = st.one_of(st.tuples(st.just(0), st.integers(1, 4)),
                     st.tuples(st.sampled_from([1, 2]), st.tuples(st.integers(1, 3), st.integers(1, 3),
                                                                  st.integers(1, 3))))


def _mm_batch(rows, merge: int, *, frames_apart: bool = False, end_token: bool = False, pad: int = 0):
    """Token types for drawn segments (text runs, image / video grids after a vision-start token; Qwen3-VL:
    timestamp text before every frame), left-padded as generation pads -> (token_types, mask, image grid, video
    grid, each row's unpadded types)."""
    types_rows, images, videos = [], [], []
    for segments in rows:
        row = []
        for modality, size in segments:
            if modality == 0:
                row += [0] * size
                continue
            t, h, w = size
            t = 1 if modality == 1 else t
            row.append(0)                                    # <|vision_start|>: grids never touch
            (images if modality == 1 else videos).append([t, h * merge, w * merge])
            if modality == 2 and frames_apart:
                row += ([0] + [2] * (h * w)) * t
            else:
                row += [modality] * (t * h * w)
            row += [0] if end_token else []                  # <|vision_end|>
        types_rows.append(row)
    length = max(map(len, types_rows)) + pad
    token_types = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for b, row in enumerate(types_rows):
        token_types[b, length - len(row):] = torch.tensor(row)
        mask[b, length - len(row):] = 1
    return (token_types, mask, torch.tensor(images) if images else None, torch.tensor(videos) if videos else None,
            types_rows)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(rows=st.lists(st.lists(_SEGMENT, min_size=1, max_size=5), min_size=1, max_size=3),
       family=st.sampled_from(["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]), pad=st.integers(0, 3),
       seconds=st.lists(st.sampled_from([0.5, 1.0, 2.0, 0.1]), min_size=8, max_size=8))
def test_mrope_position_ids_match_get_rope_index(rows, family, pad, seconds):
    merge = 2
    token_types, mask, image_grid, video_grid, _ = _mm_batch(rows, merge, frames_apart=family == "qwen3_vl",
                                                             pad=pad)
    videos = video_grid.tolist() if video_grid is not None else []
    kwargs = {}
    if family == "qwen2_5_vl" and videos:
        kwargs = {"second_per_grid_ts": torch.tensor(seconds[:len(videos)])}
    tps = 2 if family == "qwen2_5_vl" else None
    want, want_deltas = _hf_rope_index(family, merge, tps)(torch.zeros_like(token_types), token_types, image_grid,
                                                           video_grid, attention_mask=mask, **kwargs)
    got, deltas = mrope_position_ids(token_types, image_grid, video_grid, spatial_merge_size=merge,
                                     attention_mask=mask, tokens_per_second=tps,
                                     second_per_grid_ts=kwargs.get("second_per_grid_ts"),
                                     split_video_frames=family == "qwen3_vl", after_vision="transformers")
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(deltas, want_deltas)
    # Qwen's own rule (the default) differs only where a video's temporal positions run past its spatial ones
    ours, ours_deltas = mrope_position_ids(token_types, image_grid, video_grid, spatial_merge_size=merge,
                                           attention_mask=mask, tokens_per_second=tps,
                                           second_per_grid_ts=kwargs.get("second_per_grid_ts"),
                                           split_video_frames=family == "qwen3_vl")
    long_video = any((t - 1) * (tps or 1) * max(seconds) >= max(h, w) // merge for t, h, w in videos)
    if not long_video:
        assert torch.equal(ours, got) and torch.equal(ours_deltas, deltas)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(rows=st.lists(st.lists(_SEGMENT, min_size=1, max_size=5), min_size=1, max_size=3),
       interval=st.sampled_from([None, 1, 2]))
def test_after_each_image_or_video_qwens_rule_continues_past_every_earlier_position(rows, interval):
    """after_vision="max" (Qwen's reference get_rope_index): every text token sits one past the largest position
    before it, so text never reuses a video's temporal positions, and generation (max + 1 = length + delta)
    continues right after the last token."""
    merge = 2
    token_types, mask, images, videos, types_rows = _mm_batch(rows, merge, end_token=True)
    length = token_types.shape[1]
    positions, deltas = mrope_position_ids(token_types, images, videos, spatial_merge_size=merge,
                                           attention_mask=mask, tokens_per_second=interval)
    for b, row in enumerate(types_rows):
        p = positions[:, b, length - len(row):]
        for i, kind in enumerate(row):
            if kind == 0:
                assert p[:, i].tolist() == [int(p[:, :i].max()) + 1 if i else 0] * 3
        assert int(p[:, -1].max()) + 1 == len(row) + int(deltas[b])


def test_text_after_a_long_video_follows_qwens_rule():
    """Qwen2.5-VL, 2 text tokens, a 4-frame 4x4 video merged 2x2 (tokens_per_second 2, 1 s per grid), 3 text
    tokens: Qwen's reference code continues the text at the video's largest position + 1 (9, 10, 11; delta -9),
    transformers 5.3+ at start + max(h, w) // 2 (4, 5, 6, inside the video's temporal range; delta -12)."""
    types_ = torch.tensor([[0, 0] + [2] * 16 + [0] * 3])
    common = dict(video_grid_thw=[[4, 4, 4]], spatial_merge_size=2, tokens_per_second=2, second_per_grid_ts=[1.0])
    positions, deltas = mrope_position_ids(types_, **common)
    assert positions[0, 0].tolist() == [0, 1] + [2] * 4 + [4] * 4 + [6] * 4 + [8] * 4 + [9, 10, 11]
    assert deltas.tolist() == [[-9]]
    positions, deltas = mrope_position_ids(types_, **common, after_vision="transformers")
    assert positions[0, 0].tolist()[-3:] == [4, 5, 6] and deltas.tolist() == [[-12]]


def test_mrope_position_ids_docstring_example():
    types_ = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
    positions, deltas = mrope_position_ids(types_, image_grid_thw=torch.tensor([[1, 4, 4]]), spatial_merge_size=2)
    assert positions[:, 0].tolist() == [[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]
    assert deltas.tolist() == [[5 - 7]]


@pytest.mark.parametrize("kwargs, match", [
    ({"token_types": [[0, 1, 1]], "image_grid_thw": [[1, 2, 2]]}, "does not match its grid"),
    ({"token_types": [[0, 1]]}, "more image runs"),
    ({"token_types": [[0, 3]]}, r"0 \(text\), 1 \(image\) or 2 \(video\)"),
    ({"token_types": [[0, 1]], "image_grid_thw": [[1, 0, 2]]}, "positive"),
    ({"token_types": [[0, 2, 0, 2]], "video_grid_thw": [[1, 2, 2], [1, 2, 2]], "tokens_per_second": 2,
      "second_per_grid_ts": [1.0]}, "second_per_grid_ts: fewer entries than videos"),
    ({"token_types": [[0, 2]], "video_grid_thw": [[1, 2, 2]], "tokens_per_second": 2, "second_per_grid_ts": 1.0},
     "second_per_grid_ts must be a 1-D tensor or sequence"),
    ({"token_types": [[0, 2]], "video_grid_thw": [[1, 2, 2]], "tokens_per_second": 2,
      "second_per_grid_ts": torch.tensor([[1.0]])}, "second_per_grid_ts must be a 1-D tensor"),
    ({"token_types": [[0, 2]], "video_grid_thw": [[1, 2, 2]], "tokens_per_second": 2,
      "second_per_grid_ts": [[1.0]]}, "second_per_grid_ts must hold finite seconds >= 0"),
    ({"token_types": [[0, 2]], "video_grid_thw": [[1, 2, 2]], "tokens_per_second": 2,
      "second_per_grid_ts": torch.tensor([-1.0])}, "second_per_grid_ts must hold finite seconds >= 0"),
    ({"token_types": [[0, 2]], "video_grid_thw": [[1, 2, 2]], "tokens_per_second": 2,
      "second_per_grid_ts": [float("nan")]}, "second_per_grid_ts must hold finite seconds"),
    ({"token_types": [[0, 2]], "video_grid_thw": [[1, 2, 2]], "tokens_per_second": 2,
      "second_per_grid_ts": [-1.0]}, "second_per_grid_ts must hold finite seconds >= 0"),
    ({"token_types": [[0, 2]], "video_grid_thw": [[1, 2, 2]], "tokens_per_second": "2"}, "tokens_per_second"),
    ({"token_types": [[0, 2, 2, 2, 2]], "video_grid_thw": [[4, 2, 2]], "tokens_per_second": 2,
      "second_per_grid_ts": [1e30]}, "past 2\\^62"),
    ({"token_types": [[0, 1]], "image_grid_thw": [[1, 2, 2]], "after_vision": "min"}, "after_vision"),
])
def test_mrope_position_ids_bad_input(kwargs, match):
    kwargs = {k: torch.tensor(v) if k.endswith(("types", "thw")) else v for k, v in kwargs.items()}
    with pytest.raises(PosencError, match=match):
        mrope_position_ids(kwargs.pop("token_types"), **kwargs)


def test_published_qwen_vl_configs_read_as_three_axis_rope():
    for name, section, interleaved in [("qwen2-vl-7b-instruct", [16, 24, 24], False),
                                       ("qwen2.5-vl-7b-instruct", [16, 24, 24], False),
                                       ("qwen3-vl-8b-instruct", [24, 20, 20], True)]:
        rc = load_rope_config(f"{FIXTURES}/{name}.json")
        assert (rc.params["mrope_section"], rc.params["mrope_interleaved"]) == (section, interleaved)
        assert Rotary.from_config(rc).n_axes == 3


@pytest.mark.parametrize("kind", ["list", "float64", "float32"])
def test_video_seconds_are_used_as_given_like_get_rope_index(kind):
    """Qwen2.5-VL's interval tokens_per_second x seconds is formed from the input as given (Python floats, a
    float64 or float32 tensor): 2/3 s per grid at 25 tokens/s truncates differently in float32 and float64."""
    merge, t = 2, 24
    types_ = torch.tensor([[0] + [2] * t + [0]])
    grid = torch.tensor([[t, 2, 2]])
    for tps in (2, 4, 25):
        for fps in (3, 0.3, 23.976, 29.97, 7, 1.5):
            sec = 2 / fps
            seconds = {"list": [sec], "float64": torch.tensor([sec], dtype=torch.float64),
                       "float32": torch.tensor([sec])}[kind]
            want, want_deltas = _hf_rope_index("qwen2_5_vl", merge, tps)(torch.zeros_like(types_), types_, None, grid,
                                                                          second_per_grid_ts=seconds)
            got, deltas = mrope_position_ids(types_, None, grid, spatial_merge_size=merge, tokens_per_second=tps,
                                             second_per_grid_ts=seconds, after_vision="transformers")
            assert torch.equal(got, want) and torch.equal(deltas, want_deltas), (tps, fps)


@pytest.mark.parametrize("lead", [(2, 3, 2), (2, 4), (2,)])
def test_per_row_positions_follow_the_batch_dim_whatever_the_rank_of_x(lead):
    """x [B, ..., T, D] (groups and heads, heads, or none) with positions [3, B, T]: row b of the batch, every
    head of it, uses positions[:, b]: the same as rotating each row on its own."""
    torch.manual_seed(0)
    T, D = 5, 16
    x = torch.randn(*lead, T, D)
    positions = torch.stack([torch.randint(0, 50, (3, T)), torch.randint(50, 100, (3, T))], 1)      # [3, 2, T]
    got = apply_mrope(x, positions, mrope_section=[2, 3, 3], layout="half")
    for b in range(2):
        row = apply_mrope(x[b:b + 1], positions[:, b:b + 1], mrope_section=[2, 3, 3], layout="half")
        torch.testing.assert_close(got[b:b + 1], row, rtol=0, atol=0)

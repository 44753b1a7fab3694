"""Position ids for multimodal sequences: 3-row M-RoPE ids for text mixed with image / video grids, and 2-D patch
coordinates for vision towers.

``mrope_position_ids`` follows the ``get_rope_index`` of Qwen2-VL, Qwen2.5-VL and Qwen3-VL:

- text runs: positions continue from the current position, equal on the three rows;
- an image / video grid (t, h, w) after spatial merging (h // m, w // m): row 0 = start + temporal index * interval
  (truncated to an integer), row 1 = start + patch row, row 2 = start + patch column, in (t, h, w) raster order;
- the next token starts after the grid: at its largest position + 1 (``after_vision="max"``, the default: Qwen's
  reference code, with which the checkpoints were trained, and transformers up to 5.2), or at start + max(h, w) // m
  (``"transformers"``: transformers 5.3 and later). They differ only for a video whose temporal positions run past
  its spatial ones (common with Qwen2.5-VL's interval of 2); there transformers 5.x gives the text after the video
  the video's own temporal positions;
- padding (attention_mask 0) keeps position 0; ``deltas`` = max position + 1 - unpadded length per row (what
  generation adds to the text positions of later tokens).

    >>> types = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])                 # text, a 2x2 merged image, text
    >>> positions, deltas = mrope_position_ids(types, image_grid_thw=torch.tensor([[1, 4, 4]]), spatial_merge_size=2)
    >>> positions[:, 0]   # t, h, w rows: [[0,1,2,2,2,2,4], [0,1,2,2,3,3,4], [0,1,2,3,2,3,4]]
"""

from __future__ import annotations

import itertools
import math

import torch

from posenc._internal.validate import check_choice, check_float, check_int, is_number
from posenc._internal.errors import PosencError

TEXT, IMAGE, VIDEO = 0, 1, 2


def _grids(grid_thw, name: str) -> torch.Tensor | None:
    if grid_thw is None:
        return None
    grid = torch.as_tensor(grid_thw)
    if grid.dim() != 2 or grid.shape[1] != 3 or grid.dtype.is_floating_point or bool((grid < 1).any()):
        raise PosencError(f"{name} must be an integer tensor [n, 3] of positive (t, h, w) grid sizes, "
                          f"got {list(grid.shape)} {grid.dtype}")
    return grid.long()


def _seconds(second_per_grid_ts):
    """Qwen2.5-VL's seconds per temporal grid of each video, iterated as transformers iterates them (0-d tensors of
    a tensor, numbers of a sequence), so interval = tokens_per_second * seconds is formed in the same dtype."""
    if second_per_grid_ts is None:
        return itertools.repeat(1)
    name = "second_per_grid_ts"
    if isinstance(second_per_grid_ts, torch.Tensor):
        t = second_per_grid_ts
        if t.dim() != 1 or t.is_complex() or t.dtype == torch.bool:
            raise PosencError(f"{name} must be a 1-D tensor of seconds (one per video), got {list(t.shape)} {t.dtype}")
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            raise PosencError(f"{name} must hold finite seconds >= 0, got {t.tolist()}")
        return iter(t.cpu())
    if isinstance(second_per_grid_ts, (str, bytes)) or not hasattr(second_per_grid_ts, "__iter__"):
        raise PosencError(f"{name} must be a 1-D tensor or sequence of seconds (one per video), got "
                          f"{second_per_grid_ts!r}")
    values = list(second_per_grid_ts)
    for v in values:
        if not is_number(v) or not 0 <= v < math.inf:
            raise PosencError(f"{name} must hold finite seconds >= 0 (one number per video), got {values!r}")
    return iter(values)


def _grid_positions(start: int, grid, merge: int, interval) -> torch.Tensor:
    """[3, t*h*w] positions of one grid (transformers' get_vision_position_ids with temporal merge 1)."""
    t, h, w = int(grid[0]), int(grid[1]) // merge, int(grid[2]) // merge
    temporal = torch.arange(t) * interval        # as transformers: integer index times interval, then truncated
    if bool((temporal >= 2**62).any()):
        raise PosencError(f"tokens_per_second * second_per_grid_ts = {float(interval)} puts a video's temporal "
                          "positions past 2^62")
    temporal = temporal.long()
    tt, hh, ww = torch.meshgrid(temporal, torch.arange(h) + start, torch.arange(w) + start, indexing="ij")
    positions = torch.stack([tt, hh, ww]).reshape(3, -1)
    positions[0] += start
    return positions


def mrope_position_ids(token_types, image_grid_thw=None, video_grid_thw=None, *, spatial_merge_size: int = 2,
                       attention_mask=None, tokens_per_second: float | None = None, second_per_grid_ts=None,
                       split_video_frames: bool = False, after_vision: str = "max"
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """3-row (t, h, w) position ids for a batch mixing text with image / video placeholder tokens.

    Args:
        token_types: [batch, seq] modality of each token: 0 text, 1 image, 2 video (transformers'
            mm_token_type_ids). Each run of 1s / 2s is one image / video, taking the next grid in order.
        image_grid_thw, video_grid_thw: [n, 3] (t, h, w) patch grids before merging, in order of appearance
            across the batch.
        spatial_merge_size: patches merged per side into one token (2 for Qwen2-VL / 2.5-VL / 3-VL).
        attention_mask: [batch, seq], 0 for padding (which gets position 0 and is skipped).
        tokens_per_second, second_per_grid_ts: Qwen2.5-VL's temporal spacing of video grids: video v's temporal
            index is multiplied by tokens_per_second * second_per_grid_ts[v] (1 s when not given). None: index x 1
            (Qwen2-VL, Qwen3-VL). Images are never spaced. second_per_grid_ts: a 1-D tensor or sequence, one entry
            per video, used as given (a float32 tensor, what the processor returns, or floats), as transformers does.
        split_video_frames: Qwen3-VL: each video frame is its own grid (t = 1), separated by timestamp text.
        after_vision: where the token after an image / video starts: "max" (the grid's largest position + 1, Qwen's
            reference code) or "transformers" (start + max(h, w) // merge, transformers 5.3+); see the module doc.
    Returns:
        (positions int64 [3, batch, seq], deltas int64 [batch, 1]).
    """
    types = torch.as_tensor(token_types)
    if types.dim() != 2 or types.dtype.is_floating_point:
        raise PosencError(f"token_types must be an integer tensor [batch, seq], got {list(types.shape)} {types.dtype}")
    merge = check_int(spatial_merge_size, "spatial_merge_size", min=1)
    check_choice(after_vision, "after_vision", ("max", "transformers"))
    if tokens_per_second is not None:
        check_float(tokens_per_second, "tokens_per_second", positive=True)
    images, videos = _grids(image_grid_thw, "image_grid_thw"), _grids(video_grid_thw, "video_grid_thw")
    if videos is not None and split_video_frames:
        videos = torch.repeat_interleave(videos, videos[:, 0], dim=0)
        videos[:, 0] = 1
    grids = {IMAGE: iter(images if images is not None else ()), VIDEO: iter(videos if videos is not None else ())}
    seconds = _seconds(second_per_grid_ts)
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask)
        if attention_mask.shape != types.shape:
            raise PosencError(f"attention_mask must have token_types' shape {list(types.shape)}, got "
                              f"{list(attention_mask.shape)}")
    positions = torch.zeros(3, *types.shape, dtype=torch.long)
    deltas = []
    for b in range(types.shape[0]):
        keep = attention_mask[b].bool() if attention_mask is not None else torch.ones(types.shape[1], dtype=torch.bool)
        row_types = types[b][keep].tolist()
        current, parts = 0, []
        for modality, run in itertools.groupby(row_types):
            n = len(list(run))
            if modality == TEXT:
                parts.append(torch.arange(current, current + n).expand(3, n))
                current += n
                continue
            if modality not in (IMAGE, VIDEO):
                raise PosencError(f"token_types must hold 0 (text), 1 (image) or 2 (video), got {modality}")
            grid = next(grids[modality], None)
            if grid is None:
                raise PosencError(f"more {'image' if modality == IMAGE else 'video'} runs in token_types than "
                                  "grids given")
            interval = 1
            if modality == VIDEO and tokens_per_second is not None:
                second = next(seconds, None)
                if second is None:
                    raise PosencError("second_per_grid_ts: fewer entries than videos in token_types")
                interval = tokens_per_second * second
            grid_positions = _grid_positions(current, grid, merge, interval)
            if grid_positions.shape[1] != n:
                raise PosencError(f"a run of {n} {'image' if modality == IMAGE else 'video'} tokens does not match "
                                  f"its grid {grid.tolist()} ({grid_positions.shape[1]} tokens after merging "
                                  f"{merge}x{merge})")
            parts.append(grid_positions)
            if after_vision == "max":
                current = int(grid_positions.max()) + 1
            else:
                current += max(int(grid[1]), int(grid[2])) // merge
        row = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)
        positions[:, b, keep] = row
        deltas.append((int(row.max()) + 1 if row.numel() else 0) - len(row_types))
    return positions, torch.tensor(deltas, dtype=torch.long).unsqueeze(1)


def vision_position_ids(grid_thw, spatial_merge_size: int = 1) -> torch.Tensor:
    """2-D (row, column) positions of the patches of each grid, int64 [2, patches], for axial vision RoPE.

    grid_thw: [n, 3] (t, h, w) patch grids (Pixtral: one [1, h, w] per image). Patches are listed in the order
    the patch embedding emits them: merge-block-major over spatial_merge_size x spatial_merge_size blocks (Qwen2-VL
    and successors; 1 = plain raster order, Pixtral), the h x w grid repeated t times (transformers'
    ``get_vision_position_ids``). Qwen2.5-VL's tower then reorders patches and their positions together into
    attention windows (``window_index``): apply the same reordering to these ids.
    """
    grids = _grids(grid_thw, "grid_thw")
    if grids is None or not len(grids):
        raise PosencError("grid_thw must hold at least one (t, h, w) grid, got none")
    merge = check_int(spatial_merge_size, "spatial_merge_size", min=1)
    parts = []
    for t, h, w in grids.tolist():
        if h % merge or w % merge:
            raise PosencError(f"grid {h}x{w} is not divisible by spatial_merge_size {merge}")
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        block = (h // merge, merge, w // merge, merge)
        rows = rows.reshape(block).transpose(1, 2).flatten()
        cols = cols.reshape(block).transpose(1, 2).flatten()
        parts.append(torch.stack([rows, cols]).repeat(1, t))
    return torch.cat(parts, dim=1)


def llama4_vision_position_ids(image_size: int, patch_size: int) -> torch.Tensor:
    """Llama 4's vision-tower positions, int64 [2, n * n + 1] for n = image_size // patch_size patches per side:
    (column + 1, row + 1) of each patch in raster order, then the CLS token at (0, 0), whose angles are zero
    (transformers' Llama4VisionRotaryEmbedding). Axis 0 (the first half of the pairs) is the column. Use with the
    config's ``Rotary.from_config`` (axial RoPE, interleaved pairs) or ``apply_axial_rope(..., layout="interleaved")``.
    """
    image_size = check_int(image_size, "image_size", min=1)
    patch_size = check_int(patch_size, "patch_size", min=1)
    n = image_size // patch_size
    if n < 1:
        raise PosencError(f"patch_size ({patch_size}) must not exceed image_size ({image_size})")
    patch = torch.arange(n * n)
    cls = torch.zeros(2, 1, dtype=torch.long)
    return torch.cat([torch.stack([patch % n + 1, patch // n + 1]), cls], dim=1)


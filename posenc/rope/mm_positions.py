"""Position ids for multimodal sequences: 3-row M-RoPE ids for text mixed with image / video grids, and 2-D patch
coordinates for vision towers.

``mrope_position_ids`` follows transformers' ``get_rope_index`` of Qwen2-VL, Qwen2.5-VL and Qwen3-VL (5.x):

- text runs: positions continue from the current position, equal on the three rows;
- an image / video grid (t, h, w) after spatial merging (h // m, w // m): row 0 = start + temporal index * interval
  (truncated to an integer), row 1 = start + patch row, row 2 = start + patch column, in (t, h, w) raster order;
  the next token starts at start + max(h, w) // m;
- padding (attention_mask 0) keeps position 0; ``deltas`` = max position + 1 - unpadded length per row (what
  generation adds to the text positions of later tokens).

    >>> types = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])                 # text, a 2x2 merged image, text
    >>> positions, deltas = mrope_position_ids(types, image_grid_thw=torch.tensor([[1, 4, 4]]), spatial_merge_size=2)
    >>> positions[:, 0]   # t, h, w rows: [[0,1,2,2,2,2,4], [0,1,2,2,3,3,4], [0,1,2,3,2,3,4]]
"""

from __future__ import annotations

import itertools

import torch

from posenc._validate import check_int
from posenc.errors import PosencError

TEXT, IMAGE, VIDEO = 0, 1, 2


def _grids(grid_thw, name: str) -> torch.Tensor | None:
    if grid_thw is None:
        return None
    grid = torch.as_tensor(grid_thw)
    if grid.dim() != 2 or grid.shape[1] != 3 or grid.dtype.is_floating_point or bool((grid < 1).any()):
        raise PosencError(f"{name} must be an integer tensor [n, 3] of positive (t, h, w) grid sizes, "
                          f"got {list(grid.shape)} {grid.dtype}")
    return grid.long()


def _grid_positions(start: int, grid, merge: int, interval) -> torch.Tensor:
    """[3, t*h*w] positions of one grid (transformers' get_vision_position_ids with temporal merge 1)."""
    t, h, w = int(grid[0]), int(grid[1]) // merge, int(grid[2]) // merge
    temporal = (torch.arange(t) * interval).long()     # as transformers: integer index times interval, truncated
    tt, hh, ww = torch.meshgrid(temporal, torch.arange(h) + start, torch.arange(w) + start, indexing="ij")
    positions = torch.stack([tt, hh, ww]).reshape(3, -1)
    positions[0] += start
    return positions


def mrope_position_ids(token_types, image_grid_thw=None, video_grid_thw=None, *, spatial_merge_size: int = 2,
                       attention_mask=None, tokens_per_second: float | None = None, second_per_grid_ts=None,
                       split_video_frames: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
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
            (Qwen2-VL, Qwen3-VL). Images are never spaced.
        split_video_frames: Qwen3-VL: each video frame is its own grid (t = 1), separated by timestamp text.
    Returns:
        (positions int64 [3, batch, seq], deltas int64 [batch, 1]).
    """
    types = torch.as_tensor(token_types)
    if types.dim() != 2 or types.dtype.is_floating_point:
        raise PosencError(f"token_types must be an integer tensor [batch, seq], got {list(types.shape)} {types.dtype}")
    merge = check_int(spatial_merge_size, "spatial_merge_size", min=1)
    images, videos = _grids(image_grid_thw, "image_grid_thw"), _grids(video_grid_thw, "video_grid_thw")
    if videos is not None and split_video_frames:
        videos = torch.repeat_interleave(videos, videos[:, 0], dim=0)
        videos[:, 0] = 1
    grids = {IMAGE: iter(images if images is not None else ()), VIDEO: iter(videos if videos is not None else ())}
    seconds = iter(torch.as_tensor(second_per_grid_ts).tolist() if second_per_grid_ts is not None
                   else itertools.repeat(1))
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
                interval = tokens_per_second * next(seconds)
            grid_positions = _grid_positions(current, grid, merge, interval)
            if grid_positions.shape[1] != n:
                raise PosencError(f"a run of {n} {'image' if modality == IMAGE else 'video'} tokens does not match "
                                  f"its grid {grid.tolist()} ({grid_positions.shape[1]} tokens after merging "
                                  f"{merge}x{merge})")
            parts.append(grid_positions)
            current += max(int(grid[1]), int(grid[2])) // merge
        row = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)
        positions[:, b, keep] = row
        deltas.append((int(row.max()) + 1 if row.numel() else 0) - len(row_types))
    return positions, torch.tensor(deltas, dtype=torch.long).unsqueeze(1)


def vision_position_ids(grid_thw, spatial_merge_size: int = 1) -> torch.Tensor:
    """2-D (row, column) positions of the patches of each grid, int64 [2, patches], for axial vision RoPE.

    grid_thw: [n, 3] (t, h, w) patch grids (Pixtral: one [1, h, w] per image). Patches are listed in the
    vision tower's order: merge-block-major over spatial_merge_size x spatial_merge_size blocks (Qwen2-VL and
    successors; 1 = plain raster order, Pixtral), the h x w grid repeated t times (transformers'
    ``get_vision_position_ids``).
    """
    grids = _grids(grid_thw, "grid_thw")
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

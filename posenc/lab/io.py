"""The rank-0-only rule: under torch.distributed only rank 0 writes files (``is_main_process``).

Every file the lab writes goes through ``posenc._atomic`` (temporary sibling + os.replace), so an interrupted run
never leaves a half-written file.
"""

from __future__ import annotations


def is_main_process() -> bool:
    """True unless torch.distributed is initialised and this is not rank 0."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0

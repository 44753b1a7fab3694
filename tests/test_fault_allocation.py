"""An impossible allocation is a one-line "out of memory", whichever allocator refused it."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("exc, shown", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:118] data. DefaultCPUAllocator: can't allocate memory: you tried "
                  "to allocate 8053063680 bytes. Error code 12 (Cannot allocate memory)"),
     "(tried to allocate 7.5 GiB)"),
    (RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.15 GiB total capacity)"),
     "(tried to allocate 20.00 GiB)"),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory"), "out of memory (use"),
])
def test_an_allocation_failure_is_one_line_out_of_memory(exc, shown, capsys):
    """torch's allocators raise RuntimeError, not MemoryError: still one line, never "a bug in posenc"."""
    from posenc._internal.faults import run_reporting_faults

    def fail():
        raise exc

    assert run_reporting_faults("lab", fail) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc lab: error: out of memory") and shown in err and "\n" not in err, err
    assert "bug" not in err


def test_a_real_impossible_allocation_is_out_of_memory(capsys):
    import torch

    from posenc._internal.faults import run_reporting_faults

    assert run_reporting_faults("lab", lambda: torch.empty(2**62, dtype=torch.uint8)) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc lab: error: out of memory") and "\n" not in err, err

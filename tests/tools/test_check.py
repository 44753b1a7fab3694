"""`posenc check`: every property passes on the real implementation, and the detectors do detect."""

import torch

from posenc.absolute import sinusoidal
from posenc.tools.check import run_checks, sign_changes_per_column
from posenc.cli import main


def test_all_checks_pass_with_measured_numbers():
    results = run_checks()
    assert len(results) == 5
    for r in results:
        assert r.passed, r
        assert r.measured <= r.threshold


def test_stripe_detector_sees_widening_and_its_absence():
    changes = sign_changes_per_column(sinusoidal(512, 128))[0::2]
    assert changes[0] > 100 and changes[-1] == 0 and (changes[1:] <= changes[:-1]).all()
    flipped = sign_changes_per_column(sinusoidal(512, 128).flip(-1))[1::2]   # frequencies now ascending
    assert (flipped[1:] > flipped[:-1]).any()


def test_check_command_exit_status(capsys):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "5 passed, 0 failed" in out and "rope shift invariance" in out


def test_shift_check_fails_for_a_broken_rope(monkeypatch):
    import posenc.tools.check as check

    def absolute_only(x, positions, **kw):  # adds a position-dependent offset: not a rotation
        return x + torch.as_tensor(positions, dtype=x.dtype).unsqueeze(-1) * 1e-3

    monkeypatch.setattr(check, "apply_rope", absolute_only)
    assert not check.rope_shift_invariance(draws=50).passed

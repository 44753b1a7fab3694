"""Suite-wide set-up: the hypothesis profile (tests/_support/posenc_hypothesis.py), loaded before any test module
builds its @settings, so that every property and fuzz test is derandomized under CI=true."""

import posenc_hypothesis

posenc_hypothesis.load()

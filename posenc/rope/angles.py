"""Moved to ``posenc.angles`` (below both posenc.rope and posenc.kernels); this name stays for old imports."""

from posenc.angles import Angles, angles_cos_sin, pack_frequencies  # noqa: F401

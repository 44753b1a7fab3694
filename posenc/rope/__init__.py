"""RoPE: the rotation (apply), the rope-type registry and its built-in types (registry, scaling, lessons), config
reading (config), multimodal / 2-D positions (multiaxis, mm_positions), per-layer schedules (layers) and the module
(module).

Importing the package registers the built-in rope types, so ``posenc.rope.config`` can validate configs against
them without importing ``posenc.rope.scaling`` itself (the import graph runs scaling -> config -> registry only).
"""

from posenc.rope import scaling as _builtin_types  # noqa: F401  (registers the built-in rope types)
from posenc.rope import lessons as _lesson_types  # noqa: F401,E402  (Resonance RoPE and DroPE's rope types)
from posenc.rope import fope as _fope_type  # noqa: F401  (registers the "fope" rope type: FoPE's clipped floor)

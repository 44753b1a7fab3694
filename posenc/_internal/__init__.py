"""posenc's plumbing: argument checks, errors and fault handling, atomic writes and output guards, JSON
limits, settings declarations, registries' common rules, plug-in loading, devices and machine probes.

Nothing here is a positional encoding; the encodings sit at the top of the package and in its subpackages.
The error classes users catch are public as ``posenc.PosencError`` / ``posenc.ConfigError`` and under
their documented path ``posenc._internal.errors``; plug-ins are loaded by ``posenc.load_plugins`` / ``--plugin``.
"""

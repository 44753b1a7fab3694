"""Exceptions raised by posenc. All derive from ValueError so callers can catch bad input in one place."""

from __future__ import annotations


class PosencError(ValueError):
    """Bad input to posenc: the message names the argument and what was expected."""


class ConfigError(PosencError):
    """A model config (config.json or mapping) is missing keys or holds invalid values."""


class DataError(PosencError):
    """A data file or folder is missing, empty or unreadable."""


class CheckpointError(PosencError):
    """A checkpoint is missing, corrupt, or does not match the model."""

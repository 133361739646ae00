"""The one exception type of the config package."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config is invalid: unknown key, wrong type, impossible batch sizes, unsupported value.

    The message names the key, the value and the broken rule (with the actual numbers).
    Subclass of ValueError so callers that catch ValueError keep working.
    """

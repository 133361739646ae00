"""The one exception type of the config package."""

from __future__ import annotations

from rlhf_core.redact import redact_text


class ConfigError(ValueError):
    """A config is invalid: unknown key, wrong type, impossible batch sizes, unsupported value.

    The message names the key, the value and the broken rule (with the actual numbers).
    Subclass of ValueError so callers that catch ValueError keep working.

    The message never holds a secret: every string argument goes through :func:`rlhf_core.redact.redact_text`
    (a URL's password or token, ``name=value`` with a secret name, secret values met earlier in this process,
    those of secret-named overrides and config-file keys included: :func:`rlhf_core.config.loader.load_config`),
    so the value quoted in an error about an unknown key, a wrong type or a bad choice is shown redacted.
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact_text(a) if isinstance(a, str) else a for a in args))

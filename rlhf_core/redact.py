"""Secret redaction: the one rule every sink uses (MLflow params, logs, Prefect artifacts, DuckDB ``params_json``).

A **secret name** is a config key, a dotted config path or an environment variable whose name, split into
parts at ``.``, ``_``, ``-`` and camelCase boundaries, has

- a part ``password`` / ``passwd`` / ``passphrase`` / ``secret`` / ``secrets`` / ``credential(s)`` /
  ``authorization`` / ``cookie``, or a glued form such as ``apikey`` / ``accesstoken``;
- ``key`` right after a secret qualifier (``api_key``, ``access_key``, ``secret_key``, ``private_key``,
  ``auth_key``, ``client_key``...): a bare ``*_key`` (``prompt_key``, ``reward_fn_key``, ``response_key``)
  names a dataset column and is **not** a secret;
- ``token`` as its last part (``hf_token``, ``GITHUB_TOKEN``, ``token``), unless it is a tokenizer's special
  token (``pad_token``, ``eos_token``...) or the trainer's ``balance_dp_token`` switch; ``tokens``,
  ``tokenizer`` and ``*_token_len_*`` are not secrets.

For a dotted path, any component counts: everything under ``reward_kwargs.credentials`` is secret.

A secret name's value becomes ``"***"`` unless it is ``None`` or a bool (neither can hold a secret). Free text
(log lines, markdown, any string value) is scrubbed of (a) the values of this process's environment variables
with secret names, (b) every secret value :func:`redact` has met in this process, and (c) the password of a
URL (``https://user:pw@host`` → ``https://user:***@host``; a userinfo of 20 characters or more without ``:`` is a
token: ``https://ghp_...@github.com`` → ``https://***@github.com``, while ``ssh://git@host`` keeps its user) and
of ``name=value`` assignments with a secret name (``?token=...``, an override ``+a.b.api_key=...``,
``HF_TOKEN=...``).

Not from verl (verl logs its whole config); the rule is ours. Import-light: no torch, no OmegaConf at import.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
from typing import Any, Mapping

SECRET = "***"

_SECRET_PARTS = frozenset({"password", "passwd", "passphrase", "secret", "secrets", "credential", "credentials",
                           "authorization", "cookie", "apikey", "accesskey", "secretkey", "privatekey",
                           "accesstoken", "authtoken", "apitoken", "refreshtoken", "bearertoken"})
_KEY_QUALIFIERS = frozenset({"api", "access", "secret", "private", "auth", "signing", "encryption", "client",
                             "session", "master", "account", "sas", "ssh", "license"})
_NOT_SECRET_TOKENS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "image", "video",
                                "audio", "vision", "placeholder", "start", "end", "dp"})
# shorter environment values are not scrubbed from free text ("1", "true" would blank every line)
MIN_SCRUB_LENGTH = 6

_SPLIT = re.compile(r"[._\-\s/]+|(?<=[a-z0-9])(?=[A-Z])")
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@")
# a URL whose userinfo is one long word, no ':' (`https://ghp_<40 chars>@github.com`): a token, not a user name
_URL_TOKEN = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<token>[^:/@\s]{%d,})@" % 20)
# `name=value` in a URL query, an override (`+a.b.api_key=v`), a log line (`HF_TOKEN=v`)
_ASSIGNMENT = re.compile(r"(?P<sep>^|[\s?&;,'\"(\[{+~])(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)=(?P<value>[^&#\s,'\"\])}]+)")
_SEEN: set[str] = set()  # secret values met by redact() in this process


def _parts(name: str) -> list[str]:
    return [p.lower() for p in _SPLIT.split(str(name)) if p]


@functools.lru_cache(maxsize=4096)
def _is_secret_component(component: str) -> bool:
    parts = _parts(component)
    for i, part in enumerate(parts):
        if part in _SECRET_PARTS:
            return True
        if part == "key" and i > 0 and parts[i - 1] in _KEY_QUALIFIERS:
            return True
    if parts and parts[-1] == "token":
        return not (len(parts) > 1 and parts[-2] in _NOT_SECRET_TOKENS)
    return False


def is_secret_name(name: str) -> bool:
    """Whether ``name`` (a key, a dotted path ``a.b.c`` or an environment variable) names a secret.

    The rule is in the module docstring; examples: ``api_key``, ``HF_TOKEN``, ``MLFLOW_TRACKING_PASSWORD``,
    ``reward_kwargs.credentials.user`` → True; ``data.prompt_key``, ``data.reward_fn_key``,
    ``rollout.max_num_batched_tokens``, ``model.tokenizer_path``, ``pad_token`` → False.
    """
    return any(_is_secret_component(c) for c in str(name).split("."))


def _redact_leaf(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    text = str(value)
    if len(text) >= MIN_SCRUB_LENGTH:
        _SEEN.add(text)
    return SECRET


def _plain(obj: Any) -> Any:
    # an OmegaConf container, or a subclass of one (rlhf_core.config.reads.RecordingConfig)
    if any(cls.__module__.startswith("omegaconf") for cls in type(obj).__mro__):
        from omegaconf import OmegaConf  # lazy: the rule itself needs no OmegaConf

        try:
            return OmegaConf.to_container(obj, resolve=True)
        except Exception:  # noqa: BLE001 - an unresolvable interpolation: redact the raw values
            return OmegaConf.to_container(obj, resolve=False)
    return obj


def _collect(obj: Any, path: str, secret: bool) -> None:
    """Remember the secret values under ``obj`` first, so a copy of one elsewhere is scrubbed too."""
    secret = secret or bool(path and is_secret_name(path))
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _collect(v, f"{path}.{k}" if path else str(k), secret)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect(v, path, secret)
    elif secret:
        _redact_leaf(obj)


def redact(obj: Any, path: str = "") -> Any:
    """A copy of ``obj`` (a mapping — an OmegaConf ``DictConfig`` works —, list, or scalar at config path
    ``path``) with every value under a secret name replaced by ``"***"`` and every string scrubbed
    (:func:`redact_text`). Keys may be nested or already dotted (``{"a.b.api_key": ...}``).

    Returns plain ``dict`` / ``list`` / scalars; the input is not changed. A value that could not be resolved
    (an OmegaConf interpolation error) is kept unresolved.
    """
    obj = _plain(obj)
    _collect(obj, path, False)
    return _redacted(obj, path)


def _redacted(obj: Any, path: str) -> Any:
    if path and is_secret_name(path):
        if isinstance(obj, Mapping):
            return {k: _redacted(v, f"{path}.{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [_redacted(v, path) for v in obj]
        return _redact_leaf(obj)
    if isinstance(obj, Mapping):
        return {k: _redacted(v, f"{path}.{k}" if path else str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_redacted(v, path) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def secret_values() -> list[str]:
    """The strings :func:`redact_text` removes: secret-named environment variables' values and the secret
    values :func:`redact` has met, at least ``MIN_SCRUB_LENGTH`` characters, longest first."""
    values = {v for k, v in os.environ.items() if len(v) >= MIN_SCRUB_LENGTH and is_secret_name(k)}
    return sorted(values | _SEEN, key=len, reverse=True)


def redact_text(text: str) -> str:
    """``text`` without known secret values, URL passwords and values assigned to secret names (``name=value``)."""
    if not text:
        return text
    for value in secret_values():
        if value in text:
            text = text.replace(value, SECRET)
    if "://" in text:
        text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{SECRET}@", text)
        text = _URL_TOKEN.sub(lambda m: f"{m['scheme']}{SECRET}@", text)
    if "=" in text:
        text = _ASSIGNMENT.sub(lambda m: f"{m['sep']}{m['name']}={SECRET}" if is_secret_name(m["name"])
                               else m[0], text)
    return text


def redact_json(text: str) -> str:
    """A JSON document with :func:`redact` applied (keys sorted); non-JSON text gets :func:`redact_text`."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        return redact_text(text)
    return json.dumps(redact(data), sort_keys=True, default=str)


def install_log_redaction() -> None:
    """Scrub every log record this process creates (any logger, any handler, Prefect's API log handler
    included) with :func:`redact_text`: wraps ``logging``'s record factory. Idempotent: a no-op while the
    current factory is ours; wraps again if something replaced it since.

    A record whose message changed gets the scrubbed text as ``msg`` and no ``args``.
    """
    previous = logging.getLogRecordFactory()
    if getattr(previous, "rlhf_redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's to report, not ours
            return record
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return record

    factory.rlhf_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


__all__ = ["SECRET", "install_log_redaction", "is_secret_name", "redact", "redact_json", "redact_text",
           "secret_values"]

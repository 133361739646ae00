"""Reading a YAML file that must hold a mapping (a config, ``pipeline.yaml``, a preset): one error line naming the
file, and the line and column of a syntax error, instead of PyYAML's multi-line traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError


def yaml_syntax_error(path: str | Path, exc: yaml.YAMLError) -> str:
    """One line for a PyYAML error: ``<path> line L, column C: not valid YAML: <problem>`` (1-based, as editors
    count), or without the position when PyYAML gives none."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    return f"{path}{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of the YAML file ``path`` (``{}`` for an empty file), parsed with ``yaml.safe_load``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigError: (a ``ValueError``) one line naming ``path``: it cannot be read (the OS reason), it is not
            valid YAML (with the 1-based line and column, :func:`yaml_syntax_error`), or its top level is not a
            mapping of ``key: value`` lines (naming the type found, e.g. ``list``).
    """
    if not Path(path).exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_syntax_error(path, exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a mapping of 'key: value' lines at the top level, got a "
                          f"{type(data).__name__}")
    return data

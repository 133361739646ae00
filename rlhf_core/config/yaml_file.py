"""Reading a YAML file that must hold a mapping (a config, an experiment file): one error line naming the
file, and the line and column of a syntax error or the key and lines of a duplicate key, instead of PyYAML's (or
OmegaConf's) multi-line messages."""

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


def _duplicate_key(node: yaml.Node, prefix: str = "", seen: set[int] | None = None) -> str | None:
    """``<dotted key> (lines A and B)`` for the first key that a mapping of the composed ``node`` holds twice (1-based
    lines, as editors count), or None; PyYAML's ``safe_load`` would keep the last one silently."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node already walked
        return None
    seen.add(id(node))
    children: list[tuple[str, yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            name = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
            if name is not None and name != "<<":
                if name in first:
                    return f"'{prefix}{name}' (lines {first[name]} and {key_node.start_mark.line + 1})"
                first[name] = key_node.start_mark.line + 1
            children.append((f"{prefix}{name}.", value_node))
    elif isinstance(node, yaml.SequenceNode):
        children = [(f"{prefix.rstrip('.')}[{i}].", item) for i, item in enumerate(node.value)]
    return next((d for child_prefix, child in children if (d := _duplicate_key(child, child_prefix, seen))), None)


def parse_yaml_text(text: str, source: str | Path) -> Any:
    """The YAML document ``text`` (``yaml.safe_load`` semantics; None when empty), read from ``source`` (a path or a
    label such as ``<experiment text>``, used in the messages).

    Raises:
        ConfigError: one line naming ``source``: not valid YAML (1-based line and column), or a mapping holds a key
            twice (the dotted key and both lines; PyYAML would keep the last one silently).
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        duplicate = _duplicate_key(node) if node is not None else None
        if duplicate:
            raise ConfigError(f"{source}: duplicate key {duplicate}: keep one of them")
        return loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_syntax_error(source, exc)) from None
    finally:
        loader.dispose()


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of the YAML file ``path`` (``{}`` for an empty file), parsed with ``yaml.safe_load``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigError: (a ``ValueError``) one line naming ``path``: it cannot be read (the OS reason), it is not
            valid YAML (with the 1-based line and column, :func:`yaml_syntax_error`), a mapping holds a key twice
            (naming the dotted key and both lines), or its top level is not a mapping of ``key: value`` lines
            (naming the type found, e.g. ``list``).
    """
    if not Path(path).exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    data = parse_yaml_text(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a mapping of 'key: value' lines at the top level, got a "
                          f"{type(data).__name__}")
    return data

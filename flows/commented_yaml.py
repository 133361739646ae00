"""YAML text with commented-out entries, for ``rlhf experiment from-verl`` (:mod:`flows.from_verl`): the experiment is
plain data in which a :class:`Commented` entry becomes a ``# ...  # why`` line instead of a key."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class Commented:
    """A line written as a YAML comment: ``text`` then ``  # why``."""

    text: str
    why: str = ""



def scalar(value: Any) -> str:
    """``value`` as one line of YAML flow style."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    return text.removesuffix("...").strip()


def emit(node: Any, indent: int = 0) -> list[str]:
    """YAML lines for ``node`` (dicts, lists, scalars, :class:`Commented` entries as ``# ...`` lines)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, Commented):
                lines.append(f"{pad}# {value.text}  # {value.why}")
            elif isinstance(value, (dict, list)) and value:
                empty = "" if plain(value) else (" []" if isinstance(value, list) else " {}")  # all commented out
                lines += [f"{pad}{key}:{empty}", *emit(value, indent + 2)]
            else:
                lines.append(f"{pad}{key}: {scalar(value)}")
        return lines
    for item in node:
        if isinstance(item, Commented):
            lines.append(f"{pad}# - {scalar(item.text)}  # {item.why}")
        elif isinstance(item, dict) and item:
            sub = emit(item, indent + 2)
            lines += [f"{pad}- {sub[0].lstrip()}", *sub[1:]]
        else:
            lines.append(f"{pad}- {scalar(item)}")
    return lines


def plain(node: Any) -> Any:
    """``node`` without its Commented entries: what the YAML text must load back as."""
    if isinstance(node, dict):
        return {k: plain(v) for k, v in node.items() if not isinstance(v, Commented)}
    if isinstance(node, list):
        return [plain(v) for v in node if not isinstance(v, Commented)]
    return node

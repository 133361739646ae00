"""verl / Hydra command-line overrides: ``a.b=v``, ``+a.new=v``, ``++a.b=v``, ``~a.b``.

A small parser for the subset of Hydra's override grammar that verl users type (hydra-core is not
a dependency). Values: ``null``, ``true``/``false`` (any case), ints, floats (``1e-6``, ``.5``,
``inf``), quoted strings, lists ``[a,b]``, dicts ``{k: v}``, interpolations ``${data.x}`` (kept as
interpolations and resolved later), anything else is a string. An unquoted top-level comma is a
Hydra sweep (``a=1,2``) and is rejected, as Hydra does without ``--multirun``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigError
from .schema import all_paths, unknown_key_error

_KEY = re.compile(r"^[A-Za-z_][\w\-]*(\.[\w\-]+)*$")
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?((\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?|\d+\.?\d*[eE][+-]?\d+)$")
_NONFINITE = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}


@dataclass(frozen=True)
class Override:
    """One parsed override. ``op``: set | add (``+``) | force (``++``) | delete (``~``)."""

    op: str
    key: str
    value: Any = None
    has_value: bool = True
    text: str = ""


class _ValueParser:
    """Recursive-descent parser for one override value."""

    def __init__(self, text: str, origin: str):
        self.s, self.i, self.origin = text, 0, origin

    def fail(self, why: str) -> ConfigError:
        return ConfigError(f"Cannot parse override '{self.origin}': {why} (at character {self.i} of the value)")

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def parse_top(self) -> Any:
        if self.s.strip() == "":
            return ""
        value = self.element(top=True)
        self.ws()
        if self.i < len(self.s):
            if self.s[self.i] == ",":
                raise ConfigError(
                    f"Ambiguous value in override '{self.origin}': an unquoted ',' is a Hydra sweep, which is "
                    f"not supported. Use brackets for a list (key=[a,b]) or quotes for a string (key='a,b').")
            raise self.fail(f"unexpected '{self.s[self.i:]}'")
        return value

    def element(self, top: bool = False) -> Any:
        self.ws()
        if self.i >= len(self.s):
            raise self.fail("missing value")
        c = self.s[self.i]
        if c == "[":
            return self.sequence()
        if c == "{" and not self.s.startswith("${", self.i):
            return self.mapping()
        if c in "'\"":
            return self.quoted()
        return _convert(self.bare(stops=",]}" if not top else ","))

    def sequence(self) -> list:
        self.i += 1
        items: list = []
        self.ws()
        if self.s.startswith("]", self.i):
            self.i += 1
            return items
        while True:
            items.append(self.element())
            self.ws()
            if self.s.startswith(",", self.i):
                self.i += 1
            elif self.s.startswith("]", self.i):
                self.i += 1
                return items
            else:
                raise self.fail("expected ',' or ']' in a list")

    def mapping(self) -> dict:
        self.i += 1
        out: dict = {}
        self.ws()
        if self.s.startswith("}", self.i):
            self.i += 1
            return out
        while True:
            self.ws()
            key = self.bare(stops=":").strip()
            if not self.s.startswith(":", self.i) or not key:
                raise self.fail("expected 'key: value' in a dict")
            self.i += 1
            out[key] = self.element()
            self.ws()
            if self.s.startswith(",", self.i):
                self.i += 1
            elif self.s.startswith("}", self.i):
                self.i += 1
                return out
            else:
                raise self.fail("expected ',' or '}' in a dict")

    def quoted(self) -> str:
        quote, self.i = self.s[self.i], self.i + 1
        out = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\" and self.i + 1 < len(self.s) and self.s[self.i + 1] in (quote, "\\"):
                out.append(self.s[self.i + 1])
                self.i += 2
                continue
            if c == quote:
                self.i += 1
                return "".join(out)
            out.append(c)
            self.i += 1
        raise self.fail("unterminated quoted string")

    def bare(self, stops: str) -> str:
        start, depth = self.i, 0
        while self.i < len(self.s):
            if self.s.startswith("${", self.i):
                depth += 1
                self.i += 2
                continue
            c = self.s[self.i]
            if depth and c == "}":
                depth -= 1
            elif not depth and c in stops:
                break
            self.i += 1
        if depth:
            raise self.fail("unterminated interpolation '${'")
        return self.s[start:self.i].strip()


def _convert(token: str) -> Any:
    low = token.lower()
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    if _INT.match(token):
        return int(token)
    if _FLOAT.match(token):
        return float(token)
    if low in _NONFINITE:
        return _NONFINITE[low]
    return token


def parse_value(text: str, origin: str = "") -> Any:
    """Parse an override's right-hand side into a python value (see the module docstring).

    Raises ConfigError on malformed brackets/quotes or an unquoted top-level comma.
    """
    return _ValueParser(text, origin or text).parse_top()


def parse_override(text: str) -> Override:
    """Split ``text`` (``[+|++|~]dotted.key[=value]``) into an Override.

    Raises ConfigError when the key is malformed or a set/add override has no '='.
    """
    op, body = "set", text.strip()
    for prefix, name in (("++", "force"), ("+", "add"), ("~", "delete")):
        if body.startswith(prefix):
            op, body = name, body[len(prefix):]
            break
    key, eq, raw = body.partition("=")
    key = key.strip()
    if not _KEY.match(key):
        raise ConfigError(f"Invalid override '{text}': '{key}' is not a dotted config key (expected a.b.c=value)")
    if not eq:
        if op != "delete":
            raise ConfigError(f"Invalid override '{text}': missing '=value' (use ~{key} to delete a key)")
        return Override(op, key, None, False, text)
    return Override(op, key, parse_value(raw, text), True, text)


def _lookup(container: dict, key: str) -> tuple[bool, Any]:
    node: Any = container
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _apply_one(cfg: DictConfig, ov: Override) -> None:
    exists, current = _lookup(OmegaConf.to_container(cfg, resolve=False), ov.key)
    if ov.op == "set":
        if not exists:
            raise unknown_key_error(ov.key, all_paths(cfg),
                                    f" (override '{ov.text}'; use '+{ov.key}=...' to add a new key)")
        OmegaConf.update(cfg, ov.key, ov.value, merge=False)
    elif ov.op == "add":
        if exists:
            raise ConfigError(f"Could not append to config: an item is already at '{ov.key}' (override "
                              f"'{ov.text}'). Use '{ov.key}=...' to change it or '++{ov.key}=...' to force.")
        with open_dict(cfg):
            OmegaConf.update(cfg, ov.key, ov.value, merge=False)
    elif ov.op == "force":
        with open_dict(cfg):
            OmegaConf.update(cfg, ov.key, ov.value, merge=False)
    else:
        if not exists:
            raise unknown_key_error(ov.key, all_paths(cfg), f" (override '{ov.text}': nothing to delete)")
        if ov.has_value and current != ov.value:
            raise ConfigError(f"Could not delete '{ov.key}' (override '{ov.text}'): its value is {current!r}, "
                              f"not {ov.value!r}")
        parent_key, _, leaf = ov.key.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
        with open_dict(cfg):
            del parent[leaf]


def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """Apply verl/Hydra overrides to ``cfg`` in order, in place, and return it.

    ``a.b=v`` sets an existing key (an unknown key raises ConfigError naming the nearest valid one);
    ``+a.b=v`` adds a new key (error if it exists, like Hydra); ``++a.b=v`` sets or adds;
    ``~a.b`` / ``~a.b=v`` deletes (the key must exist; with a value, it must match).
    Interpolations are left unresolved so they see later overrides. ``cfg`` is put in struct mode.
    """
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of strings, not one string")
    OmegaConf.set_struct(cfg, True)
    for text in overrides:
        ov = parse_override(text)
        try:
            _apply_one(cfg, ov)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"Could not apply override '{text}': {exc}") from exc
    return cfg

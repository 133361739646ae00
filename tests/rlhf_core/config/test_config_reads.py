"""Config values are read by attribute outside rlhf_core/config/: no ``.get(key[, default])``, no
``getattr(cfg, key, default)`` and no ``value or default`` on a config object (the default would be a second
copy of the YAML's, free to drift: it did for ``trainer.balance_batch``, ``data.seed`` and ``rollout.name``).

How a config object is recognised (an AST scan, per function, in source order):

* a *config root* is a name spelled like one — ``config``, ``cfg``, ``*_cfg``, ``*cfg`` (``mcfg``, ``acfg``),
  ``*_config`` — or ``self.config`` / ``self.<name>`` where ``<name>`` is spelled so (``self.rm_cfg``), or
  ``self.arr`` (the worker's ``actor_rollout_ref`` section);
* an attribute chain or subscript on a config root is a config object (``config.trainer``,
  ``self.config.actor_rollout_ref.rollout.val_kwargs``);
* a local name assigned from a config object is a config root from then on in that function
  (``data = config.data``, ``t = self.config.trainer``, ``algo = self.config.algorithm``).

So ``row.get("extra_info")``, ``batch.meta.get("temperature", 1.0)`` and ``ray.cluster_resources().get("GPU")``
(plain dicts) pass, and ``config.trainer.get("seed", 1)`` or ``data.seed or 1`` after ``data = config.data``
fail. ``ALLOWED`` lists the reviewed exceptions by file and line text.
"""
from __future__ import annotations

import ast
import re

import pytest

from tests.paths import REPO

ROOT = REPO
SCANNED = ("rlhf_core", "tasks", "flows", "infra", "rlhf_cli")
EXEMPT_DIR = ROOT / "rlhf_core" / "config"
_CONFIG_NAME = re.compile(r"^(?!hf_)(config|cfg|\w+_cfg|\w*cfg|\w+_config)$")  # hf_config: a transformers config
_CONVERSIONS = {"int", "float", "bool", "str", "list", "tuple", "dict"}
# (file relative to the repo root, a substring of the offending line): reviewed exceptions, each with its reason.
ALLOWED: set[tuple[str, str]] = {
    # transformers PretrainedConfig objects named `config`/`cfg` (their attributes differ by architecture)
    ("rlhf_core/models/loading.py", 'getattr(config, "initializer_range", 0.02)'),
    ("rlhf_core/workers/merger.py", 'getattr(config, "tie_word_embeddings", False)'),
    ("rlhf_core/workers/rollout/vllm_rollout.py", 'getattr(cfg, "get_text_config"'),
    ("rlhf_core/workers/rollout/vllm_rollout.py", 'getattr(cfg, "head_dim", None)'),
}


def _root_of(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _is_root_name(node: ast.AST, local_roots: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return bool(_CONFIG_NAME.match(node.id)) or node.id in local_roots
    return False


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.hits: list[tuple[int, str]] = []
        self.roots: set[str] = set()

    def is_config(self, node: ast.AST) -> bool:
        """True when ``node`` is a config root or an attribute chain / subscript on one."""
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return bool(_CONFIG_NAME.match(node.attr)) or node.attr == "arr"
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            base = node.value
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "self":
                    return self.is_config(base)
                base = base.value
            return _is_root_name(base, self.roots)
        return _is_root_name(node, self.roots)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        saved, self.roots = self.roots, set()
        self.generic_visit(node)
        self.roots = saved

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        if self.is_config(node.value):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        self.roots.add(name.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # cfg.get(...) and its aliases (get = cfg.get; get("key", default))
        if node.attr == "get" and self.is_config(node.value):
            self.hits.append((node.lineno, "config .get()"))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 3 and self.is_config(node.args[0]):
            self.hits.append((node.lineno, "getattr(config, key, default)"))
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        # `a or b` of two config values (use_kl_in_reward or use_kl_loss) is logic, not a default
        if (isinstance(node.op, ast.Or) and any(self._is_config_value(v) for v in node.values[:-1])
                and not self._is_config_value(node.values[-1])):
            self.hits.append((node.lineno, "config value `or` default"))
        self.generic_visit(node)

    def _is_config_value(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CONVERSIONS:
            return any(self._is_config_value(a) for a in node.args)  # int(cfg.x) or 1
        return isinstance(node, (ast.Attribute, ast.Subscript)) and self.is_config(node)


def scan_source(source: str) -> list[tuple[int, str]]:
    """(line, what) for every config ``.get`` / ``getattr`` default / ``or`` default in ``source``."""
    scanner = _Scanner()
    scanner.visit(ast.parse(source))
    return sorted(scanner.hits)


def _violations() -> list[str]:
    out = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if EXEMPT_DIR in path.parents:
                continue
            rel = path.relative_to(ROOT).as_posix()
            lines = path.read_text(encoding="utf-8").splitlines()
            for lineno, what in scan_source("\n".join(lines)):
                text = lines[lineno - 1].strip()
                if any(rel == f and snippet in text for f, snippet in ALLOWED):
                    continue
                out.append(f"{rel}:{lineno}: {what}: {text}")
    return out


def test_no_config_get_or_default_outside_the_config_package():
    bad = _violations()
    assert not bad, ("read config values by attribute (the default comes from rlhf_core/configs/*.yaml):\n  "
                     + "\n  ".join(bad))


@pytest.mark.parametrize("source, expected", [
    # the patterns the rule forbids
    ("def f(config):\n    return config.trainer.get('seed', 1)\n", [(2, "config .get()")]),
    ("def f(self):\n    return self.config.trainer.get('balance_batch', False)\n", [(2, "config .get()")]),
    ("def f(config):\n    data = config.data\n    return int(data.seed or 1)\n", [(3, "config value `or` default")]),
    ("def f(self):\n    t = self.config.trainer\n    return t.get('seed')\n", [(3, "config .get()")]),
    ("def f(mcfg):\n    return getattr(mcfg, 'lora_rank', 0)\n", [(2, "getattr(config, key, default)")]),
    ("def f(self):\n    return int(self.rm_cfg.max_length or 0)\n", [(2, "config value `or` default")]),
    ("def f(self):\n    return self.arr.rollout.get('name', 'hf')\n", [(2, "config .get()")]),
    ("def f(trainer_cfg):\n    get = trainer_cfg.get\n    return get('seed', 1)\n", [(2, "config .get()")]),
    # plain dicts and attribute reads pass
    ("def f(row, batch):\n    return row.get('extra_info') or {}, batch.meta.get('temperature', 1.0)\n", []),
    ("def f(config):\n    return config.data.seed, config.trainer.balance_batch\n", []),
    ("def f(config):\n    seed = config.data.seed\n    return 0 if seed is None else seed\n", []),
    ("import ray\ndef f():\n    return ray.cluster_resources().get('GPU', 0)\n", []),
    ("def f(config):\n    return bool(config.algorithm.use_kl_in_reward or config.actor.use_kl_loss)\n", []),
    ("def f(config):\n    return load_custom_cls(config.custom_cls) or Dataset\n", []),
])
def test_scanner_tells_config_objects_from_plain_dicts(source, expected):
    assert scan_source(source) == expected

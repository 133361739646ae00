"""Nested mappings as dotted paths: the one flattening of a config, for the schema and for MLflow params.

Import-light (no OmegaConf at import), so every layer can use it: the config schema (paths of declared keys),
the metric sinks (:func:`rlhf_core.trainer.tracking.mlflow_params`) and ``infra.lineage`` all walk a config here.
"""
from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

__all__ = ["flatten_tree"]


def flatten_tree(tree: Mapping[str, Any], prefix: str = "", *, whole: Container[str] = (),
                 keep_empty: bool = False) -> dict[str, Any]:
    """Every leaf of a nested mapping as ``{"a.b.c": value}``, in the mapping's order.

    Args:
        tree: nested mappings (plain dicts; resolve an OmegaConf config to a container first). Lists, tuples and
            every other non-mapping value are leaves, kept as they are (not turned into strings).
        prefix: prepended to every path (``"actor."`` gives ``"actor.optim.lr"``).
        whole: dotted paths (prefix included) whose mapping is one leaf, kept whole: the schema's free-form
            dicts (``override_config``, engine kwargs), whose sub-keys are not declared.
        keep_empty: an empty mapping is a leaf with value ``{}``; otherwise it has no leaf and disappears.

    Returns:
        ``{dotted path: value}``; keys are ``str(key)`` joined by ``.``.
    """
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and path not in whole and (value or not keep_empty):
            out.update(flatten_tree(value, path + ".", whole=whole, keep_empty=keep_empty))
        else:
            out[path] = value
    return out

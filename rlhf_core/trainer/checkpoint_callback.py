"""``trainer.checkpoint_callback_class``: user code run on the driver after each PPO checkpoint save (verl 0.9's
``verl.trainer.ppo.checkpoint_callback``; e.g. copy the checkpoint to object storage or register it).

The key names a class by its dotted path (``my_pkg.callbacks.Upload``), importable on the driver. It is built
once, with the whole config (``cls(config=config)``), when the trainer is built, so a wrong path fails before any
training. After each save completes, ``on_save(trainer=, global_step=, checkpoint_dir=, async_save=)`` is called;
with ``actor.checkpoint.async_save`` the files may still be being written then. An exception in the hook stops the
run (wrap its body for best effort), as in verl.
"""
from __future__ import annotations

import importlib
from typing import Any


class CheckpointCallback:
    """Base class of a checkpoint callback (subclassing it is optional: any class with ``on_save`` works).

    Args: config: the whole trainer config."""

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False,
                **kwargs: Any) -> None:
        """Called after the checkpoint ``checkpoint_dir`` (``.../global_step_<global_step>``) was saved."""


def build_checkpoint_callback(config: Any) -> Any | None:
    """The callback ``trainer.checkpoint_callback_class`` names, built with ``config``; None when null.

    Raises:
        ValueError: the path is not ``module.Class``, the module does not import, it has no such class, or the
            class has no ``on_save`` (naming the key and the value)."""
    path = config.trainer.checkpoint_callback_class
    if path is None:
        return None
    module_name, _, name = str(path).rpartition(".")
    where = f"trainer.checkpoint_callback_class={path!r}"
    if not module_name:
        raise ValueError(f"{where}: expected a dotted path module.Class")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except ImportError as exc:
        raise ValueError(f"{where}: module {module_name!r} does not import: {exc}") from exc
    except AttributeError as exc:
        raise ValueError(f"{where}: module {module_name!r} has no {name!r}") from exc
    if not callable(getattr(cls, "on_save", None)):
        raise ValueError(f"{where}: {name} has no on_save(trainer, global_step, checkpoint_dir, async_save) method")
    return cls(config=config)

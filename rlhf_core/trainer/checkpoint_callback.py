"""``trainer.checkpoint_callback_class``: user code run on the driver after each PPO checkpoint save (verl 0.9.1's
``verl.trainer.ppo.checkpoint_callback``; e.g. copy the checkpoint to object storage or register it).

The key names a class in a Python file, ``path/to/file.py:ClassName``, as every user file here
(:mod:`rlhf_core.user_code`: named by its path (relative: against the cwd), executed from there only, the load
logged with its absolute path and sha256); or, as verl 0.9.1 takes it, a dotted ``my_pkg.callbacks.Upload``
whose module is imported from ``sys.path`` (verl's ``load_class_from_fqn``), the module's file and sha256 logged
the same way. :func:`check_checkpoint_callback` (``run_ppo``, before Ray starts) loads the
class; the trainer builds it once, with the whole config (``cls(config=config)``), when it is built. After each
save completes, ``on_save(trainer=, global_step=, checkpoint_dir=, async_save=)`` is called; with
``actor.checkpoint.async_save`` the files may still be being written then. An exception in the hook stops the run
(wrap its body for best effort), as in verl.
"""
from __future__ import annotations

from typing import Any

from rlhf_core.config.errors import ConfigError
from rlhf_core.user_code import (exec_user_file, file_and_name_errors, file_sha256, import_dotted_class_module,
                                  is_dotted_class_path, resolve_user_file)

KEY = "trainer.checkpoint_callback_class"
_loaded: dict[tuple[str, str], Any] = {}  # (absolute path, sha256 of its bytes) -> module, per process


class CheckpointCallback:
    """Base class of a checkpoint callback (subclassing it is optional: any class with ``on_save`` works).

    Args: config: the whole trainer config."""

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False,
                **kwargs: Any) -> None:
        """Called after the checkpoint ``checkpoint_dir`` (``.../global_step_<global_step>``) was saved."""


def load_checkpoint_callback_class(config: Any) -> type | None:
    """The class ``trainer.checkpoint_callback_class`` (``<file>.py:<ClassName>`` or verl's dotted
    ``pkg.module.ClassName``) names; None when null.

    A file is executed once per process and content (a file whose bytes changed is executed again), logging
    ``trainer.checkpoint_callback_class: loading <absolute path> (sha256 <hex>)`` at INFO; a dotted module is
    imported (once, by Python's import system) and its file and sha256 logged likewise.

    Raises:
        ConfigError: naming the key and the value: neither form, no such file or module, the code raises
            while executing (the error chained), it defines no such class, or the class has no ``on_save``.
    """
    value = config.trainer.checkpoint_callback_class
    if value is None:
        return None
    where = f"{KEY}={value!r}"
    if is_dotted_class_path(str(value)):
        try:
            module, name = import_dotted_class_module(str(value), KEY)
        except ImportError as exc:
            raise ConfigError(str(exc) if str(exc).startswith(KEY) else f"{where}: {exc!r}") from exc
        except Exception as exc:
            raise ConfigError(f"{where}: the module failed to import: {exc!r}") from exc
        return _callback_class(module, name, where, getattr(module, "__file__", str(value)))
    errors = file_and_name_errors(str(value), KEY)
    if errors:
        raise ConfigError(errors[0])
    path, _, name = str(value).rpartition(":")
    try:
        path = resolve_user_file(path, KEY)
    except FileNotFoundError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    cache_key = (path, file_sha256(path))
    if cache_key not in _loaded:
        try:
            _loaded[cache_key] = exec_user_file(path, KEY, f"rlhf_checkpoint_callback_{cache_key[1][:16]}")
        except Exception as exc:
            raise ConfigError(f"{where}: {path} failed to import: {exc!r}") from exc
    return _callback_class(_loaded[cache_key], name, where, path)


def _callback_class(module: Any, name: str, where: str, path: str) -> type:
    """Class ``name`` of ``module`` (loaded from ``path``), checked to have ``on_save``. Raises: ConfigError."""
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        classes = sorted(k for k, v in vars(module).items() if isinstance(v, type) and not k.startswith("_"))
        raise ConfigError(f"{where}: {path} defines no class {name!r}; classes found there: {classes}")
    if not callable(getattr(cls, "on_save", None)):
        raise ConfigError(f"{where}: {name} has no on_save(trainer, global_step, checkpoint_dir, async_save) method")
    return cls


def check_checkpoint_callback(config: Any) -> None:
    """Load the class of ``trainer.checkpoint_callback_class`` (when set) so a bad file or class fails before Ray
    starts. Raises: ConfigError, as :func:`load_checkpoint_callback_class`."""
    load_checkpoint_callback_class(config)


def build_checkpoint_callback(config: Any) -> Any | None:
    """The callback ``trainer.checkpoint_callback_class`` names, built with ``cls(config=config)``; None when null.

    Raises:
        ConfigError: as :func:`load_checkpoint_callback_class`."""
    cls = load_checkpoint_callback_class(config)
    return None if cls is None else cls(config=config)

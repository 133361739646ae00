"""Load a user's class from a file (``data.custom_cls``, ``data.sampler``, ``data.datagen``): verl's
``load_extern_type``."""
from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from rlhf_core.user_code import exec_user_file, resolve_user_file


def load_custom_cls(custom_cls: Any) -> type[Dataset] | None:
    """The class ``custom_cls.name`` defined in the file ``custom_cls.path``; None when ``path`` is unset.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: ``path`` is set without ``name``.
        ImportError: the file fails to import (the original error is chained).
        AttributeError: the file has no attribute ``name``.
        TypeError: the attribute is not a ``torch.utils.data.Dataset`` subclass.
    """
    return load_extern_class(custom_cls.path, custom_cls.name, "data.custom_cls", Dataset)


def load_extern_class(path: Any, name: Any, key: str, base: type, path_key: str = "path",
                      name_key: str = "name") -> type | None:
    """The class ``name`` defined in the python file ``path`` (verl's ``load_extern_type``); None when ``path``
    is unset. ``key`` (e.g. ``data.sampler``) and ``path_key``/``name_key`` name the config keys in errors.
    Only that file is executed (a relative path against the cwd; no module-name lookup), and the load is
    logged with the absolute path and sha256 (:func:`rlhf_core.user_code.exec_user_file`).

    Raises:
        FileNotFoundError / ValueError / ImportError / AttributeError: as :func:`load_custom_cls`.
        TypeError: the attribute is not a subclass of ``base``.
    """
    if not path:
        return None
    if not name:
        raise ValueError(f"{key}.{path_key} is {path!r} but {key}.{name_key} is not set")
    path = resolve_user_file(str(path), f"{key}.{path_key}")  # absolute; never a module-name lookup
    module_name = f"rlhf_extern_{abs(hash(path))}"
    try:
        module = exec_user_file(path, f"{key}.{path_key}", module_name)  # logs the path and its sha256
    except Exception as exc:
        raise ImportError(f"{key}.{path_key} {path!r} failed to import: {exc!r}") from exc
    if not hasattr(module, name):
        raise AttributeError(f"{key}.{name_key}: {path!r} defines no {name!r}")
    cls = getattr(module, name)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{key} {path}:{name} must be a {base.__module__}.{base.__qualname__} subclass, got {cls!r}")
    return cls


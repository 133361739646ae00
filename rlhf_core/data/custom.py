"""Load a user's dataset class from a file (``data.custom_cls.{path, name}``, as verl's ``load_extern_type``)."""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from torch.utils.data import Dataset


def load_custom_cls(custom_cls: Any) -> type[Dataset] | None:
    """The class ``custom_cls.name`` defined in the file ``custom_cls.path``; None when ``path`` is unset.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: ``path`` is set without ``name``.
        ImportError: the file fails to import (the original error is chained).
        AttributeError: the file has no attribute ``name``.
        TypeError: the attribute is not a ``torch.utils.data.Dataset`` subclass.
    """
    path, name = custom_cls.path, custom_cls.name
    if not path:
        return None
    if not name:
        raise ValueError(f"data.custom_cls.path is {path!r} but data.custom_cls.name is not set")
    path = os.path.expanduser(str(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data.custom_cls.path: no such file {path!r}")
    module_name = f"rlhf_custom_dataset_{abs(hash(os.path.abspath(path)))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ImportError(f"data.custom_cls.path {path!r} failed to import: {exc!r}") from exc
    if not hasattr(module, name):
        raise AttributeError(f"data.custom_cls.name: {path!r} defines no {name!r}")
    cls = getattr(module, name)
    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        raise TypeError(f"data.custom_cls {path}:{name} must be a torch.utils.data.Dataset subclass, got {cls!r}")
    return cls


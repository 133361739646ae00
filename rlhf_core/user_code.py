"""Running a user's Python file named in the config (``custom_reward_function.path``, ``data.custom_cls.path``,
``data.sampler.class_path``, ``data.datagen.path``, ``trainer.checkpoint_callback_class``): from that explicit
file only, and logged.

- The path is a file path, never a module name: nothing is looked up on ``sys.path``, so a bare ``json`` or
  ``my_reward`` cannot resolve to an installed module or to a file elsewhere. A relative path is resolved
  against the current working directory once, here, and used as that absolute path from then on.
- Every load logs one INFO line on logger ``rlhf_core.user_code`` naming the config key, the absolute path
  and the sha256 of the bytes that were executed.

verl (``load_extern_type``, ``get_custom_reward_fn``) also loads by file path; the logging and the refusal
of module names are ours. Import-light (reward worker processes import it).
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
from types import ModuleType

logger = logging.getLogger(__name__)


def resolve_user_file(path: str, key: str) -> str:
    """The absolute path of the existing file ``path`` (``~`` expanded; relative → against the cwd).

    Raises:
        FileNotFoundError: no such file; the message names ``key``, the value and the absolute path tried,
            and says that module names are not looked up.
    """
    given = str(path)
    resolved = os.path.abspath(os.path.expanduser(given))
    if not os.path.isfile(resolved):
        raise FileNotFoundError(f"{key}: no such file {given!r} (looked for {resolved}; a file path is needed, "
                                f"module names are not looked up on sys.path)")
    return resolved


def file_sha256(path: str) -> str:
    """sha256 hex digest of the file's bytes."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def exec_user_file(path: str, key: str, module_name: str) -> ModuleType:
    """Execute the Python file ``path`` as module ``module_name`` (registered in ``sys.modules``) and return it.

    Logs ``"<key>: loading <absolute path> (sha256 <hex>)"`` at INFO before executing it.

    Raises:
        FileNotFoundError: as :func:`resolve_user_file`.
        ImportError: the file is not importable as Python source (no ``.py`` suffix).
        Exception: whatever the file raises while executing, unchanged (it is then not left in ``sys.modules``).
    """
    resolved = resolve_user_file(path, key)
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise ImportError(f"{key}: {resolved} is not a Python source file (.py)")
    with open(resolved, "rb") as fh:
        source = fh.read()  # read once: the bytes hashed are the bytes executed
    logger.info("%s: loading %s (sha256 %s)", key, resolved, hashlib.sha256(source).hexdigest())
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        exec(compile(source, resolved, "exec"), module.__dict__)  # noqa: S102 - the user's own file, by design
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def file_and_name_errors(value: str, key: str) -> list[str]:
    """What is wrong with ``value`` as ``<file>.py:<Name>`` (a Python file and a name defined in it), one line
    each naming ``key`` and the value; empty when the form is right (the file is not looked at here). A dotted
    module path (``pkg.mod.Name``, the form verl's ``load_class_from_fqn`` imports) gets the file form to write
    instead, since module names are not looked up."""
    where = f"{key}={value!r}"
    path, sep, name = str(value).rpartition(":")
    if not sep:
        module, _, last = str(value).rpartition(".")
        hint = f", e.g. {module.replace('.', '/')}.py:{last}" if module and last.isidentifier() else ""
        return [f"{where}: expected <file>.py:<ClassName>{hint} (user code is loaded from a file named by its path, "
                f"its sha256 logged; module names are not looked up on sys.path)"]
    errors = []
    if not path.endswith(".py"):
        errors.append(f"{where}: {path!r} is not a Python source file (.py) (expected <file>.py:<ClassName>)")
    if not name.isidentifier():
        errors.append(f"{where}: {name!r} after the ':' is not a Python name (expected <file>.py:<ClassName>)")
    return errors


def is_dotted_class_path(value: str) -> bool:
    """True when ``value`` is a dotted ``pkg.module.Name`` (two or more Python names, no ``:``, ``/`` or ``.py``
    suffix): the form verl's ``load_class_from_fqn`` imports."""
    value = str(value)
    parts = value.split(".")
    return (":" not in value and "/" not in value and not value.endswith(".py") and len(parts) >= 2
            and all(part.isidentifier() for part in parts))


def import_dotted_class_module(value: str, key: str) -> tuple[ModuleType, str]:
    """``(module, name)`` of the dotted class path ``value`` (``pkg.mod.Name``): ``pkg.mod`` imported with
    ``importlib`` from ``sys.path`` as verl's ``load_class_from_fqn`` does, its file and that file's sha256 logged
    (``"<key>: loading module pkg.mod from <file> (sha256 <hex>)"`` at INFO) as for a file named by path.

    Raises:
        ImportError: the module is not importable (the message names ``key`` and the value, and that the file
            form ``path/to/file.py:Name`` needs no package on ``sys.path``); or whatever the module raises.
    """
    module_name, _, name = str(value).rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ImportError(f"{key}={value!r}: no module {module_name!r} on sys.path ({exc}); install the package or "
                          f"name the file: {module_name.replace('.', '/')}.py:{name}") from exc
    origin = getattr(module, "__file__", None)
    digest = file_sha256(origin) if origin and os.path.isfile(origin) else "unknown: no source file"
    logger.info("%s: loading module %s from %s (sha256 %s)", key, module_name, origin, digest)
    return module, name


_extensions: dict[str, ModuleType] = {}  # absolute path -> module, per process


def import_extensions(paths, key: str = "trainer.extensions") -> list[ModuleType]:
    """Execute each extension file of ``paths`` (a list of Python file paths) once per process, in order.

    Extensions register what the config names: ``register_adv_est`` (``algorithm.adv_estimator``),
    ``register_policy_loss`` (``policy_loss.loss_mode``), reward managers (``reward_model.reward_manager``).
    ``load_config`` calls this before checking choices, and every worker before building its models, so a
    registered name is accepted and found in every process. A file already executed here is not run again.

    Raises:
        FileNotFoundError: as :func:`resolve_user_file`, naming ``key``.
        Exception: whatever the file raises while executing (see :func:`exec_user_file`).
    """
    modules = []
    for path in list(paths or []):
        resolved = resolve_user_file(str(path), key)
        if resolved not in _extensions:
            name = "rlhf_extension_" + hashlib.sha256(resolved.encode()).hexdigest()[:16]
            _extensions[resolved] = exec_user_file(resolved, key, name)
        modules.append(_extensions[resolved])
    return modules


__all__ = ["exec_user_file", "file_and_name_errors", "file_sha256", "import_extensions", "resolve_user_file"]

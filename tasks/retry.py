"""Which failed stages are retried: an input error or a full/read-only store fails the same way on every try
(:func:`is_retriable`); every stage task carries the Prefect ``retry_condition_fn`` :func:`retry_unless_bad_input`.
Plain functions (no Prefect, no MLflow import): the tasks only call them.
"""

from __future__ import annotations

from typing import Any, Iterable


def non_retriable_types() -> tuple[type[BaseException], ...]:
    """Errors that fail the same way on every try: the ``rlhf`` commands' input errors
    (:data:`rlhf_core.cli.INPUT_ERRORS`: a bad config, bad data, a missing file, an unreachable hub or remote URL)
    and a full or read-only store (:class:`rlhf_core.storage.StorageError`)."""
    from rlhf_core.cli import INPUT_ERRORS
    from rlhf_core.storage import StorageError

    return (*INPUT_ERRORS, StorageError)


def _ray_task_error() -> type[BaseException] | None:
    try:
        from ray.exceptions import RayTaskError
    except ImportError:  # pragma: no cover - ray is a dependency
        return None
    return RayTaskError


def _causes(exc: BaseException, depth: int = 0) -> Iterable[BaseException]:
    """``exc`` and, for a RayTaskError (possibly nested: a driver on Ray calling workers), its causes."""
    yield exc
    ray_error = _ray_task_error()
    if depth >= 5 or ray_error is None or not isinstance(exc, ray_error):
        return
    inner: list[BaseException] = []
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        inner.append(cause)
    try:
        as_cause = exc.as_instanceof_cause()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - some causes cannot be re-typed
        as_cause = None
    if isinstance(as_cause, BaseException) and as_cause is not exc:
        inner.append(as_cause)
    for item in inner:
        yield from _causes(item, depth + 1)


def is_retriable(exc: BaseException | None) -> bool:
    """Whether a failed stage is worth retrying: False for an input error or a full/read-only store.

    The errors of :func:`non_retriable_types` — ``ConfigError`` (an override typo, impossible batch
    sizes), ``DataError`` (bad rows, an unreadable dataset), ``FileNotFoundError`` (a missing data
    folder or model), ``RemoteUnavailableError`` (the hub or a remote URL could not be read: no
    network, a wrong id; the message says how to use local files) — and any ``OSError`` whose errno
    is ``ENOSPC``/``EDQUOT``/``EROFS`` (:func:`rlhf_core.storage.is_storage_error`) fail the same way
    on every try, so they are not retried: the flow run fails at once with their message. Everything
    else (a killed or lost Ray worker, a timeout, OOM, a plain ``ConnectionError``) is retried.
    Errors raised on Ray arrive as ``ray.exceptions.RayTaskError``: its ``.cause`` /
    ``as_instanceof_cause()`` are checked too (nested, for a driver on Ray whose worker failed).
    ``None`` (no exception known) is retriable.
    """
    from rlhf_core.storage import is_storage_error

    if exc is None:
        return True
    bad = non_retriable_types()
    return not any(isinstance(e, bad) or is_storage_error(e) for e in _causes(exc))


def retry_unless_bad_input(_task: Any, _task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a failed stage unless its error is non-retriable.

    :func:`is_retriable` decides (input errors — ConfigError, DataError, FileNotFoundError,
    RemoteUnavailableError — and a full or read-only disk, also wrapped in a RayTaskError, are not
    retried). When the exception cannot be read the stage is retried.
    """
    exc = getattr(state, "data", None)
    if not isinstance(exc, BaseException):
        try:
            exc = state.result(raise_on_failure=False)
        except Exception:  # noqa: BLE001 - unreadable result: keep the retry policy
            return True
    return is_retriable(exc if isinstance(exc, BaseException) else None)

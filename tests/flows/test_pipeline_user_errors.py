"""``rlhf pipeline`` on a bad row: Prefect's flow engine logs the failure ("Encountered exception during
execution") through the ``prefect.flow_runs`` logger; :func:`flows.local_run.quiet_input_error_tracebacks` keeps
that line but drops its traceback for input and storage errors (a new user's trial: about 60 lines of Prefect
frames before the one ``error:`` line), while any other exception keeps its traceback. And a full ``$PREFECT_HOME``
disk is refused in one line before Prefect's ephemeral server starts."""
from __future__ import annotations

import logging

from rlhf_core.data import DataError


def _logged(exc: BaseException) -> str:
    """What a handler on ``prefect.flow_runs`` formats for Prefect's ``logger.exception(...)`` of ``exc``."""
    from flows.local_run import quiet_input_error_tracebacks

    quiet_input_error_tracebacks()
    quiet_input_error_tracebacks()  # idempotent: one filter
    logger = logging.getLogger("prefect.flow_runs")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        try:
            raise exc
        except Exception as caught:  # noqa: BLE001 - as Prefect's flow engine catches it
            logger.exception("Encountered exception during execution: %r", caught)
    finally:
        logger.removeHandler(handler)
    assert len(records) == 1
    return logging.Formatter("%(message)s").format(records[0])


def test_an_input_error_is_logged_without_its_traceback():
    text = _logged(DataError("train.parquet row 5: column 'reward_model.ground_truth' is empty"))
    assert text == ("Encountered exception during execution: DataError(\"train.parquet row 5: column "
                    "'reward_model.ground_truth' is empty\")")
    filters = logging.getLogger("prefect.flow_runs").filters
    assert sum(type(f).__name__ == "_InputErrorWithoutTraceback" for f in filters) == 1


def test_any_other_error_keeps_its_traceback():
    text = _logged(RuntimeError("a bug"))
    assert text.startswith("Encountered exception during execution: RuntimeError('a bug')\nTraceback (most recent")
    assert text.endswith("RuntimeError: a bug")


def test_the_ephemeral_server_is_not_started_on_a_full_prefect_home(tmp_path, monkeypatch):
    """A user's trial: RLHF_HOME on a full 600 KiB tmpfs made Prefect's server fail its SQLite migrations and
    retry for 2 min 12 s, a traceback each time. Now one StorageError line, and the server is not started."""
    import errno
    from types import SimpleNamespace

    import pytest

    from flows import local_run

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setattr(local_run, "get_current_settings", lambda: SimpleNamespace(api=SimpleNamespace(url=None)))
    monkeypatch.setattr(local_run, "free_bytes", lambda path: 4096)  # what the full tmpfs reported, about
    monkeypatch.setattr(local_run.interrupt, "start_server", lambda: pytest.fail("the server was started"))
    with pytest.raises(local_run.StorageError) as info:
        local_run.start_ephemeral_prefect()
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == (f"[Errno {errno.ENOSPC}] PREFECT_HOME={tmp_path / 'prefect'}: 4096 bytes free on its "
                               "disk; Prefect's ephemeral server needs 16 MiB there for its state database (about "
                               "6 MB after a flow run); free space or set RLHF_HOME to a folder on a roomier disk")

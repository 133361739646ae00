"""``rlhf pipeline`` on a bad row: Prefect's flow engine logs the failure ("Encountered exception during
execution") through the ``prefect.flow_runs`` logger; :func:`flows.local_run.quiet_input_error_tracebacks` keeps
that line but drops its traceback for input and storage errors (a new user's trial: about 60 lines of Prefect
frames before the one ``error:`` line), while any other exception keeps its traceback."""
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

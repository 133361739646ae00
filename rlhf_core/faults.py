"""A test-only fault hook: kill this process with SIGKILL at a named point of a PPO step (issue 12, "Faults").

Set ``RLHF_FAULT=<point>:<step>`` and ``RLHF_FAULT_MARKER=<file>`` in the environment of a run; the first process
that reaches ``<point>`` during global step ``<step>`` creates ``<file>`` (``O_CREAT | O_EXCL``, so exactly one
process of one run fires), writes ``<point>:<step> pid=<its pid>`` into it, and kills itself with ``SIGKILL`` —
no cleanup, no ``finally``, like the OOM killer or a lost node. A later attempt (the Prefect retry) finds the marker
and goes on, so the fault fires once per run. The points:

* ``generate`` — a training worker at the start of its rollout for step ``<step>`` (``generate_sequences``, not
  validation);
* ``update_actor`` — a training worker at the start of its actor update of step ``<step>``;
* ``checkpoint_write`` — a training worker in the middle of writing ``global_step_<step>/actor``: its sharded model
  is on disk, the optimizer, extra state and the rename into place are not, and the driver has not written the
  tracker ``latest_checkpointed_iteration.txt``;
* ``driver`` — the PPO driver between steps: step ``<step> - 1`` is complete (metrics logged, checkpoint written
  when due), step ``<step>`` has not started.
* ``validate`` — the PPO driver at the start of a validation at global step ``<step>`` (``Validator.validate``: in a
  segment, or in the ``validate`` task's validation-only run of the checkpoint of step ``<step>``).

Without ``RLHF_FAULT`` a call is one dictionary lookup. Tests: ``tests/reliability/test_faults.py``.
"""
from __future__ import annotations

import os
import re
import signal

FAULT_ENV = "RLHF_FAULT"
MARKER_ENV = "RLHF_FAULT_MARKER"
POINTS = ("generate", "update_actor", "checkpoint_write", "driver", "validate")
_STEP_DIR = re.compile(r"global_step_(\d+)$")


def fault_point(point: str, step: int | None = None, checkpoint_path: str | None = None) -> None:
    """Kill this process (SIGKILL) when ``$RLHF_FAULT`` names ``point`` at this global step and it has not fired yet.

    Args:
        point: one of :data:`POINTS`.
        step: the global step being worked on; or
        checkpoint_path: a folder inside ``global_step_<N>`` (e.g. ``.../global_step_3/actor``), whose ``N`` is
            the step (only looked at when the hook is armed).

    Raises:
        ValueError: ``$RLHF_FAULT`` is not ``<point>:<step>`` with a known point, or ``$RLHF_FAULT_MARKER`` is unset
            (raised only when ``$RLHF_FAULT`` is set).
    """
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    want_point, want_step = parse_fault(spec)
    if want_point != point:
        return
    if step is None and checkpoint_path is not None:
        match = _STEP_DIR.search(os.path.dirname(os.path.normpath(checkpoint_path)))
        step = int(match.group(1)) if match else None
    if step != want_step:
        return
    marker = os.environ.get(MARKER_ENV)
    if not marker:
        raise ValueError(f"${FAULT_ENV}={spec!r} needs ${MARKER_ENV}: the file that records that the fault fired")
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return  # fired in an earlier attempt of this run: let the retry go on
    os.write(fd, f"{point}:{step} pid={os.getpid()}\n".encode())
    os.fsync(fd)
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def parse_fault(spec: str) -> tuple[str, int]:
    """``"<point>:<step>"`` → ``(point, step)``.

    Raises:
        ValueError: naming ``$RLHF_FAULT`` and the value, when the point is unknown or the step is not an integer.
    """
    point, _, step = spec.partition(":")
    if point not in POINTS or not step.strip().isdigit():
        raise ValueError(f"${FAULT_ENV}={spec!r}: expected <point>:<step> with point one of {list(POINTS)}")
    return point, int(step)

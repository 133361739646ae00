"""Run model-written Python in a separate process with resource limits (the ``code_interpreter`` tool).

The child is ``python -I -c code`` (isolated mode: no ``PYTHON*`` variables, no user site) with an **empty
environment**, a fresh temporary working directory (removed afterwards), its own session (the whole process group
is killed at the wall-clock timeout), and ``setrlimit`` limits: CPU seconds (``RLIMIT_CPU``, SIGXCPU/SIGKILL past
it), address space (``RLIMIT_AS``, allocations fail with ``MemoryError``), bytes written per file
(``RLIMIT_FSIZE``: stdout goes to a file in a parent-owned directory, so a write past the limit fails with
``EFBIG``, which ends the program, and only the first ``max_output_bytes`` are returned).

This is NOT a security boundary: the child runs as the same user, can read any file that user can, open
sockets and spawn processes. For untrusted code use an isolated executor (a container or VM service such as
SandboxFusion: verl's ``reward_model.sandbox_fusion.url``) behind a tool class of your own.
"""
from __future__ import annotations

import asyncio
import os
import resource
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from rlhf_core.tools.base import BaseTool
from rlhf_core.tools.schemas import ToolResponse


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run.

    Attributes:
        cpu_seconds: CPU time (user + system), seconds.
        memory_mb: address space, MiB (the interpreter itself needs about 30).
        max_output_bytes: stdout + stderr bytes kept; a write past it fails (EFBIG).
        wall_seconds: wall-clock time before the process group is killed (catches ``sleep`` and blocked I/O).
    """

    cpu_seconds: int = 5
    memory_mb: int = 256
    max_output_bytes: int = 4096
    wall_seconds: float = 10.0


@dataclass(frozen=True)
class SandboxResult:
    """Outcome: ``output`` (first ``max_output_bytes`` of stdout+stderr, decoded), ``returncode`` (negative =
    killed by that signal), ``status`` one of ``ok``, ``error`` (non-zero exit), ``cpu_limit``, ``output_limit``,
    ``timeout``."""

    output: str
    returncode: int
    status: str


def _limit_child(limits: SandboxLimits):
    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
        memory = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_output_bytes + 1, limits.max_output_bytes + 1))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _status(returncode: int, timed_out: bool, output_full: bool) -> str:
    if timed_out:
        return "timeout"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "cpu_limit"
    if output_full:  # CPython ignores SIGXFSZ: the write fails with EFBIG and the program dies of the OSError
        return "output_limit"
    return "ok" if returncode == 0 else "error"


async def run_python(code: str, limits: SandboxLimits = SandboxLimits(), tmp_root: str | None = None) -> SandboxResult:
    """Run ``code`` under ``limits`` in a fresh directory under ``tmp_root`` (default: the system temp dir).

    Both the working directory and the output directory are removed before returning, whatever happened.
    """
    work_dir = tempfile.mkdtemp(prefix="rlhf_py_", dir=tmp_root)
    out_dir = tempfile.mkdtemp(prefix="rlhf_py_out_", dir=tmp_root)
    out_path = os.path.join(out_dir, "output")
    timed_out = False
    try:
        with open(out_path, "wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-c", code, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                cwd=work_dir, env={}, start_new_session=True, preexec_fn=_limit_child(limits))
            try:
                await asyncio.wait_for(proc.wait(), timeout=limits.wall_seconds)
            except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                if isinstance(exc, asyncio.CancelledError):
                    raise
        output_full = os.path.getsize(out_path) > limits.max_output_bytes
        with open(out_path, "rb") as out:
            output = out.read(limits.max_output_bytes).decode("utf-8", errors="replace")
        status = _status(proc.returncode, timed_out, output_full)
        return SandboxResult(output=output, returncode=proc.returncode, status=status)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
        shutil.rmtree(out_dir, ignore_errors=True)


class PythonTool(BaseTool):
    """``code_interpreter``: ``execute(id, {"code": "print(1+1)"})`` → the program's output (``"2\\n"``), with
    a note when a limit ended it. Limits come from the tool's ``config``: ``cpu_seconds``, ``memory_mb``
    (verl's ``memory_limit_mb`` is accepted too), ``max_output_bytes``, ``wall_seconds`` (verl's
    ``default_timeout``), each defaulting to :class:`SandboxLimits`; ``tmp_root`` sets where work dirs go."""

    def __init__(self, config: dict, tool_schema) -> None:
        super().__init__(config, tool_schema)
        # the tool YAML's own keys (verl's spellings mapped onto ours); the defaults live in SandboxLimits alone
        aliases = {"memory_limit_mb": "memory_mb", "default_timeout": "wall_seconds"}
        given = {aliases.get(k, k): v for k, v in self.config.items() if aliases.get(k, k) in SandboxLimits.__annotations__}
        types = {"cpu_seconds": int, "memory_mb": int, "max_output_bytes": int, "wall_seconds": float}
        self.limits = SandboxLimits(**{k: types[k](v) for k, v in given.items()})
        self.tmp_root = self.config["tmp_root"] if "tmp_root" in self.config else None

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ValueError("code_interpreter needs a non-empty 'code' string")
        result = await run_python(code, self.limits, self.tmp_root)
        notes = {"cpu_limit": f"[killed: CPU time over {self.limits.cpu_seconds}s]",
                 "output_limit": f"[killed: output over {self.limits.max_output_bytes} bytes]",
                 "timeout": f"[killed: wall time over {self.limits.wall_seconds}s]",
                 "error": f"[exit code {result.returncode}]"}
        text = result.output + (("\n" if result.output else "") + notes[result.status] if result.status in notes else "")
        return ToolResponse(text=text), 0.0, {"status": result.status}

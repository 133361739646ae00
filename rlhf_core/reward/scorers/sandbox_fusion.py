"""Code rewards run in a Sandbox Fusion service (verl 0.9 ``reward.sandbox_fusion``; the service:
https://github.com/bytedance/SandboxFusion, its ``/run_code`` endpoint).

verl's default scorer sends the ``codecontests``/``apps``/``codeforces``/``taco`` data sources to the sandbox when
``reward.sandbox_fusion.url`` is set: the response's code (its last fenced block) is run once per test case, with
the case's input on stdin, and the score is the fraction of the first 10 cases whose stdout equals the expected
output (trailing newlines ignored). Each run is one ``POST`` of ``{code, stdin, language, run_timeout,
compile_timeout, memory_limit_MB, files, fetch_files}``; ``memory_limit_MB`` is ``sandbox_fusion.memory_limit_mb``.
At most ``sandbox_fusion.max_concurrent`` requests are in flight at once from one process (a semaphore shared by
all scoring threads of the process; verl shares one across its reward processes through a multiprocessing
manager, here each reward process, e.g. each of the ``prime`` manager's, has its own).

Import-light (stdlib only): reward worker processes import it.
"""
from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")
CASES_SCORED = 10  # verl's continuous score: the pass rate of the first 10 cases
RUN_TIMEOUT_S = 10
COMPILE_TIMEOUT_S = 10
HTTP_MARGIN_S = 10  # the HTTP timeout is compile + run + this

_SEMAPHORES: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_SEMAPHORES_LOCK = threading.Lock()


@dataclass(frozen=True)
class SandboxFusion:
    """Where and how code rewards run (``reward_model.sandbox_fusion`` / ``sandbox_fusion``). Picklable: a reward
    process builds its own semaphore (:meth:`semaphore`) from ``max_concurrent``.

    Attributes: url (the ``run_code`` endpoint), max_concurrent (requests in flight per process, >= 1),
    memory_limit_mb (sent as ``memory_limit_MB`` with every run)."""

    url: str
    max_concurrent: int = 64
    memory_limit_mb: int = 1024

    def semaphore(self) -> threading.BoundedSemaphore:
        """The process-wide semaphore of this url and bound (one per process, shared by all threads)."""
        with _SEMAPHORES_LOCK:
            return _SEMAPHORES.setdefault((self.url, self.max_concurrent),
                                          threading.BoundedSemaphore(self.max_concurrent))


def sandbox_from_config(config: Any) -> SandboxFusion | None:
    """The sandbox a ppo_trainer config names, or None. verl 0.9.1 moves a top-level ``sandbox_fusion`` section
    with any key set over ``reward.sandbox_fusion`` (here ``reward_model.sandbox_fusion``); its null keys then
    take verl's defaults (64 requests, 1024 MB).

    Raises:
        ValueError: ``max_concurrent`` or ``memory_limit_mb`` below 1 (naming the key)."""
    top = config.sandbox_fusion  # verl 0.9.1's top-level section (ppo_trainer.yaml declares it)
    section, name = config.reward_model.sandbox_fusion, "reward_model.sandbox_fusion"
    if top is not None and any(top[k] is not None for k in ("url", "max_concurrent", "memory_limit_mb")):
        section, name = top, "sandbox_fusion"
    if not section.url:
        return None
    max_concurrent = 64 if section.max_concurrent is None else int(section.max_concurrent)
    memory = 1024 if section.memory_limit_mb is None else int(section.memory_limit_mb)
    for key, value in (("max_concurrent", max_concurrent), ("memory_limit_mb", memory)):
        if value < 1:
            raise ValueError(f"{name}.{key}={value} must be >= 1")
    return SandboxFusion(str(section.url), max_concurrent, memory)


def extract_code(completion: str) -> str | None:
    """The code of the response: after its last "```python" up to the next fence, else the first fenced block
    (a first line that is one word, a language name, dropped); None without a fence."""
    if "```python" in completion:
        return completion.split("```python")[-1].split("```")[0]
    parts = completion.split("```")
    if len(parts) < 2:
        return None
    code = parts[1]
    head, _, rest = code.partition("\n")
    return rest if head.strip().isalpha() else code


def run_code(sandbox: SandboxFusion, code: str, stdin: str | None) -> dict:
    """One ``POST`` to the sandbox, holding a slot of :meth:`SandboxFusion.semaphore`. Returns the service's JSON
    (``{"status": "Success"|"Failed"|"SandboxError", "run_result": {"status", "stdout", "return_code"}, ...}``),
    or ``{"status": "ApiError", "message": ...}`` when the request fails (the case then scores as failed)."""
    body = json.dumps({"code": code, "stdin": stdin, "language": "python", "run_timeout": RUN_TIMEOUT_S,
                       "compile_timeout": COMPILE_TIMEOUT_S, "memory_limit_MB": sandbox.memory_limit_mb,
                       "files": {}, "fetch_files": []}).encode()
    request = urllib.request.Request(sandbox.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    with sandbox.semaphore():
        try:
            with urllib.request.urlopen(request, timeout=RUN_TIMEOUT_S + COMPILE_TIMEOUT_S + HTTP_MARGIN_S) as resp:
                return json.loads(resp.read().decode())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if sandbox.url not in _UNREACHED:  # once per URL and process: a wrong URL must not pass unnoticed
                _UNREACHED.add(sandbox.url)
                logger.warning("sandbox_fusion: %s did not answer (%s); its cases score as failed (verl's "
                               "behaviour) and each result counts them in api_errors", sandbox.url, exc)
            return {"status": "ApiError", "message": f"{sandbox.url}: {exc}"}


_UNREACHED: set[str] = set()  # sandbox URLs whose failure was logged in this process


def case_passed(reply: dict, expected: Any) -> bool:
    """Whether a run passed: the service says ``Success``, the run ``Finished`` and its stdout equals ``expected``
    (trailing newlines ignored; ``None`` expected: an assert case, passing when it ran)."""
    run = reply.get("run_result") or {}
    if reply.get("status") != "Success" or run.get("status") != "Finished":
        return False
    return expected is None or str(run.get("stdout") or "").rstrip("\n") == str(expected).rstrip("\n")


def compute_score(sandbox: SandboxFusion, completion: str, test_cases: Any) -> dict:
    """Score a code response against ``test_cases`` (a dict or its JSON: ``inputs`` and ``outputs`` lists, or
    ``assert_case``: code appended to the response's, one run each).

    Returns:
        ``{"score": passed / cases among the first 10, "passed": that count, "cases": cases run, "api_errors":
        cases the service did not answer (scored as failed)}``; score 0 when the response has no fenced code.

    Raises:
        ValueError: test cases that are not JSON, lack inputs/outputs, differ in length, or call a function by
        name (``fn_name``: not supported here), naming the problem."""
    cases = json.loads(test_cases) if isinstance(test_cases, (str, bytes)) else dict(test_cases)
    if cases.get("fn_name"):
        raise ValueError(f"sandbox_fusion: test cases with fn_name={cases['fn_name']!r} (call-based) are not "
                         "supported; give stdin/stdout cases (inputs/outputs) or assert_case")
    asserts = cases.get("assert_case")
    if isinstance(asserts, list):
        inputs, outputs = cases.get("inputs", [""] * len(asserts)), cases.get("outputs", [None] * len(asserts))
    elif "inputs" in cases and "outputs" in cases:
        inputs, outputs, asserts = cases["inputs"], cases["outputs"], [""] * len(cases["inputs"])
    else:
        raise ValueError(f"sandbox_fusion: test cases need inputs and outputs (or assert_case); got keys "
                         f"{sorted(cases)}")
    if not len(inputs) == len(outputs) == len(asserts):
        raise ValueError(f"sandbox_fusion: {len(inputs)} inputs, {len(outputs)} outputs, {len(asserts)} assert "
                         "cases: they must match")
    code = extract_code(completion)
    if code is None or not inputs:
        return {"score": 0.0, "passed": 0, "cases": 0, "api_errors": 0}
    with ThreadPoolExecutor(max_workers=min(len(inputs), sandbox.max_concurrent)) as pool:  # the semaphore bounds the requests in flight
        replies = list(pool.map(lambda i: run_code(sandbox, code + "\n\n" + asserts[i],
                                                    None if inputs[i] is None else str(inputs[i])),
                                range(len(inputs))))
    ok = [case_passed(r, o) for r, o in zip(replies, outputs)]
    scored = ok[:CASES_SCORED]
    return {"score": sum(scored) / len(scored), "passed": sum(scored), "cases": len(ok),
            "api_errors": sum(r.get("status") == "ApiError" for r in replies)}

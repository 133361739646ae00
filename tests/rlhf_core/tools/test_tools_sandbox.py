"""The Python tool's process sandbox: empty environment, CPU/memory/output/wall limits, nothing left behind."""
from __future__ import annotations

import asyncio
import json
import os

from rlhf_core.tools.sandbox import PythonTool, SandboxLimits, run_python
from rlhf_core.tools.schemas import OpenAIFunctionToolSchema

SCHEMA = OpenAIFunctionToolSchema.model_validate({
    "type": "function", "function": {"name": "code_interpreter", "description": "run python",
                                     "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                    "required": ["code"]}}})


def test_runs_code_and_returns_output(tmp_path):
    result = asyncio.run(run_python("print(6 * 7)", tmp_root=str(tmp_path)))
    assert (result.output, result.returncode, result.status) == ("42\n", 0, "ok")


def test_cannot_read_parent_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_SECRET_TOKEN", "s3cr3t")
    code = "import json, os; print(json.dumps(sorted(os.environ))); print(os.environ.get('RLHF_SECRET_TOKEN'))"
    result = asyncio.run(run_python(code, tmp_root=str(tmp_path)))
    # the child's environment is empty; CPython itself may add LC_CTYPE when the C locale is coerced
    names = json.loads(result.output.splitlines()[0])
    assert set(names) <= {"LC_CTYPE"} and result.output.splitlines()[1] == "None"


def test_killed_past_cpu_time(tmp_path):
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=20)
    result = asyncio.run(run_python("while True: pass", limits, tmp_root=str(tmp_path)))
    assert result.status == "cpu_limit" and result.returncode < 0  # SIGXCPU at the 1 s soft limit


def test_memory_limit_stops_large_allocation(tmp_path):
    limits = SandboxLimits(memory_mb=128)
    code = "x = bytearray(512 * 1024 * 1024)\nprint('allocated')"
    result = asyncio.run(run_python(code, limits, tmp_root=str(tmp_path)))
    assert result.status == "error" and "MemoryError" in result.output and "allocated" not in result.output


def test_output_limit_and_wall_timeout(tmp_path):
    limits = SandboxLimits(max_output_bytes=100, wall_seconds=1.0)
    flood = asyncio.run(run_python("import sys\nwhile True: sys.stdout.write('y' * 50); sys.stdout.flush()",
                                   limits, tmp_root=str(tmp_path)))
    assert flood.status == "output_limit" and flood.output == "y" * 100
    sleeper = asyncio.run(run_python("import time; time.sleep(60)", limits, tmp_root=str(tmp_path)))
    assert sleeper.status == "timeout"  # sleeping uses no CPU: only the wall clock catches it


def test_leaves_nothing_behind(tmp_path):
    code = ("import os, subprocess\nopen('left.txt', 'w').write('x')\nos.mkdir('d')\n"
            "print(os.getcwd())")
    result = asyncio.run(run_python(code, tmp_root=str(tmp_path)))
    work_dir = result.output.strip()
    assert work_dir.startswith(str(tmp_path)) and not os.path.exists(work_dir)
    assert list(tmp_path.iterdir()) == []  # work dir and output dir both removed


def test_python_tool_reports_limits(tmp_path):
    tool = PythonTool({"type": "native", "cpu_seconds": 1, "tmp_root": str(tmp_path)}, SCHEMA)
    ok = asyncio.run(tool.execute("i", {"code": "print(sum(range(10)))"}))
    assert ok[0].text == "45\n" and ok[2] == {"status": "ok"}
    spin = asyncio.run(tool.execute("i", {"code": "while True: pass"}))
    assert spin[0].text == "[killed: CPU time over 1s]"
    failed = asyncio.run(tool.execute("i", {"code": "raise SystemExit(3)"}))
    assert failed[0].text == "[exit code 3]"


def test_verl_sandbox_fusion_tool_is_never_the_local_sandbox(tmp_path):
    """A config asking for verl's remote executor must not silently run model code on this machine."""
    import importlib.util

    import pytest

    from rlhf_core.tools.config import VERL_CLASS_ALIASES, ToolConfigError, load_tools

    path = tmp_path / "tools.yaml"
    path.write_text(json.dumps({"tools": [{
        "class_name": "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
        "config": {"type": "native", "sandbox_fusion_url": "http://127.0.0.1:1/run_code"},
        "tool_schema": SCHEMA.model_dump()}]}))
    assert not any("SandboxFusion" in k or "sandbox" in v for k, v in VERL_CLASS_ALIASES.items())
    if importlib.util.find_spec("verl") is None:  # the project never installs verl; then it fails at start
        with pytest.raises(ToolConfigError, match=r"tools.yaml, tool #0 \('code_interpreter'\).*cannot be imported"):
            load_tools(path)

"""Security defaults (issue #12): servers on 127.0.0.1, trust_remote_code off and honoured, secrets redacted
from every sink, user code loaded only from explicit files and logged.

Real services where a sink is concerned: MLflow (SQLite store), DuckDB, a Prefect test server, an ``mlflow
server`` subprocess for the listening-address check. No mocks of them.
"""
from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from omegaconf import OmegaConf

from conftest_services import *  # noqa: F401,F403 - rlhf_env, free_port (prefect_harness: tests/conftest.py)
from rlhf_core.config import load_config
from rlhf_core.config.schema import flatten

REPO = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------------------------------------------
# 1. servers bind 127.0.0.1 unless told otherwise


def test_server_command_lines_and_ray_kwargs_bind_loopback(monkeypatch):
    from infra.servers import mlflow_server_command, prefect_server_command, ray_head_command
    from rlhf_core.distributed.ray_init import local_ray_init_kwargs

    monkeypatch.delenv("RLHF_BIND_HOST", raising=False)

    def host_of(cmd: list[str], flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert host_of(prefect_server_command(4200), "--host") == "127.0.0.1"
    assert host_of(mlflow_server_command("sqlite:///x.db", 5000), "--host") == "127.0.0.1"
    head = ray_head_command()
    assert host_of(head, "--dashboard-host") == host_of(head, "--node-ip-address") == "127.0.0.1"
    assert head[:2] == ["env", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0"]  # else Ray swaps 127.0.0.1 for the machine's IP
    kwargs = local_ray_init_kwargs(2)
    assert kwargs["include_dashboard"] is False and kwargs["dashboard_host"] == "127.0.0.1"
    assert kwargs["address"] == "local"  # a new instance, never a `ray start` cluster found in /tmp/ray
    assert kwargs["_node_ip_address"] == "127.0.0.1"  # Ray binds its gRPC/agent ports there (test_network_exposure)
    # told otherwise: the setting reaches every builder
    monkeypatch.setenv("RLHF_BIND_HOST", "0.0.0.0")
    assert host_of(prefect_server_command(), "--host") == "0.0.0.0"
    assert host_of(mlflow_server_command("sqlite:///x.db"), "--host") == "0.0.0.0"
    assert host_of(ray_head_command(), "--dashboard-host") == "0.0.0.0"
    assert ray_head_command()[:2] == ["ray", "start"] and "--node-ip-address" not in ray_head_command()
    assert local_ray_init_kwargs()["dashboard_host"] == "0.0.0.0"
    assert "_node_ip_address" not in local_ray_init_kwargs()  # a wildcard leaves Ray's default, the machine's address
    assert host_of(mlflow_server_command("sqlite:///x.db", host="10.1.2.3"), "--host") == "10.1.2.3"


def test_no_source_binds_all_interfaces():
    """No server start in our code, Makefile or README names 0.0.0.0 / ``::`` as its host."""
    texts = [p for d in ("rlhf_core", "infra", "flows", "tasks", "rlhf_cli") for p in (REPO / d).rglob("*.py")]
    texts += [REPO / "Makefile", REPO / "README.md", REPO / "prefect.yaml"]
    bad = [f"{p.relative_to(REPO)}:{i}" for p in texts for i, line in enumerate(p.read_text().splitlines(), 1)
           if ("0.0.0.0" in line or "--host ::" in line) and "RLHF_BIND_HOST" not in line]
    assert bad == []


def _calls(text: str, name: str) -> list[str]:
    """Each ``name(...)`` in ``text`` (code or a script in a string), up to its balanced closing parenthesis."""
    out, start = [], text.find(name + "(")
    while start >= 0:
        depth, k = 0, start + len(name)
        for k in range(start + len(name), len(text)):
            depth += {"(": 1, ")": -1}.get(text[k], 0)
            if depth == 0:
                break
        out.append(text[start:k + 1])
        start = text.find(name + "(", k)
    return out


def test_no_process_group_in_tests_or_benchmarks_rendezvouses_on_all_interfaces():
    """``init_process_group`` without a ``store`` (env:// or tcp://) serves its TCPStore on every interface, whatever
    MASTER_ADDR says (seen with ``ss -ltnp`` as ``*:PORT`` during test runs of a new-user trial):
    ``rendezvous_store`` (rlhf_core/distributed/worker_group.py) binds 127.0.0.1 itself. Every call passes one."""
    files = [p for d in ("rlhf_core", "tests", "bench") for p in (REPO / d).rglob("*.py") if p.name != "test_security.py"]
    calls = [(p, c) for p in files for c in _calls(p.read_text(), "init_process_group")]
    assert len(calls) >= 6, calls  # worker_group.py, 3 test helpers, 2 benchmarks
    bad = [f"{p.relative_to(REPO)}: {c[:100]}" for p, c in calls if "store=" not in c]
    assert bad == []


def _listening(pids: set[int]) -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.pid in pids}


def _non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_mlflow_server_listens_on_loopback_only(tmp_path, free_port, monkeypatch):
    from infra.servers import mlflow_server_command

    monkeypatch.delenv("RLHF_BIND_HOST", raising=False)
    cmd = mlflow_server_command(f"sqlite:///{tmp_path / 'mlflow.db'}", free_port,
                                artifacts_destination=str(tmp_path / "artifacts"))
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    try:
        deadline, found = time.monotonic() + 120, set()
        while time.monotonic() < deadline and proc.poll() is None:
            tree = {proc.pid} | {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
            found = _listening(tree)
            if any(port == free_port for _, port in found):
                break
            time.sleep(0.5)
        assert any(port == free_port for _, port in found), (tmp_path / "server.log").read_text()[-3000:]
        assert {ip for ip, _ in found} == {"127.0.0.1"}, found  # every socket of the server tree: loopback only
        with socket.create_connection(("127.0.0.1", free_port), timeout=5):
            pass
        other = _non_loopback_ipv4()
        if other is not None:  # the machine's other address: nothing answers there
            with pytest.raises(OSError):
                socket.create_connection((other, free_port), timeout=2).close()
    finally:
        os.killpg(proc.pid, 15)  # the server and its uvicorn workers, only those (own session)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=30)
        log.close()


# --------------------------------------------------------------------------------------------------------------
# 2. trust_remote_code: off by default, passed at every from_pretrained, honoured for model and tokenizer

TRUST_KEYS = {
    "ppo_trainer": ["actor_rollout_ref.model.trust_remote_code", "data.trust_remote_code",
                    "critic.model.trust_remote_code", "reward_model.model.trust_remote_code"],
    "sft_trainer": ["model.trust_remote_code"],
}


@pytest.mark.parametrize("config_name", sorted(TRUST_KEYS))
def test_trust_remote_code_defaults_to_false_for_models(config_name):
    resolved = flatten(load_config(config_name), resolve=True)
    found = sorted(k for k in resolved if k.endswith("trust_remote_code"))
    assert found == sorted(TRUST_KEYS[config_name])  # no other trust key hides somewhere
    # data.trust_remote_code keeps the user's reference default (True, verl's): it governs the driver's tokenizer
    # only. Every model key is False.
    expected = {k: k == "data.trust_remote_code" for k in found}
    assert {k: resolved[k] for k in found} == expected


# GenerationConfig is a JSON of sampling settings: transformers never runs a folder's code for it. PeftModel (a
# model.lora_adapter_path) reads adapter_config.json and the adapter weights (safetensors, or torch.load with
# weights_only=True in peft's torch_load): it runs no code from the folder and takes no trust_remote_code.
NO_CODE_LOADERS = {"GenerationConfig", "PeftModel"}


def test_every_from_pretrained_in_rlhf_core_passes_trust_remote_code():
    missing, literal_true = [], []
    for path in sorted((REPO / "rlhf_core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("from_pretrained", "from_config")):
                continue
            owner = node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if owner_name in NO_CODE_LOADERS or (node.func.attr == "from_config" and not owner_name.startswith("Auto")):
                continue
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            kw = {k.arg: k.value for k in node.keywords}
            if "trust_remote_code" not in kw:
                missing.append(where)
            elif isinstance(kw["trust_remote_code"], ast.Constant) and kw["trust_remote_code"].value is True:
                literal_true.append(where)
    assert missing == [] and literal_true == []


PROBE_CONFIG = '''
import os
from transformers import Qwen2Config
with open(os.environ["RLHF_PROBE_MARKER"], "a") as fh:
    fh.write("config code ran\\n")

class ProbeConfig(Qwen2Config):
    model_type = "rlhf_probe"
'''
PROBE_MODEL = '''
from transformers import Qwen2ForCausalLM
from .configuration_probe import ProbeConfig

class ProbeForCausalLM(Qwen2ForCausalLM):
    config_class = ProbeConfig
'''
PROBE_TOKENIZER = '''
import os
from transformers import PreTrainedTokenizerFast
with open(os.environ["RLHF_PROBE_MARKER"], "a") as fh:
    fh.write("tokenizer code ran\\n")

class ProbeTokenizer(PreTrainedTokenizerFast):
    pass
'''


@pytest.fixture
def remote_code_model(tiny_model_dir, tmp_path, monkeypatch):
    """Two copies of the tiny model: one whose config and model classes are code in the folder (auto_map), one
    whose tokenizer class is; that code appends a line to $RLHF_PROBE_MARKER when it runs. Fresh folder names
    per test (transformers caches a folder's code module by name)."""
    folder, tok_folder = (tmp_path / f"probe_{what}_{uuid.uuid4().hex[:8]}" for what in ("model", "tok"))
    shutil.copytree(tiny_model_dir, folder)
    shutil.copytree(tiny_model_dir, tok_folder)
    (folder / "configuration_probe.py").write_text(PROBE_CONFIG)
    (folder / "modeling_probe.py").write_text(PROBE_MODEL)
    (tok_folder / "tokenization_probe.py").write_text(PROBE_TOKENIZER)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="rlhf_probe", architectures=["ProbeForCausalLM"],
               auto_map={"AutoConfig": "configuration_probe.ProbeConfig",
                         "AutoModelForCausalLM": "modeling_probe.ProbeForCausalLM"})
    (folder / "config.json").write_text(json.dumps(cfg))
    tok = json.loads((tok_folder / "tokenizer_config.json").read_text())
    tok.pop("tokenizer_class", None)
    tok["auto_map"] = {"AutoTokenizer": [None, "tokenization_probe.ProbeTokenizer"]}
    (tok_folder / "tokenizer_config.json").write_text(json.dumps(tok))
    marker = tmp_path / "marker.txt"
    monkeypatch.setenv("RLHF_PROBE_MARKER", str(marker))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return folder, tok_folder, marker


def test_trust_remote_code_is_honoured_for_model_and_tokenizer(remote_code_model):
    from rlhf_core.trainer.main_ppo import load_driver_tokenizer
    from rlhf_core.workers.rollout.engine_copy import build_engine_copy

    folder, tok_folder, marker = remote_code_model
    paths = [f"actor_rollout_ref.model.path={folder}", f"data.tokenizer={tok_folder}"]
    # data.trust_remote_code=False (the reference's default is True, kept): the folder's code never runs (the
    # model refuses to load at the model key's default; the tokenizer falls back to a built-in)
    cfg = load_config("ppo_trainer", [*paths, "data.trust_remote_code=False"])
    arm = cfg.actor_rollout_ref
    with pytest.raises(ValueError, match="trust_remote_code"):
        build_engine_copy(arm.model, arm.actor.fsdp_config)
    assert type(load_driver_tokenizer(cfg)).__name__ != "ProbeTokenizer"
    assert not marker.exists()
    # asked for, per key: the tokenizer's code runs with data.trust_remote_code, the model's with the model key
    cfg = load_config("ppo_trainer", [*paths, "data.trust_remote_code=True"])
    assert type(load_driver_tokenizer(cfg)).__name__ == "ProbeTokenizer"
    assert marker.read_text() == "tokenizer code ran\n"
    cfg = load_config("ppo_trainer", [*paths, "actor_rollout_ref.model.trust_remote_code=True"])
    arm = cfg.actor_rollout_ref
    model = build_engine_copy(arm.model, arm.actor.fsdp_config)
    assert type(model).__name__ == "ProbeForCausalLM"
    lines = marker.read_text().splitlines()  # transformers imports the config module once or twice
    assert lines[0] == "tokenizer code ran" and set(lines[1:]) == {"config code ran"}


# --------------------------------------------------------------------------------------------------------------
# 4. user code: explicit files only, resolved to an absolute path, logged with its sha256

REWARD_FILE = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.25\n"
DATASET_FILE = "from torch.utils.data import Dataset\n\nclass Rows(Dataset):\n    def __len__(self):\n        return 0\n"


def _load_lines(caplog, key: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rlhf_core.user_code" and r.getMessage().startswith(key)]


def test_custom_reward_function_relative_path_is_resolved_and_logged(tmp_path, monkeypatch, caplog):
    from rlhf_core.reward.custom import load_custom_reward_function

    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "score.py").write_text(REWARD_FILE)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="rlhf_core.user_code"):
        fn = load_custom_reward_function("rewards/score.py")
    absolute = str(tmp_path / "rewards" / "score.py")
    assert fn.path == absolute and fn("gsm8k", "x", "y") == 0.25
    digest = hashlib.sha256(REWARD_FILE.encode()).hexdigest()
    assert _load_lines(caplog, "custom_reward_function.path") == [
        f"custom_reward_function.path: loading {absolute} (sha256 {digest})"]


def test_custom_cls_relative_path_is_resolved_and_logged(tmp_path, monkeypatch, caplog):
    from rlhf_core.data.custom import load_custom_cls

    (tmp_path / "rows.py").write_text(DATASET_FILE)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="rlhf_core.user_code"):
        cls = load_custom_cls(OmegaConf.create({"path": "rows.py", "name": "Rows"}))
    assert cls.__name__ == "Rows" and len(cls()) == 0
    digest = hashlib.sha256(DATASET_FILE.encode()).hexdigest()
    assert _load_lines(caplog, "data.custom_cls.path") == [
        f"data.custom_cls.path: loading {tmp_path / 'rows.py'} (sha256 {digest})"]


@pytest.mark.parametrize("name", ["json", "rlhf_core.reward.scorers", "os.path"])
def test_module_names_are_not_looked_up(name, tmp_path, monkeypatch):
    """A bare or dotted module name that Python could import is refused: only a file at that path loads."""
    from rlhf_core.data.custom import load_custom_cls
    from rlhf_core.reward.custom import load_custom_reward_function

    monkeypatch.chdir(tmp_path)  # no file of that name here
    with pytest.raises(FileNotFoundError, match=r"custom_reward_function\.path: no such file .*module names are not"):
        load_custom_reward_function(name)
    with pytest.raises(FileNotFoundError, match=r"data\.custom_cls\.path: no such file"):
        load_custom_cls(OmegaConf.create({"path": name, "name": "Anything"}))
    (tmp_path / name).write_text(REWARD_FILE)  # a file by that name (no .py): not importable as source
    with pytest.raises(ImportError, match="not a Python source file"):
        load_custom_reward_function(name)


def test_loaded_bytes_are_the_logged_bytes(tmp_path, caplog):
    """Two versions of one file path load as logged: the sha256 of each load is the hash of what ran."""
    from rlhf_core.user_code import exec_user_file

    path = tmp_path / "v.py"
    digests = []
    with caplog.at_level(logging.INFO, logger="rlhf_core.user_code"):
        for version in (1, 2):
            source = f"VERSION = {version}\n"
            path.write_text(source)
            module = exec_user_file(str(path), "probe.path", f"rlhf_probe_{uuid.uuid4().hex}")
            assert module.VERSION == version
            digests.append(hashlib.sha256(source.encode()).hexdigest())
    assert _load_lines(caplog, "probe.path") == [f"probe.path: loading {path} (sha256 {d})" for d in digests]
    assert str(tmp_path) not in sys.path  # the file's folder was not put on the module search path

"""Proof of effect, not of name: every key marked "supported" is read, by full path, in a real run.

Each entry point runs once on the tiny model with ``RLHF_CONFIG_READS`` set (rlhf_core/config/reads.py): PPO
with GRPO and with GAE (one Ray instance started here, so its workers record too), SFT and offline evaluation.
A key whose docs/CONFIG_KEYS.md status is "supported" must be read by one of these runs, or be listed in
``EFFECT_TESTS`` with the test that shows its effect (keys only read on paths these short runs do not take:
LoRA, a reward model, the KL controller...). The test named there must exist.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pandas as pd
import pytest

from rlhf_core.config import load_config, reads
from rlhf_core.config.keys_doc import status_of, yaml_keys
from rlhf_core.config.loader import CONFIG_NAMES

from test_ppo_e2e import gsm8k_parquet, ppo_config  # noqa: F401 - gsm8k_parquet is a fixture
from test_sft_e2e import sft_config, sft_files  # noqa: F401 - sft_files is a fixture

ROOT = Path(__file__).resolve().parents[2]
_A = "actor_rollout_ref."
_LORA = "tests/unit/test_workers_lora.py::test_lora_actor_update_sync_and_merge"
_LORA_CRITIC = "tests/unit/test_workers_lora.py::test_lora_critic_trains_head_and_merges"
_RM = "tests/unit/test_workers_reward_model.py"
# Supported keys read only on paths the four short runs do not take: config -> {path: "file::test" showing it}.
EFFECT_TESTS: dict[str, dict[str, str]] = {
    "ppo_trainer": {
        _A + "model.lora_alpha": _LORA, _A + "model.target_modules": _LORA,
        "critic.model.lora_alpha": _LORA_CRITIC, "critic.model.target_modules": _LORA_CRITIC,
    },
    "sft_trainer": {},
    "evaluation": {},
}


def _supported(name: str) -> list[str]:
    return [p for p, _, _ in yaml_keys(name) if status_of(name, p).startswith("supported")]


def _test_exists(ref: str) -> bool:
    path, _, name = ref.partition("::")
    file = ROOT / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text(encoding="utf-8"))
    return not name or any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def _eval_parquet(path: Path) -> str:
    pd.DataFrame({
        "data_source": ["openai/gsm8k"], "prompt": [[{"role": "user", "content": "q"}]],
        "responses": [["#### 72", "#### 1"]], "reward_model": [{"style": "rule", "ground_truth": "72"}],
    }).to_parquet(path)
    return str(path)


@pytest.fixture(scope="module")
def recorded(tiny_model_dir, gsm8k_parquet, sft_files, tmp_path_factory):  # noqa: F811
    """{config name: every full path read by its runs}."""
    import ray

    from rlhf_core.trainer.evaluation import run_evaluation
    from rlhf_core.trainer.main_ppo import run_ppo
    from rlhf_core.trainer.sft_trainer import run_sft

    out = tmp_path_factory.mktemp("config_reads")
    files = {name: str(out / f"{name}.reads") for name in CONFIG_NAMES}
    saved = {k: os.environ.get(k) for k in (reads.ENV, "RLHF_METRICS_FILE")}
    os.environ.pop("RLHF_METRICS_FILE", None)
    if ray.is_initialized():  # an instance started without the variable would start workers that do not record
        ray.shutdown()
    try:
        os.environ[reads.ENV] = files["ppo_trainer"]
        reads.install()
        for adv in ("grpo", "gae"):
            run_ppo(ppo_config(tiny_model_dir, gsm8k_parquet, out / adv, adv, "trainer.total_training_steps=1",
                               "trainer.test_freq=1", "trainer.save_freq=1"))
        ray.shutdown()
        os.environ[reads.ENV] = files["sft_trainer"]
        run_sft(sft_config(tiny_model_dir, sft_files, out / "sft", "trainer.total_training_steps=1",
                           "trainer.save_freq=1", "trainer.test_freq=1"))
        os.environ[reads.ENV] = files["evaluation"]
        run_evaluation(load_config("evaluation", [f"data.path={_eval_parquet(out / 'resp.parquet')}",
                                                  f"output.samples_dir={out / 'eval'}"]))
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    return {name: reads.read_paths(path) for name, path in files.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_every_supported_key_is_read_by_a_run_or_has_an_effect_test(recorded, name):
    covered = EFFECT_TESTS[name]
    unread = [p for p in _supported(name) if p not in recorded[name] and p not in covered]
    assert unread == [], (f"{name}.yaml keys marked 'supported' that no run reads and no effect test covers: {unread}. "
                          f"Make a run read them, name the test showing their effect in EFFECT_TESTS, or give them an "
                          f"honest status in rlhf_core/config/schema.py EFFECT and regenerate docs/CONFIG_KEYS.md")
    stale = [p for p in covered if p in recorded[name]]
    assert stale == [], f"read by a run now, drop from EFFECT_TESTS: {stale}"


def test_effect_tests_name_supported_keys_and_existing_tests():
    for name, entries in EFFECT_TESTS.items():
        for path, ref in entries.items():
            assert path in _supported(name), f"{name}: {path} is not a supported key"
            assert _test_exists(ref), f"{name}: {path}: no test {ref}"


def test_recording_sees_attribute_and_item_reads_only(tmp_path, monkeypatch):
    # unit check of the recorder, no run: reads by name count; to_container / select / `in` do not
    from omegaconf import OmegaConf

    target = tmp_path / "reads.txt"
    monkeypatch.setenv(reads.ENV, str(target))
    reads.install()
    cfg = load_config("evaluation")
    OmegaConf.to_container(cfg, resolve=True)
    OmegaConf.select(cfg, "data.path")
    assert "prompt_key" in cfg.data
    assert not {p for p in reads.read_paths(str(target)) if "." in p}  # only top-level section names at most
    cfg.data.path, cfg.output["samples_dir"]
    assert {"data.path", "output.samples_dir"} <= reads.read_paths(str(target))

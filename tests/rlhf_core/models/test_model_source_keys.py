"""verl 0.9's ``actor_rollout_ref.model`` keys that say where the pieces come from: ``tokenizer_path``,
``hf_config_path``, ``custom_chat_template``, and LoRA's ``exclude_modules`` (peft ``LoraConfig.exclude_modules``)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.fixtures.config_fixtures import typed_config  # noqa: E402
from tests.rlhf_core.workers.test_workers_fsdp import ppo_config  # noqa: E402

from rlhf_core.models.lora import apply_lora  # noqa: E402

TEMPLATE = "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}"
M = "actor_rollout_ref.model"


@pytest.fixture(scope="module")
def split_dirs(tiny_model_dir, tmp_path_factory):
    """(tokenizer-only folder, config-only folder whose config.json has rms_norm_eps=0.25) beside the model."""
    root = tmp_path_factory.mktemp("split")
    tok, conf = root / "tok", root / "conf"
    tok.mkdir()
    conf.mkdir()
    for name in os.listdir(tiny_model_dir):
        if name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(os.path.join(tiny_model_dir, name), tok / name)
    cfg = json.loads(Path(tiny_model_dir, "config.json").read_text())
    cfg["rms_norm_eps"] = 0.25
    (conf / "config.json").write_text(json.dumps(cfg))
    return str(tok), str(conf)


def lora_modules(model) -> set[str]:
    """Short names (q_proj, …) of the modules holding a LoRA adapter."""
    return {name.split(".")[-1] for name, mod in model.named_modules() if hasattr(mod, "lora_A")}


def test_exclude_modules_keeps_adapters_off_those_modules(tiny_model_dir):
    from rlhf_core.models.loading import load_causal_lm

    everything = lora_modules(apply_lora(load_causal_lm(tiny_model_dir), 4))
    assert {"q_proj", "v_proj", "down_proj"} <= everything  # all-linear
    listed = lora_modules(apply_lora(load_causal_lm(tiny_model_dir), 4, exclude_modules=["v_proj", "down_proj"]))
    assert listed == everything - {"v_proj", "down_proj"}
    # a string is a regex over the full name: no adapter in layer 0, layer 1 keeps its own
    model = apply_lora(load_causal_lm(tiny_model_dir), 4, exclude_modules=r".*layers\.0\..*")
    names = [n for n, mod in model.named_modules() if hasattr(mod, "lora_A")]
    assert names and not any(".layers.0." in n for n in names) and any(".layers.1." in n for n in names)


def test_critic_keeps_its_head_out_of_lora_with_user_exclusions(tiny_model_dir):
    from rlhf_core.models.loading import load_value_model

    model = apply_lora(load_value_model(tiny_model_dir), 4, task_type="TOKEN_CLS", exclude_modules=["q_proj"])
    assert "q_proj" not in lora_modules(model) and "score" not in lora_modules(model)
    assert "k_proj" in lora_modules(model)
    model = apply_lora(load_value_model(tiny_model_dir), 4, task_type="TOKEN_CLS", exclude_modules=".*q_proj")
    assert "q_proj" not in lora_modules(model) and "score" not in lora_modules(model)


def test_driver_tokenizer_follows_tokenizer_path_and_custom_template(tiny_model_dir, split_dirs):
    from rlhf_core.trainer.main_ppo import driver_tokenizer_path, load_driver_tokenizer

    tok_dir, _ = split_dirs
    cfg = typed_config("ppo_trainer", f"{M}.path={tiny_model_dir}", f"{M}.tokenizer_path={tok_dir}",
                       f"{M}.custom_chat_template={json.dumps(TEMPLATE)}")
    assert driver_tokenizer_path(cfg) == tok_dir
    tok = load_driver_tokenizer(cfg)
    assert tok.name_or_path == tok_dir and tok.chat_template == TEMPLATE
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<<user>>hi"
    assert driver_tokenizer_path(typed_config("ppo_trainer", f"{M}.path={tiny_model_dir}")) == tiny_model_dir


def test_actor_worker_reads_tokenizer_config_template_and_exclusions(tiny_model_dir, split_dirs):
    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    tok_dir, conf_dir = split_dirs
    cfg = ppo_config(tiny_model_dir, f"{M}.tokenizer_path={tok_dir}", f"{M}.hf_config_path={conf_dir}",
                     f"{M}.custom_chat_template={json.dumps(TEMPLATE)}", f"{M}.lora_rank=4",
                     f"{M}.exclude_modules=[o_proj]")
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
    try:
        wg.execute_all("init_model")
        worker = wg.worker
        assert worker.tokenizer.name_or_path == tok_dir and worker.tokenizer.chat_template == TEMPLATE
        assert worker.actor_module.config.rms_norm_eps == 0.25  # config.json from hf_config_path
        adapters = lora_modules(worker.actor_module)
        assert "q_proj" in adapters and "o_proj" not in adapters
        engine = worker.rollout.module  # the HF rollout's copy: same config and LoRA structure as the actor
        assert engine.config.rms_norm_eps == 0.25 and "o_proj" not in lora_modules(engine)
    finally:
        wg.shutdown()


def test_critic_worker_reads_config_template_and_exclusions(tiny_model_dir, split_dirs, tmp_path):
    from transformers import AutoTokenizer

    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.workers.fsdp_workers import CriticWorker

    _, conf_dir = split_dirs
    cfg = ppo_config(tiny_model_dir, f"critic.model.hf_config_path={conf_dir}",
                     f"critic.model.custom_chat_template={json.dumps(TEMPLATE)}", "critic.model.lora_rank=4",
                     "critic.model.exclude_modules=.*o_proj")
    wg = LocalWorkerGroup(CriticWorker, {"config": cfg})
    try:
        wg.execute_all("init_model")
        worker = wg.worker
        assert worker.module.config.rms_norm_eps == 0.25  # config.json from critic.model.hf_config_path
        adapters = lora_modules(worker.module)
        assert "q_proj" in adapters and "o_proj" not in adapters
        assert worker.tokenizer.chat_template == TEMPLATE
        wg.execute_all("save_checkpoint", str(tmp_path / "critic"))
    finally:
        wg.shutdown()
    # the tokenizer saved with the critic's checkpoint carries the template (verl's critic sets it on its tokenizer)
    assert AutoTokenizer.from_pretrained(str(tmp_path / "critic" / "huggingface")).chat_template == TEMPLATE

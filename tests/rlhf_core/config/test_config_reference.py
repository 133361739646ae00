"""Every key of the user's reference (config-reference.zh.txt) exists with the same default.

The YAML blocks are cut out of the (UTF-8, Chinese-commented) reference text, parsed with
OmegaConf's YAML loader (so `1e-6` is a float, as in verl), and each leaf is compared to the
shipped, unresolved YAML: interpolations must be the same `${...}` string.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlhf_core.config import config_dir, load_config
from rlhf_core.config.schema import flatten
from tests.paths import REPO

REFERENCE = Path("/work/shared/spec/config-reference.zh.txt")
if not REFERENCE.exists():  # the spec may also live next to the repo
    REFERENCE = REPO.parent / "shared/spec/config-reference.zh.txt"


def _blocks() -> list[tuple[str, str, str]]:
    """(section, top key, yaml text) for each YAML block; section from the headings between them."""
    lines = REFERENCE.read_text(encoding="utf-8").splitlines()
    section, blocks, i = "ppo_trainer", [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("evaluation.yaml"):
            section = "evaluation"
        elif line.startswith("sft_trainer.yaml"):
            section = "sft_trainer"
        elif line.startswith("Megatron Optimizer"):
            section = "megatron"
        elif line.startswith("Reward Model"):
            section = "ppo_trainer"
        m = re.match(r"^([a-z_]+):\s*$", line)
        if m and i + 1 < len(lines) and lines[i + 1].startswith(" "):
            body = [line]
            i += 1
            while i < len(lines) and (lines[i].startswith(" ") or not lines[i].strip()):
                body.append(lines[i])
                i += 1
            blocks.append((section, m.group(1), "\n".join(body)))
            continue
        i += 1
    return blocks


BLOCKS = _blocks()
# Where a reference block lives in our configs.
PREFIX = {("ppo_trainer", "custom_cls"): "data.custom_cls", ("megatron", "optim"): "actor_rollout_ref.actor.optim"}


def test_reference_has_the_expected_blocks():
    # 12 blocks: ppo data, custom_cls, actor_rollout_ref, megatron optim, reward_model,
    # custom_reward_function, algorithm, trainer; evaluation data + custom_reward_function; sft optim + model.
    names = [(s, k) for s, k, _ in BLOCKS]
    assert len(names) == 12, names
    assert ("megatron", "optim") in names and ("sft_trainer", "model") in names
    assert ("evaluation", "data") in names


def _cases():
    for section, key, text in BLOCKS:
        ref = flatten(OmegaConf.create(text), resolve=False)
        prefix = PREFIX.get((section, key), key)
        config = "ppo_trainer" if section == "megatron" else section
        for path, value in ref.items():
            yield pytest.param(config, prefix + path[len(key):], value, id=f"{config}:{prefix + path[len(key):]}")


@pytest.mark.parametrize("config,path,expected", list(_cases()))
def test_reference_key_has_reference_default(config, path, expected):
    shipped = flatten(OmegaConf.load(Path(config_dir()) / f"{config}.yaml"), resolve=False)
    assert path in shipped, f"{path} missing from {config}.yaml"
    # same value and same YAML type (a bool False must not be shipped as 0, 1e-6 must be a float)
    assert shipped[path] == expected and type(shipped[path]) is type(expected), (path, shipped[path])
    if not (isinstance(expected, str) and "${" in expected):
        # and load_config (overrides + resolution + validation) hands the same default to the trainers
        assert _loaded(config)[path] == expected, (path, _loaded(config)[path])


@functools.lru_cache(maxsize=None)
def _loaded(config: str) -> dict:
    return flatten(load_config(config), resolve=True)


def test_spot_defaults_named_in_the_issue():
    ppo = load_config("ppo_trainer")
    assert ppo.data.truncation == "error"
    assert ppo.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    assert ppo.algorithm.kl_ctrl.kl_coef == 0.005
    assert ppo.trainer.test_freq == 2
    assert ppo.actor_rollout_ref.actor.optim.lr == 1e-6 and isinstance(ppo.actor_rollout_ref.actor.optim.lr, float)
    assert ppo.actor_rollout_ref.actor.optim.weight_decay == 0.01
    # prose-only keys
    assert ppo.actor_rollout_ref.model.use_fused_kernels is False
    assert ppo.actor_rollout_ref.model.fused_kernel_options.impl_backend == "torch"
    assert ppo.reward_model.reward_manager == "naive"
    assert list(ppo.trainer.logger) == ["console", "wandb"]
    # critic "similar to the actor": interpolations resolved to the actor's values
    assert ppo.critic.ppo_mini_batch_size == 256 and ppo.critic.rollout_n == 1
    assert ppo.critic.forward_max_token_len_per_gpu == 32768
    sft = load_config("sft_trainer")
    assert sft.optim.lr_scheduler == "cosine" and list(sft.optim.betas) == [0.9, 0.95]
    assert sft.trainer.default_local_dir == "checkpoints/gsm8k-sft/test"
    assert load_config("evaluation").data.response_key == "responses"


def test_every_yaml_key_has_a_comment_line_above_it():
    for name in ("ppo_trainer", "sft_trainer", "evaluation"):
        lines = (Path(config_dir()) / f"{name}.yaml").read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^\s*([A-Za-z_]+):\s*(\S.*)?$", line)
            if m and m.group(2) is not None:  # a leaf (has a value); parents may be self-explanatory
                assert lines[i - 1].strip().startswith("#"), f"{name}.yaml:{i + 1} '{line.strip()}' has no comment"

"""rlhf_core/configs/generation.yaml holds every key of verl 0.6.0's ``generation.yaml`` with verl's default, bar a
listed few, and loads through ``load_config`` with the same checks as the other configs.

tests/data/verl06/generation.yaml is verl 0.6.0's ``verl/trainer/config/generation.yaml`` (git tag v0.6.0) parsed
with OmegaConf and dumped again, so no comment survives (as tests/data/verl06/strip_comments.py does for the others).
"""
from __future__ import annotations

import warnings

import pytest
from omegaconf import OmegaConf

from rlhf_core.config import ConfigError, load_config
from rlhf_core.config.keys_doc import status_of
from rlhf_core.config.notices import ConfigNotice
from tests.rlhf_core.config.test_config_verl06 import DATA, _leaves, _ours_at

# (path) -> (verl's, ours, why); the test checks both values, so the list cannot go stale
EXCEPTIONS: dict[str, tuple[object, object, str]] = {
    "trainer.device": ("cuda", "auto", "ours: auto = cuda when available, else cpu (as ppo_trainer/sft_trainer)"),
    "rollout.name": ("vllm", "hf", "ours: vLLM is an optional install here; rollout.name=vllm runs it"),
    "trainer.n_gpus_per_node": (8, 1, "ours: one rollout rank, in the calling process (rlhf generate and the "
                                "pipeline's evaluation stage ran so before the key had effect); verl's 8 GPUs would "
                                "be 8 model copies on CPU; verl's scripts set it explicitly"),
}


def _verl() -> dict:
    return _leaves(OmegaConf.load(DATA / "generation.yaml"))


def _ours() -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return OmegaConf.to_container(load_config("generation"), resolve=True)


def test_vendored_file_holds_verl_keys_only():
    # trainer 3 + data 5 + model 2 + rollout 25 (its _target_ skipped) + actor 6 + ray_kwargs 2 = 43 leaves
    assert len(_verl()) == 43 and "#" not in (DATA / "generation.yaml").read_text(encoding="utf-8")


def test_every_verl06_generation_key_loads_with_verl_default():
    ours = _ours()
    for path, verl_default in _verl().items():
        value = _ours_at(ours, path)
        assert value != "<missing>", (f"{path} (verl 0.6.0 generation.yaml) is missing from "
                                      "rlhf_core/configs/generation.yaml")
        if path in EXCEPTIONS:
            assert (verl_default, value) == EXCEPTIONS[path][:2], "update EXCEPTIONS"
            continue
        # same value and same YAML type (False must not be 0, 0.7 a float)
        assert value == verl_default and type(value) is type(verl_default), (path, value, verl_default)
    for path, (verl_listed, ours_listed, why) in EXCEPTIONS.items():
        assert _verl()[path] == verl_listed and verl_listed != ours_listed and why


def test_typos_types_and_verl_rules_are_refused_at_load():
    with pytest.raises(ConfigError, match=r"Unknown config key 'rollout.temprature'. Did you mean "
                                          r"'rollout.temperature'\?"):
        load_config("generation", ["rollout.temprature=0.5"])
    with pytest.raises(ConfigError, match=r"rollout.top_k='many': expected int, got str"):
        load_config("generation", ["rollout.top_k=many"])
    with pytest.raises(ConfigError, match=r"rollout.dtype='fp8' is not one of"):
        load_config("generation", ["rollout.dtype=fp8"])
    with pytest.raises(ConfigError, match=r"rollout.name='sglang' is not one of \['hf', 'vllm'\]"):
        load_config("generation", ["rollout.name=sglang"])
    # verl main_generation: "When temperature=0, n_samples must be 1."
    with pytest.raises(ConfigError, match=r"rollout.temperature=0 needs data.n_samples=1 \(got 5\)"):
        load_config("generation", ["rollout.temperature=0"])
    assert load_config("generation", ["rollout.temperature=0", "data.n_samples=1"]).rollout.temperature == 0.0
    with pytest.raises(ConfigError, match=r"data.n_samples=0 must be >= 1"):
        load_config("generation", ["data.n_samples=0"])


def test_keys_without_effect_get_a_notice_and_ray_kwargs_is_an_alias():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config("generation", ["trainer.n_gpus_per_node=2", "rollout.tensor_model_parallel_size=2",
                                         "ray_kwargs.ray_init.num_cpus=3", "rollout.top_p=1",
                                         "rollout.log_prob_micro_batch_size_per_gpu=4"])
    notices = sorted(str(w.message).split(" has no effect")[0] for w in caught if w.category is ConfigNotice)
    # the rank count and Ray's CPUs have effect (Ray rollout ranks: generation_ray.py), so no notice for them
    assert notices == ["rollout.log_prob_micro_batch_size_per_gpu=4", "rollout.tensor_model_parallel_size=2"]
    # a vLLM key under the hf engine names the engine key (generation.yaml's rollout section is top-level)
    assert any("read only by the vllm rollout engine, and rollout.name='hf'" in str(w.message) for w in caught)
    assert cfg.ray_init.num_cpus == 3 and cfg.rollout.top_p == 1.0 and isinstance(cfg.rollout.top_p, float)
    assert status_of("generation", "rollout.top_k") == "supported"
    assert status_of("generation", "rollout.n").startswith("accepted, no effect yet")


def test_a_user_generation_file_extends_generation_yaml(tmp_path):
    user = tmp_path / "my_generation.yaml"  # not named generation.yaml: recognised by its rollout section
    user.write_text("data:\n  n_samples: 2\nrollout:\n  _target_: verl.workers.config.RolloutConfig\n"
                    "  response_length: 64\n", encoding="utf-8")
    cfg = load_config(str(user))
    assert (cfg.data.n_samples, cfg.rollout.response_length, cfg.rollout.top_k) == (2, 64, 50)

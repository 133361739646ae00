"""Keys given effect in the workers: enable_activation_offload, use_torch_compile, ray_wait_register_center_timeout."""
from __future__ import annotations

import contextlib
import logging

import pytest
import torch
from tests.fixtures.config_fixtures import section, typed_config

from rlhf_core.algos.utils import entropy_from_logits, logprobs_from_logits
from rlhf_core.workers import actor as actor_mod
from rlhf_core.workers.fsdp_utils import activation_offload


def test_activation_offload_is_save_on_cpu_on_cuda_only(monkeypatch):
    assert isinstance(activation_offload(False), contextlib.nullcontext)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert isinstance(activation_offload(True), contextlib.nullcontext)  # CPU: activations already in host memory
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert isinstance(activation_offload(True), torch.autograd.graph.save_on_cpu)


def test_activation_offload_context_keeps_gradients():
    x = torch.randn(3, 4, requires_grad=True)
    with activation_offload(True):
        y = (x.exp() * x).sum()
    y.backward()
    assert torch.allclose(x.grad, x.detach().exp() * (x.detach() + 1))


def test_use_torch_compile_stays_eager_on_cpu_and_logs_once(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(actor_mod, "_CPU_EAGER_NOTED", False)
    with caplog.at_level(logging.INFO, logger=actor_mod.__name__):
        assert actor_mod.hot_functions(True) == (logprobs_from_logits, entropy_from_logits)
        actor_mod.hot_functions(True)
    assert sum("use_torch_compile=True" in r.message for r in caplog.records) == 1
    assert actor_mod.hot_functions(False) == (logprobs_from_logits, entropy_from_logits)


def test_use_torch_compile_on_cuda_compiles_and_falls_back_to_eager(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(actor_mod, "_COMPILED", {})

    def broken(fn, dynamic):
        def run(*a, **k):
            raise RuntimeError("no compiler")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    lp, ent = actor_mod.hot_functions(True)
    assert isinstance(lp, actor_mod._CompiledOrEager) and isinstance(ent, actor_mod._CompiledOrEager)
    logits, labels = torch.randn(2, 3, 5), torch.randint(0, 5, (2, 3))
    assert torch.equal(lp(logits, labels), logprobs_from_logits(logits, labels))  # eager after the failure
    assert lp.compiled is None


def test_actor_reads_use_torch_compile_and_activation_offload(monkeypatch):
    seen = []
    monkeypatch.setattr(actor_mod, "hot_functions", lambda flag: seen.append(flag) or (None, None))
    from transformers import Qwen2Config, Qwen2ForCausalLM

    # a causal LM: the actor chooses its forward path from the model's kernels.support at init
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    a = actor_mod.DataParallelPPOActor(section("ppo_trainer", "actor_rollout_ref.actor", use_torch_compile=True),
                                       model, activation_offload=True)
    assert seen == [True] and a.activation_offload


@pytest.mark.parametrize("role", ["actor", "ref"])
def test_fsdp_config_use_torch_compile_false_turns_compile_off(monkeypatch, role):
    """verl 0.9.1's engine reads fsdp_config.use_torch_compile, verl 0.6's worker the role's key: either False is
    eager (hot_functions gets False), both True compile (on CUDA)."""
    seen = []
    monkeypatch.setattr(actor_mod, "hot_functions", lambda flag: seen.append(flag) or (None, None))
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    for role_key, engine_key in ((True, False), (False, True), (True, True)):
        cfg = section("ppo_trainer", f"actor_rollout_ref.{role}", use_torch_compile=role_key)
        cfg.fsdp_config.use_torch_compile = engine_key
        actor_mod.DataParallelPPOActor(cfg, model)
    assert seen == [False, False, True]


def test_ray_wait_timeout_reaches_worker_groups_and_is_named_on_timeout(monkeypatch):
    from rlhf_core.trainer import main_ppo

    calls, shut = [], []

    class Group:
        def __init__(self, cls, world, kwargs, **kw):
            calls.append(kw)
            if kw["name_prefix"] == "critic":
                raise TimeoutError("cannot place 2 workers")

        def shutdown(self):
            shut.append(1)

    monkeypatch.setattr(main_ppo, "RayWorkerGroup", Group)
    monkeypatch.setattr(main_ppo, "worker_resources", lambda config, n: (0.5, 0.0))
    monkeypatch.setattr(main_ppo, "worker_threads", lambda config, cpu_threads: 1)
    cfg = typed_config("ppo_trainer", "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=False",
                       "actor_rollout_ref.actor.use_kl_loss=False", "trainer.nnodes=1", "trainer.n_gpus_per_node=2",
                       "trainer.ray_wait_register_center_timeout=7")
    with pytest.raises(TimeoutError, match="trainer.ray_wait_register_center_timeout"):
        main_ppo.build_worker_groups(cfg)
    assert [(c["pg_timeout_s"], c["ready_timeout_s"]) for c in calls] == [(7.0, 7.0), (7.0, 7.0)]
    assert shut == [1]  # the actor group built before the failure is shut down

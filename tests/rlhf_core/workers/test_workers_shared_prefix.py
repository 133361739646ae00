"""Each distinct prompt of a micro-batch runs once (``rlhf_core/kernels/shared_prefix.py``): the response logits,
log-probs and gradients equal the plain forward's, directly and through the FSDP2 worker's update."""
from __future__ import annotations

import dataclasses

import os

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.rlhf_core.workers.test_workers_fsdp import ppo_config  # noqa: E402

from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.protocol import Batch  # noqa: E402
from rlhf_core.workers import actor as actor_module  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402
from rlhf_core.kernels.shared_prefix import shared_prefix_logits, supports_shared_prefix  # noqa: E402

U, N, P, T, V = 3, 4, 7, 5, 64  # 3 distinct prompts × 4 samples, prompt ≤ 7 tokens, response ≤ 5


def grouped_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """``U × N`` rows: each prompt repeated ``N`` times (left pads 0, 1, 2), responses right-padded to 5..2 tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, V, (U, P), generator=g)
    pmask = torch.ones(U, P, dtype=torch.long)
    for i in range(U):
        pmask[i, :i] = 0
        prompts[i, :i] = 0
    responses = torch.randint(3, V, (U * N, T), generator=g)
    rmask = (torch.arange(T)[None, :] < (T - torch.arange(U * N) % 4)[:, None]).long()
    ids = torch.cat([prompts.repeat_interleave(N, 0), responses * rmask], 1)
    mask = torch.cat([pmask.repeat_interleave(N, 0), rmask], 1)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": responses * rmask, "response_mask": rmask}


def tiny_lm() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


def response_log_probs(model, b, shared: bool, pack_prompts: bool = False) -> torch.Tensor:
    if shared:
        logits = shared_prefix_logits(model, b["input_ids"], b["attention_mask"], b["position_ids"], T,
                                      pack_prompts=pack_prompts)
    else:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"], logits_to_keep=T + 1).logits[:, :-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def test_log_probs_and_gradients_equal_the_plain_forward():
    model, b = tiny_lm(), grouped_batch()
    assert supports_shared_prefix(model)
    grads = []
    for shared in (False, True):
        model.zero_grad()
        lp = response_log_probs(model, b, shared)
        (lp * b["response_mask"]).sum().backward()
        grads.append((lp.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    (lp0, g0), (lp1, g1) = grads
    valid = b["response_mask"].bool()
    torch.testing.assert_close(lp1[valid], lp0[valid], rtol=0, atol=1e-5)
    for k in g0:  # the prompt pass receives the gradients of all N responses through the gathered keys/values
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-6, msg=k)


def test_packed_prompt_pass_gives_the_plain_forwards_log_probs_and_gradients():
    # use_remove_padding: the prompt pass runs the 3 prompts' 7 + 6 + 5 = 18 valid tokens as one (1, 18) sequence
    # (left pads 0, 1, 2: 21 positions padded) with attention per prompt, its keys and values laid out as the padded
    # pass's; log-probs and every gradient equal the plain forward's. A key scattered one column off, or attention
    # across prompts (no per-sequence layout), fails this test.
    model, b = tiny_lm(), grouped_batch()
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    grads = []
    try:
        for shared, packed in ((False, False), (True, True)):
            model.zero_grad()
            lp = response_log_probs(model, b, shared, pack_prompts=packed)
            (lp * b["response_mask"]).sum().backward()
            grads.append((lp.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    finally:
        hook.remove()
    assert seen == [(U * N, P + T), (1, 18), (U * N, T - 1)]  # plain; then packed prompts, responses
    (lp0, g0), (lp1, g1) = grads
    valid = b["response_mask"].bool()
    torch.testing.assert_close(lp1[valid], lp0[valid], rtol=0, atol=1e-5)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-6, msg=k)


def test_packed_prompt_pass_refuses_a_prompt_without_its_last_token_and_other_attention():
    from rlhf_core.kernels.packing import packed_prompt_pass
    from transformers import DynamicCache

    model, b = tiny_lm(), grouped_batch()
    ids, mask, pos = (b[k][::N, :P].clone() for k in ("input_ids", "attention_mask", "position_ids"))
    mask[1, -1] = 0  # prompt 1 right-padded: its last token is not in the last column
    with pytest.raises(ValueError, match="prompt 1 has padding in its last column"):
        packed_prompt_pass(model, ids, mask, pos, DynamicCache(config=model.config))
    mask[1, -1] = 1
    # no per-sequence attention: refused before any forward (a model built eager: kernels.support reads the
    # attention implementation once per model)
    eager = tiny_lm()
    eager.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="does not attend per sequence"):
        packed_prompt_pass(eager, ids, mask, pos, DynamicCache(config=eager.config))


def test_one_token_responses_need_only_the_prompt_pass():
    # T = 1: the single response token is predicted by the prompt's last position; the response pass, which stops
    # before the last token, has nothing to run. Logits equal the plain forward's last prompt position.
    model, b = tiny_lm(), grouped_batch()
    ids, mask, pos = (b[k][:, :P + 1] for k in ("input_ids", "attention_mask", "position_ids"))
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    try:
        with torch.no_grad():
            got = shared_prefix_logits(model, ids, mask, pos, 1)
    finally:
        hook.remove()
    assert seen == [(U, P)]  # one pass over the 3 distinct prompts only
    with torch.no_grad():
        ref = model(input_ids=ids[:, :P], attention_mask=mask[:, :P], position_ids=pos[:, :P]).logits[:, -1:]
    assert got.shape == (U * N, 1, V)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


def test_no_repeated_prompt_means_the_plain_forward():
    b = grouped_batch()
    rows = torch.arange(0, U * N, N)  # one row per prompt
    assert shared_prefix_logits(tiny_lm(), b["input_ids"][rows], b["attention_mask"][rows],
                                b["position_ids"][rows], T) is None


def test_worker_update_is_the_same_with_and_without_sharing(tiny_model_dir, monkeypatch):
    # through the FSDP2 worker: old log-probs, the update's metrics and the weights after it agree with the plain
    # forward's (rollout.n = 4: each of the 2 prompts appears 4 times in the micro-batch of 8)
    from tests.rlhf_core.workers.test_workers_fsdp import prompt_batch

    results, used = [], []

    def counting(*args, **kwargs):
        out = shared_prefix_logits(*args, **kwargs)
        used.append(out is not None)
        return out

    monkeypatch.setattr(actor_module, "shared_prefix_logits", counting)
    for shared in (True, False):
        if not shared:
            chosen = actor_module.choose_response_forward  # the path chosen at init, without the shared prefix
            monkeypatch.setattr(actor_module, "choose_response_forward",
                                lambda *a: dataclasses.replace(chosen(*a), shared_prefix=False))
        wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(
            tiny_model_dir, "actor_rollout_ref.rollout.n=4", "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "critic.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"), "role": "actor_rollout"})
        wg.execute_all("init_model")
        if shared:
            prompts = prompt_batch(2, seed=3)  # the trainer repeats each prompt rollout.n times before the rollout
            batch = wg.execute_dp("generate_sequences",
                                  Batch({k: v.repeat_interleave(4, 0) for k, v in prompts.tensors.items()}))
            assert batch["input_ids"].shape[0] == 8
            batch.tensors["advantages"] = torch.randn(batch["responses"].shape,
                                                      generator=torch.Generator().manual_seed(3))
        lp = wg.execute_dp("compute_log_prob", batch)["old_log_probs"]
        metrics = wg.execute_dp("update_actor", batch.merge(Batch({"old_log_probs": lp})))[0]
        results.append((lp, metrics, wg.worker.get_state_dict()))
        wg.shutdown()
    assert used and all(used)  # the FSDP2-wrapped model took the shared path: compute_log_prob and the update
    (lp_s, m_s, sd_s), (lp_p, m_p, sd_p) = results
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(lp_s[mask], lp_p[mask], rtol=0, atol=1e-5)
    assert m_s["actor/grad_norm"] == pytest.approx(m_p["actor/grad_norm"], rel=1e-5)
    for k in sd_p:
        torch.testing.assert_close(sd_s[k], sd_p[k], rtol=1e-4, atol=1e-5, msg=k)


def _family(model_type: str, **kw):
    import transformers

    torch.manual_seed(0)
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, head_dim=8, pad_token_id=0, bos_token_id=1,
                eos_token_id=2)
    return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **{**base, **kw}))


def test_sliding_window_caches_are_shared_exactly():
    # Gemma3: every layer a sliding window of 3 (< the 7-token prompt: the cache keeps the window's tail)
    model, b = _family("gemma3_text", sliding_window=3).eval(), grouped_batch()
    assert supports_shared_prefix(model)
    plain = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"],
                  logits_to_keep=T + 1).logits[:, :-1]
    shared = shared_prefix_logits(model, b["input_ids"], b["attention_mask"], b["position_ids"], T)
    valid = b["response_mask"].bool()
    torch.testing.assert_close(shared[valid], plain[valid], rtol=0, atol=1e-5)


def test_caches_with_more_than_keys_and_values_are_refused_before_any_forward():
    # hybrid linear attention (Qwen3-Next) and short convolutions (LFM2) keep per-row state a gather of keys and
    # values would not carry: the decision must come from the model alone (ranks must agree), before any pass
    qwen3_next = _family("qwen3_next", layer_types=["linear_attention", "full_attention"] * 2,
                         linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
                         linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                         shared_expert_intermediate_size=16)
    lfm2 = _family("lfm2", layer_types=["conv", "full_attention"] * 2, num_heads=4)
    assert not supports_shared_prefix(qwen3_next) and not supports_shared_prefix(lfm2)


def test_activation_checkpointing_in_training_turns_it_off():
    # transformers turns the cache off under activation checkpointing with gradients: the prompt pass would be
    # wasted (and, with several ranks, one model call more than on a rank that did not try)
    from rlhf_core.models.loading import enable_activation_checkpointing

    model = tiny_lm()
    enable_activation_checkpointing(model)  # what the workers call for model.enable_gradient_checkpointing
    model.train()
    assert not supports_shared_prefix(model)
    with torch.no_grad():
        assert supports_shared_prefix(model)  # old log-probs and the reference: no gradients, the cache is on
    model.eval()
    assert supports_shared_prefix(model)

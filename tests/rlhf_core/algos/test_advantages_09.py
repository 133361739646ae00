"""verl 0.9's advantage estimators ``optimal_token_baseline``, ``tir_optimal_token_baseline`` and ``gdpo``
(rlhf_core/algos/advantages_token_baseline.py, advantages_gdpo.py) on hand-derived groups, their config keys, the
[adv] stage's inputs (rlhf_core/trainer/advantage_stage.py) and the actor's ``sum_pi_squared``."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rlhf_core.algos import get_adv_estimator, registered_adv_estimators, sum_pi_squared_from_logits  # noqa: E402
from rlhf_core.algos.advantages_gdpo import reward_components_from  # noqa: E402
from rlhf_core.config.cli import main as config_main  # noqa: E402
from rlhf_core.protocol import Batch  # noqa: E402
from rlhf_core.trainer.advantage_stage import estimator_extra_inputs  # noqa: E402

OTB, TIR, GDPO = "optimal_token_baseline", "tir_optimal_token_baseline", "gdpo"
HALF = math.log(0.5)


def otb(name, rewards, mask, index, w, **kw):
    """Run ``name`` with π(y_t) = 0.5, so that w_t = 1 − 2·0.5 + Σπ² = Σπ²: ``sum_pi_squared`` = the wanted w
    (values picked for the formula, not all reachable by a real distribution)."""
    rewards, mask, w = (torch.tensor(x, dtype=torch.float32) for x in (rewards, mask, w))
    return get_adv_estimator(name)(token_level_rewards=rewards, response_mask=mask, index=np.array(index, dtype=object),
                                   old_log_probs=torch.full_like(rewards, HALF), sum_pi_squared=w, **kw)


def test_registry_has_the_estimators():
    assert {OTB, TIR, GDPO} <= set(registered_adv_estimators())


# ---- optimal token baseline -------------------------------------------------------------------------------------
# B_t = Σ_g G_t·W_t·m_t / (Σ_g W_t·m_t + 1e-8), W_t = Σ_{j≤t} w_j·m_j, A = (G − B)·m, returns = G.
def test_otb_two_prompts_three_samples_four_tokens():
    # prompt a: rewards 1, 0, 1 on the last token, all 4 tokens valid, w per row 0.5, 1, 0.75 (constant over t)
    #   G_i,t = R_i; W_i,t = w_i·(t+1), so B_t = Σ R·w / Σ w = (0.5 + 0.75) / 2.25 = 5/9 at every t
    #   A = 1 − 5/9 = 4/9, −5/9, 4/9 on every token.
    # prompt b: lengths 4, 2, 2 (right padding), w = 1; row 0 rewards (0, .5, 0, .5) -> G = (1, 1, .5, .5);
    #   row 1 reward 1 on token 1 -> G = (1, 1); row 2 no reward -> G = (0, 0).
    #   t = 0, 1: every row valid with equal W: B = (1 + 1 + 0)/3 = 2/3 -> A = 1/3, 1/3, −2/3.
    #   t = 2, 3: only row 0 is valid (the one longest row): zero tail, B = 0 -> A = G = .5.
    r = [[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 1], [0, .5, 0, .5], [0, 1, 0, 0], [0, 0, 0, 0]]
    m = [[1, 1, 1, 1]] * 3 + [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]
    w = [[.5] * 4, [1.] * 4, [.75] * 4, [1.] * 4, [1.] * 4, [1.] * 4]
    adv, ret = otb(OTB, r, m, ["a"] * 3 + ["b"] * 3, w)
    third = 1 / 3
    want = [[4 / 9] * 4, [-5 / 9] * 4, [4 / 9] * 4,
            [third, third, .5, .5], [third, third, 0, 0], [-2 * third, -2 * third, 0, 0]]
    assert torch.allclose(adv, torch.tensor(want), atol=1e-6)
    assert ret.tolist() == [[1] * 4, [0] * 4, [1] * 4, [1, 1, .5, .5], [1, 1, 0, 0], [0, 0, 0, 0]]
    assert adv.dtype == torch.float32
    # without the zero tail, row 0's t = 2, 3 are their own baseline: A = .5 − .5·W/(W + 1e-8) ≈ 0
    adv_nt, _ = otb(OTB, r, m, ["a"] * 3 + ["b"] * 3, w, handle_zero_tail=False)
    assert torch.allclose(adv_nt[3], torch.tensor([third, third, 0, 0]), atol=1e-6)


def test_otb_cumulative_weights():
    # one prompt, 2 samples × 2 tokens, rewards 1 and 0 on the last token; w row 0 = (.5, 1.5), row 1 = (1, .5)
    #   W row 0 = (.5, 2), row 1 = (1, 1.5): B_0 = 1·.5/1.5 = 1/3, B_1 = 1·2/3.5 = 4/7
    #   A row 0 = (2/3, 3/7), row 1 = (−1/3, −4/7)
    adv, _ = otb(OTB, [[0, 1], [0, 0]], [[1, 1], [1, 1]], ["p", "p"], [[.5, 1.5], [1, .5]])
    assert torch.allclose(adv, torch.tensor([[2 / 3, 3 / 7], [-1 / 3, -4 / 7]]), atol=1e-6)
    # rollout IS weights scale w by ρ²: ρ = 2 on row 0 is w row 0 × 4
    rho = torch.tensor([[2., 2.], [1., 1.]])
    a_is, _ = otb(OTB, [[0, 1], [0, 0]], [[1, 1], [1, 1]], ["p", "p"], [[.5, 1.5], [1, .5]], rollout_is_weights=rho)
    b_0, b_1 = 1 * 2 / (2 + 1), 1 * 8 / (8 + 1.5)  # W row 0 = (2, 8)
    assert torch.allclose(a_is, torch.tensor([[1 - b_0, 1 - b_1], [-b_0, -b_1]]), atol=1e-6)


@pytest.mark.parametrize("name", [OTB, TIR])
def test_otb_edge_cases(name):
    # identical rewards in a group: B = R·ΣW/(ΣW + 1e-8) -> A = 0 (to 1e-8); a single-sample group: B = 0, A = G
    adv, _ = otb(name, [[0, 2], [0, 2], [1, 2]], [[1, 1], [1, 1], [1, 1]], ["a", "a", "solo"], [[1, 1]] * 3)
    assert torch.allclose(adv, torch.tensor([[0., 0.], [0., 0.], [3., 2.]]), atol=1e-6)
    with pytest.raises(ValueError, match="needs sum_pi_squared"):
        get_adv_estimator(name)(token_level_rewards=torch.zeros(2, 2), response_mask=torch.ones(2, 2),
                                index=["a", "a"], old_log_probs=torch.zeros(2, 2))


def test_tir_aligns_by_generated_token_not_position():
    # row 0 mask (1, 0, 1, 1) (a tool output at position 1), reward 1 at 3; row 1 mask (1, 1, 1, 0), no reward; w = 1
    #   tir: k-th valid tokens aligned, both rows have W = 1, 2, 3 at k = 0, 1, 2 -> B = (1·W + 0)/(2W) = .5
    #     A row 0 = (.5, 0, .5, .5) at its valid positions, row 1 = (−.5, −.5, −.5, 0)
    #   position-aligned otb: t = 0: B = .5; t = 1: only row 1 (G = 0) -> B = 0; t = 2: W = (2, 3), B = 2/5;
    #     t = 3: only row 0 -> B = G = 1 (equal lengths: no zero tail)
    #     A row 0 = (.5, 0, .6, 0), row 1 = (−.5, 0, −.4, 0)
    r, m, w = [[0, 0, 0, 1], [0, 0, 0, 0]], [[1, 0, 1, 1], [1, 1, 1, 0]], [[1.] * 4] * 2
    tir, ret = otb(TIR, r, m, ["p", "p"], w)
    assert torch.allclose(tir, torch.tensor([[.5, 0, .5, .5], [-.5, -.5, -.5, 0]]), atol=1e-6)
    assert ret.tolist() == [[1, 0, 1, 1], [0, 0, 0, 0]]
    pos, _ = otb(OTB, r, m, ["p", "p"], w)
    assert torch.allclose(pos, torch.tensor([[.5, 0, .6, 0], [-.5, 0, -.4, 0]]), atol=1e-6)
    # with prefix masks both are the same estimator
    r2, m2, w2 = [[0, 1, 0], [0, 0, 1], [1, 0, 0]], [[1, 1, 0], [1, 1, 1], [1, 0, 0]], [[.3, .7, .2]] * 3
    assert torch.allclose(otb(TIR, r2, m2, ["q"] * 3, w2)[0], otb(OTB, r2, m2, ["q"] * 3, w2)[0], atol=1e-6)


def test_sum_pi_squared_from_logits():
    # logits (0, log 3) -> π = (1/4, 3/4), Σπ² = 1/16 + 9/16 = 10/16; large logits do not overflow
    z = torch.tensor([[0.0, math.log(3.0)], [1000.0, 1000.0]])
    assert torch.allclose(sum_pi_squared_from_logits(z), torch.tensor([10 / 16, 0.5]))


# ---- gdpo -------------------------------------------------------------------------------------------------------
S3 = math.sqrt(3)


def whiten(per_row, lengths):
    """(x − mean)/sqrt(var + 1e-8) over tokens (row i counted lengths[i] times), unbiased var."""
    toks = [x for x, n in zip(per_row, lengths) for _ in range(n)]
    mean = sum(toks) / len(toks)
    var = sum((x - mean) ** 2 for x in toks) / (len(toks) - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in per_row]


def gdpo(format_, acc, lengths, index, weights=None, eps=1e-6):
    mask = torch.tensor([[1.] * n + [0.] * (4 - n) for n in lengths])
    comps = {"format": torch.tensor(format_), "acc": torch.tensor(acc)}
    return get_adv_estimator(GDPO)(token_level_rewards=torch.zeros_like(mask), response_mask=mask, index=index,
                                   reward_components=comps, reward_weights=weights, epsilon=eps)


def test_gdpo_two_prompts_three_samples():
    # prompt a: format (1, 1, 0): mean 2/3, unbiased std sqrt((1/9 + 1/9 + 4/9)/2) = 1/√3 -> (1/√3, 1/√3, −2/√3)
    #           acc    (1, 0, 0): mean 1/3, std 1/√3 -> (2/√3, −1/√3, −1/√3); sum (√3, 0, −√3)
    # prompt b: format (1, 1, 1): identical -> 0; acc (0, 1, 0) -> (−1/√3, 2/√3, −1/√3); sum the same
    # then whitened over the 22 valid tokens (lengths 4, 4, 4, 4, 4, 2)
    lengths = [4, 4, 4, 4, 4, 2]
    adv, ret = gdpo([1., 1, 0, 1, 1, 1], [1., 0, 0, 0, 1, 0], lengths, ["a"] * 3 + ["b"] * 3, eps=0.0)
    want = whiten([S3, 0, -S3, -1 / S3, 2 / S3, -1 / S3], lengths)
    for i, n in enumerate(lengths):
        assert torch.allclose(adv[i], torch.tensor([want[i]] * n + [0.] * (4 - n)), atol=1e-5)
    assert torch.equal(adv, ret)
    # weights (2, .5): prompt a (2/√3 + 1/√3, 2/√3 − .5/√3, −4/√3 − .5/√3) = (3, 1.5, −4.5)/√3; b .5·acc
    adv_w, _ = gdpo([1., 1, 0, 1, 1, 1], [1., 0, 0, 0, 1, 0], lengths, ["a"] * 3 + ["b"] * 3, [2., .5], eps=0.0)
    want_w = whiten([3 / S3, 1.5 / S3, -4.5 / S3, -.5 / S3, 1 / S3, -.5 / S3], lengths)
    assert torch.allclose(adv_w[:, 0], torch.tensor(want_w), atol=1e-5)


def test_gdpo_single_sample_groups_and_errors():
    # a group of one: mean 0, std 1 -> A^(k) = r/(1 + ε); rows (format 1, acc 1) and (0, 0) -> (2, 0)/(1 + 1e-6),
    # whitened over 2 one-token rows: mean 1/(1+1e-6), unbiased var 2/(1+1e-6)² -> ±1/√2
    adv, _ = gdpo([1., 0], [1., 0], [1, 1], ["x", "y"])
    assert torch.allclose(adv[:, 0], torch.tensor([1 / math.sqrt(2), -1 / math.sqrt(2)]), atol=1e-5)
    assert torch.equal(adv[:, 1:], torch.zeros(2, 3))
    with pytest.raises(ValueError, match="gdpo_reward_weights has 1 weights for 2"):
        gdpo([1., 0], [1., 0], [1, 1], ["x", "y"], [1.0])


def test_gdpo_without_components_is_grpo_then_whitening():
    r = torch.tensor([[0., 1.], [0., 0.], [0., 3.], [0., 1.]])
    mask = torch.tensor([[1., 1.], [1., 1.], [1., 0.], [1., 1.]])
    idx = ["a", "a", "b", "b"]
    grpo, _ = get_adv_estimator("grpo")(token_level_rewards=r, response_mask=mask, index=idx)
    from rlhf_core.algos.utils import masked_whiten
    want = masked_whiten(grpo.double(), mask.double()) * mask
    got, _ = get_adv_estimator(GDPO)(token_level_rewards=r, response_mask=mask, index=idx)
    assert torch.allclose(got, want.float(), atol=1e-6)


def test_reward_components_from_reward_extra_info():
    cols = {"format": np.array([1, 0.5], dtype=object), "acc": np.array([None, 1], dtype=object)}
    assert reward_components_from(cols, ["format"], 2)["format"].tolist() == [1.0, 0.5]
    with pytest.raises(ValueError, match="'acc' of sample 0 is None"):
        reward_components_from(cols, ["acc"], 2)
    with pytest.raises(ValueError, match=r"'style' is not in the reward extra info.*\['acc', 'format'\]"):
        reward_components_from(cols, ["style"], 2)
    with pytest.raises(ValueError, match="needs algorithm.gdpo_reward_keys"):
        reward_components_from(cols, None, 2)


# ---- config and the [adv] stage -----------------------------------------------------------------------------------
HF = "actor_rollout_ref.rollout.name=hf"


@pytest.mark.parametrize("overrides,rc", [
    ([f"algorithm.adv_estimator={OTB}"], 0),
    ([f"algorithm.adv_estimator={TIR}", "actor_rollout_ref.actor.calculate_sum_pi_squared=True"], 0),
    ([f"algorithm.adv_estimator={GDPO}", "algorithm.gdpo_reward_keys=[format,acc]"], 0),
    ([f"algorithm.adv_estimator={GDPO}", "algorithm.gdpo_reward_keys=[format,acc]",
      "algorithm.gdpo_reward_weights=[1.0,0.5]"], 0),
    ([f"algorithm.adv_estimator={GDPO}"], 1),  # no reward keys
    ([f"algorithm.adv_estimator={GDPO}", "algorithm.gdpo_reward_keys=[format,acc]",
      "algorithm.gdpo_reward_weights=[1.0]"], 1),  # one weight for two keys
])
def test_config_check_accepts_the_estimators(overrides, rc, capsys):
    assert config_main(["check", HF, *overrides]) == rc
    err = capsys.readouterr().err
    assert ("OK: ppo_trainer is valid" in err) == (rc == 0)
    if rc:
        assert "gdpo_reward_" in err


def _algo(**kw):
    from omegaconf import OmegaConf
    base = dict(adv_estimator="grpo", gdpo_reward_keys=None, gdpo_reward_weights=None)
    return OmegaConf.create({**base, **kw})


def test_adv_stage_passes_sum_pi_squared_and_reward_components():
    t = torch.zeros(2, 3)
    batch = Batch({"old_log_probs": t, "sum_pi_squared": t + 1, "response_mask": t + 1},
                  {"format": np.array([1, 0], dtype=object), "uid": np.array(["a", "a"], dtype=object)})
    rows, scalars = estimator_extra_inputs(_algo(adv_estimator=OTB), batch, {})
    assert set(rows) == {"old_log_probs", "sum_pi_squared", "rollout_is_weights"} and rows["rollout_is_weights"] is None
    assert torch.equal(rows["sum_pi_squared"], t + 1) and scalars == {}
    metrics: dict = {}
    rows, scalars = estimator_extra_inputs(_algo(adv_estimator=GDPO, gdpo_reward_keys=["format"],
                                                 gdpo_reward_weights=[2]), batch, metrics)
    assert rows["reward_components"]["format"].tolist() == [1.0, 0.0] and scalars == {"reward_weights": [2.0]}
    assert metrics == {"gdpo/format/mean": 0.5, "gdpo/format/std": 0.5, "gdpo/format/max": 1.0, "gdpo/format/min": 0.0}
    assert estimator_extra_inputs(_algo(), batch, {}) == ({}, {})
    with pytest.raises(ValueError, match="needs 'sum_pi_squared'.*calculate_sum_pi_squared"):
        estimator_extra_inputs(_algo(adv_estimator=TIR), Batch({"old_log_probs": t}), {})


def test_old_log_prob_stage_is_not_skipped_when_sum_pi_squared_is_needed():
    from omegaconf import OmegaConf
    from rlhf_core.workers.on_policy import skip_old_log_prob
    cfg = OmegaConf.create({
        "actor_rollout_ref": {"actor": {"ppo_epochs": 1, "ppo_mini_batch_size": 4, "rollout_is": False,
                                        "calculate_sum_pi_squared": False},
                              "rollout": {"calculate_log_probs": False}},
        "algorithm": {"use_kl_in_reward": False, "rollout_is_threshold": None, "adv_estimator": "grpo"},
        "data": {"train_batch_size": 4}, "trainer": {"critic_warmup": 0}})
    assert skip_old_log_prob(cfg, 1)
    cfg.algorithm.adv_estimator = OTB
    assert not skip_old_log_prob(cfg, 1)
    cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.actor.calculate_sum_pi_squared = "grpo", True
    assert not skip_old_log_prob(cfg, 1)


# ---- the actor's sum_pi_squared -----------------------------------------------------------------------------------
def rollout_batch(vocab: int, p: int = 6, t: int = 5) -> Batch:
    """4 prompts of ``p`` tokens (row 0 left-padded by 2) with right-padded responses of ``t`` tokens (lengths 5, 3,
    1, 4), token ids in [3, vocab), as a rollout returns them."""
    g = torch.Generator().manual_seed(1)
    pmask = torch.ones(4, p, dtype=torch.long)
    pmask[0, :2] = 0
    rmask = (torch.arange(t)[None, :] < torch.tensor([5, 3, 1, 4])[:, None]).long()
    prompts = torch.randint(3, vocab, (4, p), generator=g) * pmask
    responses = torch.randint(3, vocab, (4, t), generator=g) * rmask
    mask = torch.cat([pmask, rmask], 1)
    return Batch({"prompts": prompts, "responses": responses, "response_mask": rmask,
                  "input_ids": torch.cat([prompts, responses], 1), "attention_mask": mask,
                  "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)})


def test_actor_sum_pi_squared_equals_softmax_squared_of_the_model():
    from tests.rlhf_core.workers.test_workers_update_pins import tiny_config
    from transformers import Qwen2ForCausalLM

    from rlhf_core.config import load_config
    from rlhf_core.workers.actor import DataParallelPPOActor

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_config()).eval()
    actor = DataParallelPPOActor(load_config("ppo_trainer", []).actor_rollout_ref.actor, model)
    batch = rollout_batch(model.config.vocab_size)
    batch.meta["temperature"] = 0.7
    lp, ent, spp = actor.compute_log_prob(batch, 2, calculate_sum_pi_squared=True)
    assert len(actor.compute_log_prob(batch, 2)) == 2  # off: (log_probs, entropys) as before
    # reference: the model's own forward on the full sequences, logits at P−1 .. P+T−2 divided by the temperature
    T = batch["responses"].shape[-1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, -T - 1:-1].double() / 0.7
    probs = torch.softmax(logits, dim=-1)
    want_lp = torch.log_softmax(logits, -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = batch["response_mask"].bool()
    assert torch.allclose(lp[mask].double(), want_lp[mask], atol=1e-4)  # the reference reads the same positions
    assert spp.dtype == torch.float32 and spp.shape == lp.shape
    assert torch.allclose(spp[mask].double(), (probs ** 2).sum(-1)[mask], atol=1e-6)


@pytest.mark.parametrize("estimator,key,returned", [("grpo", False, False), ("grpo", True, True), (OTB, False, True),
                                                    (TIR, False, True)])
def test_worker_returns_sum_pi_squared_when_the_key_or_the_estimator_asks(estimator, key, returned):
    from types import SimpleNamespace

    from rlhf_core.config import load_config
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = load_config("ppo_trainer", [f"algorithm.adv_estimator={estimator}",
                                      f"actor_rollout_ref.actor.calculate_sum_pi_squared={key}",
                                      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2"])

    class Actor:
        def compute_log_prob(self, batch, micro, dynamic, max_tok, calculate_sum_pi_squared=False):
            z = torch.zeros(len(batch), 3)
            return (z, z, z + 0.25) if calculate_sum_pi_squared else (z, z)

    worker = SimpleNamespace(actor=Actor(), arr=cfg.actor_rollout_ref, config=cfg, role="actor_rollout",
                             actor_sp=None,  # no sequence parallelism
                             _temperature=lambda b: ActorRolloutRefWorker._temperature(worker, b))
    out = ActorRolloutRefWorker.compute_log_prob(worker, Batch({"responses": torch.zeros(2, 3)}))
    assert ("sum_pi_squared" in out) is returned
    if returned:
        assert torch.equal(out["sum_pi_squared"], torch.full((2, 3), 0.25))

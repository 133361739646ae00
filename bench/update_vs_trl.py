"""One identical GRPO batch through our actor update and TRL's ``GRPOTrainer`` loss: same gradient, same update?

    python bench/update_vs_trl.py --workdir W [--seed 0] [--lr 3e-4]

``W`` is a workdir prepared by ``bench/learning_vs_trl.py --workdir W --peers none`` (the Countdown data and the
warmed-up checkpoint). From that checkpoint, with the Countdown experiment's ``ppo.overrides`` (32 prompts × n=8,
4 mini-batches of 8 prompts, response ≤ 12 tokens):

1. our worker (``ActorRolloutRefWorker``, the FSDP2 path ``rlhf ppo`` runs) samples 8 responses to each of 32
   training prompts (rows ``32·seed`` to ``32·seed + 31``), computes the old log-probs, and the Countdown rewards
   give GRPO advantages (ours, ε = 1e-6; TRL's are (r − mean)/(std + 1e-4), printed for comparison);
2. **gradient**: mini-batch 0 (64 rows) through our ``_micro_loss`` and through TRL's ``_compute_loss`` (TRL 1.16,
   its defaults: ``loss_type="dapo"``, ε = 0.2) on a fresh copy of the checkpoint, with the same old log-probs and
   advantages; prints both losses, gradient norms and their cosine;
3. **update**: the whole batch through our ``update_actor`` (4 AdamW steps, clip 1.0, weight decay 0.01) and through
   TRL's optimizer (``create_optimizer``: AdamW, no decay on biases and norm weights) stepping on TRL's loss for the
   same 4 mini-batches; prints the norms of both weight changes and their cosine;
4. checks that our rollout engine then samples from the updated weights (its log-probs against the actor's).

Needs ``trl`` (``pip install -c requirements/constraints.txt 'trl==1.16.*'``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

N, P, T, MINI = 8, 48, 12, 64  # experiments/countdown.yaml's rollout.n, max_prompt_length, max_response_length, mini-batch rows


def _unwrap(name: str) -> str:
    return name.removeprefix("_fsdp_wrapped_module.")


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # an FSDP2 DTensor → the whole tensor


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a.double() @ b.double() / (a.double().norm() * b.double().norm()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--seed", type=int, default=0, help="which 32 training prompts, and the sampling seed")
    p.add_argument("--lr", type=float, default=3e-4)
    args = p.parse_args(argv)
    warm = args.workdir / "sft" / "hf_model"
    if not (warm / "config.json").exists():
        p.error(f"{warm} is missing: prepare it with bench/learning_vs_trl.py --workdir {args.workdir} --peers none")

    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        p.error(f"{exc}: install TRL into this venv: pip install -c requirements/constraints.txt 'trl==1.16.*'")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import learning_vs_trl
    from rlhf_core.algos.advantages import compute_grpo_outcome_advantage
    from rlhf_core.config import load_config
    from rlhf_core.data.readers import read_parquet_rows
    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.protocol import Batch
    from rlhf_core.reward.scorers import countdown
    from rlhf_core.workers import batching
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(warm)
    rows = read_parquet_rows(str(args.workdir / "data" / "train.parquet"))
    if not 0 <= args.seed < len(rows) // 32:
        p.error(f"--seed {args.seed}: the workdir's {len(rows)} training prompts allow seeds 0-{len(rows) // 32 - 1}")
    rows = rows[32 * args.seed:32 * args.seed + 32]
    enc = [tok(tok.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False),
               add_special_tokens=False)["input_ids"] for r in rows]
    ids = torch.full((len(enc), P), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(enc):  # left-padded, as the dataset does
        ids[i, P - len(e):], mask[i, P - len(e):] = torch.tensor(e), 1
    prompts = Batch({"input_ids": ids, "attention_mask": mask,
                     "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)}).repeat_interleave(N)
    prompts.meta.update({"do_sample": True, "temperature": 1.0})
    cfg = load_config("ppo_trainer", learning_vs_trl.ppo_overrides([
        f"actor_rollout_ref.model.path={warm}", f"actor_rollout_ref.actor.optim.lr={args.lr}",
        "actor_rollout_ref.actor.optim.total_training_steps=100",
        "actor_rollout_ref.rollout.calculate_log_probs=True"], 2))
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
    wg.execute_all("init_model")
    before = {_unwrap(k): v.detach().clone() for k, v in wg.worker.get_state_dict().items()}

    # 1. one rollout, its rewards and advantages
    out = wg.execute_dp("generate_sequences", prompts)
    out = out.merge(wg.execute_dp("compute_log_prob", out))
    resp, rmask = out["responses"], out["response_mask"]
    texts = [tok.decode(r[m.bool()], skip_special_tokens=True) for r, m in zip(resp, rmask)]
    scores = torch.tensor([countdown.compute_score(t, rows[i // N]["reward_model"]["ground_truth"])["score"]
                           for i, t in enumerate(texts)])
    token_rewards = torch.zeros(rmask.shape)
    token_rewards[torch.arange(len(scores)), rmask.sum(-1) - 1] = scores
    adv, _ = compute_grpo_outcome_advantage(token_rewards, rmask, [str(i // N) for i in range(len(scores))])
    out.tensors["advantages"] = adv
    out.meta["temperature"] = 1.0
    g = scores.view(-1, N)
    trl_adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).view(-1)
    print(f"rollout: {len(scores)} responses, mean reward {scores.mean():.4f}, {int(rmask.sum())} response tokens; "
          f"max |A_ours - A_trl| {float((adv[:, 0] - trl_adv).abs().max()):.2e} (the epsilons)")

    # TRL on a fresh copy of the same checkpoint
    data = Dataset.from_list([{"prompt": [dict(m) for m in r["prompt"]]} for r in rows])
    trl_args = GRPOConfig(output_dir=str(args.workdir / "update_vs_trl"), use_cpu=True,
                          per_device_train_batch_size=MINI, gradient_accumulation_steps=1, steps_per_generation=4,
                          num_generations=N, max_completion_length=T, learning_rate=args.lr, beta=0.0,
                          num_iterations=1, scale_rewards="group", temperature=1.0, report_to="none",
                          save_strategy="no", lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01,
                          max_grad_norm=1.0, seed=args.seed)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32),
                          reward_funcs=lambda completions, **_: [0.0] * len(completions), args=trl_args,
                          train_dataset=data, processing_class=tok)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; _compute_loss reads it
    model = trainer.model.train()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "not the same checkpoint"

    def trl_inputs(rows_: slice) -> dict:
        return {"prompt_ids": out["input_ids"][rows_, :P], "prompt_mask": out["attention_mask"][rows_, :P],
                "completion_ids": resp[rows_], "completion_mask": rmask[rows_], "advantages": trl_adv[rows_],
                "old_per_token_logps": out["old_log_probs"][rows_], "num_items_in_batch": rmask.sum().float()}

    # 2. the gradient of mini-batch 0
    first = slice(0, MINI)
    mini = Batch({k: v[first] for k, v in out.tensors.items()}, {}, dict(out.meta))
    actor = wg.worker.actor
    actor.model.train()
    n_tok, n_seq = batching.global_counts(mini["response_mask"])
    loss_ours, _ = actor._micro_loss(mini, 1.0, n_tok, n_seq)
    loss_ours.backward()
    g_ours = {_unwrap(k): _full(q.grad).detach().clone() for k, q in actor.model.named_parameters()}
    actor.model.zero_grad(set_to_none=True)
    loss_trl = trainer._compute_loss(model, trl_inputs(first))
    loss_trl.backward()
    g_trl = {k: q.grad.detach().clone() for k, q in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    keys = sorted(g_ours)
    a, b = torch.cat([g_ours[k].flatten() for k in keys]), torch.cat([g_trl[k].flatten() for k in keys])
    print(f"gradient, mini-batch 0: loss ours {float(loss_ours.detach()):+.6f} TRL {float(loss_trl.detach()):+.6f}; "
          f"norm ours "
          f"{float(a.norm()):.5f} TRL {float(b.norm()):.5f} (token means over {float(n_tok):.0f} tokens ours, "
          f"{float(rmask.sum()) / 4:.2f} TRL: the batch's tokens / 4); cosine {_cos(a, b):.6f}")

    # 3. the whole update: 4 optimizer steps each
    metrics = wg.execute_dp("update_actor", out)[0]
    opt = trainer.create_optimizer()
    trl_norms = []
    for i in range(len(out) // MINI):
        model.zero_grad(set_to_none=True)
        trainer._compute_loss(model, trl_inputs(slice(MINI * i, MINI * (i + 1)))).backward()
        trl_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
    after_ours = {_unwrap(k): v for k, v in wg.worker.get_state_dict().items()}
    after_trl = model.state_dict()
    d_ours = torch.cat([(after_ours[k] - before[k]).flatten() for k in keys])
    d_trl = torch.cat([(after_trl[k] - before[k]).flatten() for k in keys])
    print(f"update, 4 AdamW steps: our grad norm (mean of 4) {metrics['actor/grad_norm']:.4f}, TRL's "
          f"{sum(trl_norms) / len(trl_norms):.4f}; weight change norm ours {float(d_ours.norm()):.5f} TRL "
          f"{float(d_trl.norm()):.5f}; cosine {_cos(d_ours, d_trl):.6f}")

    # 4. the rollout engine samples from the updated weights
    again = wg.execute_dp("generate_sequences", prompts)
    lp = wg.execute_dp("compute_log_prob", again)["old_log_probs"]
    m = again["response_mask"].bool()
    gap = float((again["rollout_log_probs"] - lp)[m].abs().max())
    print(f"after the update: max |rollout log-prob - actor log-prob| {gap:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The reference peers of ``bench_ppo_step.py`` (TRL ``GRPOTrainer`` and a plain single-process HF loop) and the
step timing every peer shares; each ``run_*`` runs in its own subprocess started by ``bench_ppo_step.py --worker``
(see that script's docstring for the workload and what is measured).
"""
from __future__ import annotations

import statistics
import tempfile
import time


# ---- shared measurement ----------------------------------------------------------------------------------------
def _rows(spec: dict) -> list[dict]:
    from rlhf_core.data.readers import read_parquet_rows

    return read_parquet_rows(spec["train_file"])


def _gsm8k_score(text: str, ground_truth) -> float:
    from rlhf_core.reward.scorers import default_compute_score

    return float(default_compute_score("openai/gsm8k", text, ground_truth))


def step_summary(step_ends: list[float], tokens: list[float], response_tokens: list[float], warmup: int) -> dict:
    """Mean and median s/step over the steps after ``warmup`` (end-to-end deltas) and the matching token rates."""
    deltas = [b - a for a, b in zip(step_ends[warmup - 1:], step_ends[warmup:])] if warmup else \
        [step_ends[0]] + [b - a for a, b in zip(step_ends, step_ends[1:])]
    n = len(deltas)
    s = sum(deltas)
    tok, rtok = sum(tokens[-n:]), sum(response_tokens[-n:])
    return {"s_per_step": s / n, "median_s_per_step": statistics.median(deltas), "tokens_per_s": tok / s,
            "response_tokens_per_s": rtok / s, "tokens_per_step": tok / n, "response_tokens_per_step": rtok / n, "steps": n,
            "step_s": [round(d, 4) for d in deltas]}


def sync_device(device: str) -> None:
    """Wait for queued CUDA work before reading the clock (nothing to wait for on CPU)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# ---- peer: TRL GRPOTrainer -------------------------------------------------------------------------------------
def run_trl(spec: dict, args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = _rows(spec)
    data = Dataset.from_list([{"prompt": [dict(m) for m in r["prompt"]],
                               "ground_truth": str(r["reward_model"]["ground_truth"])} for r in rows])

    def gsm8k_reward(prompts, completions, ground_truth, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [_gsm8k_score(t, g) for t, g in zip(texts, ground_truth)]

    class Clock(TrainerCallback):
        def __init__(self):
            self.t0, self.ends, self.num_tokens = time.perf_counter(), [], []

        def on_step_end(self, a, state, control, **kw):
            sync_device(args.device)
            self.ends.append(time.perf_counter() - self.t0)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "num_tokens" in logs:
                self.num_tokens.append((float(logs["num_tokens"]), float(logs.get("completions/mean_length", 0.0))))

    with tempfile.TemporaryDirectory() as tmp:
        cfg = GRPOConfig(
            output_dir=tmp, use_cpu=args.device == "cpu", per_device_train_batch_size=args.prompts * args.n,
            gradient_accumulation_steps=1, num_generations=args.n, max_completion_length=args.new_tokens,
            learning_rate=args.lr, beta=0.0, num_iterations=1, loss_type="dapo", scale_rewards="group",
            temperature=1.0, bf16=args.bf16, fp16=False, gradient_checkpointing=False, logging_steps=1,
            report_to="none", save_strategy="no", max_steps=args.warmup + args.steps, disable_tqdm=True,
            dataloader_num_workers=0, shuffle_dataset=False, seed=0)
        tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
        model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
        gen_s: list[float] = []
        generate = model.generate

        def timed_generate(*a, **kw):  # TRL's profiling goes to wandb/mlflow only: time generation here
            t = time.perf_counter()
            out = generate(*a, **kw)
            sync_device(args.device)
            gen_s.append(time.perf_counter() - t)
            return out

        model.generate = timed_generate
        clock = Clock()
        trainer = GRPOTrainer(model=model, reward_funcs=gsm8k_reward, args=cfg, train_dataset=data,
                              processing_class=tokenizer, callbacks=[clock])
        clock.t0 = time.perf_counter()
        trainer.train()
    cumulative = [t for t, _ in clock.num_tokens]
    tokens = [b - a for a, b in zip([0.0] + cumulative, cumulative)]
    rtokens = [m * args.prompts * args.n for _, m in clock.num_tokens]
    measured = gen_s[args.warmup:]
    stages = {"gen": round(sum(measured) / len(measured), 4)} if measured else {}
    return {**step_summary(clock.ends, tokens, rtokens, args.warmup), "stages_s": stages}


# ---- peer: plain single-process HF reference -------------------------------------------------------------------
def run_hf(spec: dict, args) -> dict:
    """generate → reward → GRPO advantages → one log-prob forward with grad → token-mean clipped loss → AdamW."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rows = _rows(spec)
    torch.manual_seed(0)
    ends, tokens, rtokens, gen_s = [], [], [], []
    t0 = time.perf_counter()
    for step in range(args.warmup + args.steps):
        chunk = rows[step * args.prompts:(step + 1) * args.prompts]
        texts = [tokenizer.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False)
                 for r in chunk for _ in range(args.n)]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(dev)
        P = enc["input_ids"].shape[1]
        model.eval()
        t_gen = time.perf_counter()
        with torch.no_grad():
            seq = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=args.new_tokens, pad_token_id=tokenizer.pad_token_id)
        sync_device(args.device)
        gen_s.append(time.perf_counter() - t_gen)
        resp = seq[:, P:]
        is_eos = resp == tokenizer.eos_token_id
        after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0  # tokens after the first EOS
        resp_mask = (~after_eos).long()
        decoded = tokenizer.batch_decode(resp * resp_mask + tokenizer.pad_token_id * (1 - resp_mask),
                                         skip_special_tokens=True)
        gts = [str(r["reward_model"]["ground_truth"]) for r in chunk for _ in range(args.n)]
        scores = torch.tensor([_gsm8k_score(t, g) for t, g in zip(decoded, gts)], device=dev).view(-1, args.n)
        adv = ((scores - scores.mean(-1, keepdim=True)) / (scores.std(-1, keepdim=True) + 1e-6)).view(-1, 1)
        attn = torch.cat([enc["attention_mask"], resp_mask], 1)
        model.train()
        logits = model(input_ids=seq, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
        logp = torch.log_softmax(logits[:, P - 1:-1].float(), -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(logp - logp.detach())
        pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        loss = (pg * resp_mask).sum() / resp_mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync_device(args.device)
        ends.append(time.perf_counter() - t0)
        tokens.append(float(attn.sum()))
        rtokens.append(float(resp_mask.sum()))
    measured = gen_s[args.warmup:]
    return {**step_summary(ends, tokens, rtokens, args.warmup), "stages_s": {"gen": round(sum(measured) / len(measured), 4)}}


def report_rounds(rounds: list[dict[str, dict]]) -> None:
    """Each round's ratio of medians against ``ours`` (peers of one round run back to back, or side by side), and
    their median and quartiles."""
    import statistics

    for peer in ("ours_ray", "trl", "hf"):
        ratios = [r[peer]["median_s_per_step"] / r["ours"]["median_s_per_step"] for r in rounds
                  if "median_s_per_step" in r.get(peer, {}) and "median_s_per_step" in r.get("ours", {})]
        if ratios:
            quartiles = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
            print(f"ratio {peer}/ours per round (medians): {', '.join(f'{x:.2f}' for x in ratios)}; "
                  f"median {statistics.median(ratios):.2f}x, quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}, "
                  f"over {len(ratios)} round(s)")


def count_params(model_dir: str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    import torch

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())

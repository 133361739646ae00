"""Generation throughput: HFRollout (HF ``generate``) vs VLLMRollout (in-process vLLM) on the tiny model, one run.

Run in the vLLM venv (``bash bench/vllm_cpu_env.sh`` creates it)::

    OMP_NUM_THREADS=1 .venv-vllm/bin/python bench/bench_rollout_hf_vs_vllm.py [--prompts 32] [--n 4] [--new-tokens 64]

Both engines sample (temperature 1) ``prompts × n`` sequences of exactly ``new_tokens`` tokens (``ignore_eos``)
from the same GSM8K prompts with the same weights, through the rollout classes the trainer uses. The model is the
tiny GSM8K Qwen2 of ``tests/conftest.py`` with 2 attention heads of 32 instead of 4 of 16: vLLM's CPU attention
does not support ``head_dim=16``. HF is timed before the vLLM engine starts and again after (in-process vLLM binds
the OpenMP threads), best of ``--reps`` each after one warm-up call.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_core.protocol import Batch  # noqa: E402


def prompts_batch(tokenizer, gsm8k: Path, count: int, n: int) -> Batch:
    """``count`` GSM8K test questions, each repeated ``n`` times (as ``rollout.n`` does), left-padded."""
    rows = [json.loads(line)["question"] for line in (gsm8k / "test.jsonl").read_text().splitlines()[:count]]
    ids = [tokenizer(q)["input_ids"] for q in rows for _ in range(n)]
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    return Batch({"input_ids": input_ids, "attention_mask": mask,
                  "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)})


def timed(rollout, batch: Batch, reps: int) -> tuple[float, int]:
    """Best wall time of ``reps`` calls (after one warm-up) and the tokens generated per call."""
    rollout.generate_sequences(batch)
    best, tokens = float("inf"), 0
    for _ in range(reps):
        t0 = time.perf_counter()
        out = rollout.generate_sequences(batch)
        best = min(best, time.perf_counter() - t0)
        tokens = int(out["response_mask"].sum())
    return best, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--gsm8k", default=os.environ.get("GSM8K_DIR", str(REPO.parent / "shared" / "data" / "gsm8k")))
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf_core.models.tiny import build_tiny_model, gsm8k_texts
    from rlhf_core.workers.rollout.hf_rollout import HFRollout
    from rlhf_core.workers.rollout.vllm_rollout import VLLMRollout

    gsm8k = Path(args.gsm8k)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(gsm8k_texts(gsm8k, "train", limit=2000), Path(tmp) / "model", vocab_size=1000,
                                     num_attention_heads=2, num_key_value_heads=1)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        batch = prompts_batch(tokenizer, gsm8k, args.prompts, args.n)
        P, T = batch["input_ids"].shape[1], args.new_tokens
        cfg = {"response_length": T, "prompt_length": P, "dtype": "float32", "do_sample": True, "temperature": 1.0,
               "top_k": -1, "top_p": 1.0, "ignore_eos": True, "calculate_log_probs": False}
        module = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        params = sum(p.numel() for p in module.parameters())
        hf = HFRollout(module, tokenizer, cfg, seed=0)
        hf_s, hf_tok = timed(hf, batch, args.reps)

        t0 = time.perf_counter()
        vl = VLLMRollout({"path": model_dir}, tokenizer, cfg, seed=0)
        start_s = time.perf_counter() - t0
        vl.sync_weights(module.state_dict())
        vl_s, vl_tok = timed(vl, batch, args.reps)
        hf2_s, _ = timed(hf, batch, args.reps)

    print(f"tiny Qwen2 ({params / 1e6:.2f} M params, head_dim 32), {args.prompts} prompts x {args.n} samples, "
          f"prompt width {P}, {T} new tokens (ignore_eos), OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"HF generate   : {hf_s:6.2f} s  {hf_tok / hf_s:8.0f} tok/s   (after vLLM start: {hf2_s:.2f} s, "
          f"{hf_tok / hf2_s:.0f} tok/s)")
    print(f"vLLM (CPU)    : {vl_s:6.2f} s  {vl_tok / vl_s:8.0f} tok/s   (engine start {start_s:.1f} s, incl. import)")
    print(f"ratio vLLM/HF : {(vl_tok / vl_s) / (hf_tok / hf_s):.2f}x  (vs HF after vLLM start: "
          f"{(vl_tok / vl_s) / (hf_tok / hf2_s):.2f}x)")


if __name__ == "__main__":
    main()

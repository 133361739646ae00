"""HF rollout decode speed: ``model.generate`` (dynamic / static KV cache) vs our lean loop (``hf_decode.decode``).

    OMP_NUM_THREADS=1 python bench/bench_hf_decode.py [--size 1m|20m] [--prompts 32] [--n 4] [--new-tokens 32 128]
        [--reps 5] [--variants generate,generate_static,lean,lean_packed]

Same tiny Qwen2 and GSM8K prompts as ``bench_ppo_step.py`` (``--size`` as there), chat-templated and left-padded,
each prompt repeated ``--n`` times; sampling at temperature 1 (no top-k/top-p), ``ignore_eos`` so every variant
decodes exactly ``--new-tokens`` steps; ``lean_packed`` is the lean loop with its prefill packed
(``use_remove_padding``). Prints median / min / max seconds over ``--reps`` calls per variant (after one warm-up
call each; the variants' calls taken in turn) and each variant's median relative to ``generate``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def build(args, tmp: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench_ppo_step import SIZES, demo_model_sizes
    from rlhf_core.data.readers import read_parquet_rows
    from rlhf_core.data.gsm8k import preprocess_gsm8k
    from rlhf_core.models.tiny import build_tiny_model, gsm8k_texts

    sizes = {**demo_model_sizes(), **SIZES[args.size]}
    model_dir = build_tiny_model(gsm8k_texts(args.gsm8k_dir, "train", limit=2000), tmp / "model", **sizes)
    rows = read_parquet_rows(preprocess_gsm8k(args.gsm8k_dir, str(tmp / "gsm8k"))["train"])[:args.prompts]
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    texts = [tok.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False)
             for r in rows for _ in range(args.n)]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, tok, enc


def run_variant(name, model, tok, enc, T):
    from transformers import GenerationConfig

    from rlhf_core.workers.rollout.hf_decode import decode

    if name in ("lean", "lean_packed"):  # lean_packed: the prefill packed (use_remove_padding)
        return decode(model, enc["input_ids"], enc["attention_mask"], T, [], tok.pad_token_id, True,
                      pack_prompts=name == "lean_packed")[0]
    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=None, top_p=None, max_new_tokens=T, num_beams=1,
                           pad_token_id=tok.pad_token_id, eos_token_id=[], use_cache=True,
                           cache_implementation="static" if name == "generate_static" else None)
    with torch.no_grad():
        return model.generate(**enc, generation_config=cfg)[:, enc["input_ids"].shape[1]:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1m", choices=("1m", "20m", "100m"))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", default="generate,generate_static,lean")
    ap.add_argument("--gsm8k-dir", default=os.environ.get("GSM8K_DIR", str(REPO.parent / "shared" / "data" / "gsm8k")))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model, tok, enc = build(args, Path(tmp))
    params = sum(p.numel() for p in model.parameters())
    print(f"{params / 1e6:.2f} M params, {enc['input_ids'].shape[0]} rows x prompt {enc['input_ids'].shape[1]} tokens "
          f"(left-padded), torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    variants = [v.strip() for v in args.variants.split(",")]
    for T in args.new_tokens:
        med, times = {}, {name: [] for name in variants}
        for name in variants:
            torch.manual_seed(0)
            out = run_variant(name, model, tok, enc, T)  # warm-up
            assert out.shape[1] == T, (name, out.shape)
        for _ in range(args.reps):  # the variants in turn, so a drifting host slows each alike
            for name in variants:
                t = time.perf_counter()
                run_variant(name, model, tok, enc, T)
                times[name].append(time.perf_counter() - t)
        for name in variants:
            med[name] = statistics.median(times[name])
            print(f"T={T:4d} {name:16s} median {med[name]:7.3f} s  min {min(times[name]):7.3f}  "
                  f"max {max(times[name]):7.3f}  "
                  f"({T * enc['input_ids'].shape[0] / med[name]:7.0f} tokens/s)"
                  + (f"  {med['generate'] / med[name]:.2f}x generate" if "generate" in med and name != "generate" else ""),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

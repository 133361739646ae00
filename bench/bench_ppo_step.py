"""One GRPO step, ours vs the peers, on the same tiny model, prompts and workload, measured in one run.

    python bench/bench_ppo_step.py [--steps 5] [--warmup 1] [--device cpu|cuda] [--peers ours,trl,hf] [--rounds K] [--side-by-side]

Workload (FIELD-NOTES "Peers, for comparison"): a tiny random Qwen2 built on GSM8K text (the sizes of
``experiments/gsm8k_tiny.yaml``'s ``model.tiny`` unless overridden), 8 GSM8K train prompts × 4 samples × up to 32 new tokens
(temperature 1, stop at EOS), one optimizer step per batch (GRPO advantages, no KL, no reference model, fp32).

Peers, each in its own subprocess (so one peer's process group or accelerate state cannot touch another's):

* ``ours``: ``RayPPOTrainer.train_step`` — the real driver step (gen, reward, old_log_prob, adv, update_actor
  with the hybrid-engine weight sync) — on one in-process ``LocalWorkerGroup`` rank (FSDP2, single-rank
  gloo/nccl), i.e. without Ray's per-call overhead, as a single-process peer runs.
  Ours runs with ``OMP_WAIT_POLICY=PASSIVE`` unless the caller set it, as ``rlhf ppo`` does (the other peers keep
  the caller's environment, as a user runs them): see ``bench_contention.py``.
* ``ours_ray``: the same step through ``main_ppo.build_worker_groups`` — one Ray worker group exactly as
  ``rlhf ppo`` builds it (fractional CPU reservation, intra-op threads = the node's CPUs ÷ ranks).
* ``trl``: TRL ``GRPOTrainer`` (``use_cpu=True`` on CPU, no vLLM), ``per_device_train_batch_size=32``,
  ``num_generations=4``, ``max_completion_length=32``, ``beta=0``, fp32, no gradient checkpointing. Skipped with
  a clear line when ``trl`` is not importable.
* ``hf``: a plain single-process reference written here (HF ``generate`` + reward + one log-prob forward with
  grad + GRPO loss + AdamW), the floor a framework's overhead is measured against.

s/step is the wall time between the ends of consecutive steps after ``--warmup`` steps (mean over ``--steps``);
tokens/s counts valid prompt + response tokens of the step's 32 sequences (``perf/total_num_tokens``), and
response tokens alone. Ours skips the ``old_log_prob`` forward in this on-policy workload (one epoch, one
mini-batch: ``rlhf_core/workers/on_policy.py``), like TRL and the HF reference, and runs each of a micro-batch's
distinct prompts once in its forward (``rlhf_core/kernels/shared_prefix.py``). ``--remove-padding`` runs our
forwards packed (``use_remove_padding``); ``--dynamic-bsz TOKENS`` cuts our micro-batches by a token budget
(``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu``); ``--size`` picks a model of the cost curve. ``peak_rss_mb``
is the peer process's peak resident memory (for ``ours_ray``: the driver's; the worker's is
``worker_peak_rss_mb``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# bench/ is on sys.path: run as a script
from ppo_step_peers import count_params, report_rounds, run_hf, run_trl, step_summary, sync_device

REPO = Path(__file__).resolve().parents[1]
PEERS = ("ours", "ours_ray", "trl", "hf")
# --size: model sizes of the cost curve (build_tiny_model arguments; parameter counts with vocab 2000)
SIZES = {"1m": {},  # the gsm8k_tiny experiment: hidden 128, 4 layers, ~1.04 M
         "20m": {"hidden_size": 384, "intermediate_size": 1152, "num_layers": 11, "num_attention_heads": 6,
                 "num_key_value_heads": 2},
         "100m": {"hidden_size": 768, "intermediate_size": 2304, "num_layers": 14, "num_attention_heads": 12,
                  "num_key_value_heads": 4}}


# ---- shared set-up ---------------------------------------------------------------------------------------------
def demo_model_sizes() -> dict[str, int]:
    """``model.tiny`` of ``experiments/gsm8k_tiny.yaml`` (the demo's tiny model)."""
    import yaml

    return dict(yaml.safe_load((REPO / "experiments" / "gsm8k_tiny.yaml").read_text())["model"]["tiny"])


def prepare(args, tmp: Path) -> dict:
    """Build the tiny model and the GSM8K train parquet; pick the prompts; returns the spec every peer reads."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from rlhf_core.data.gsm8k import preprocess_gsm8k
    from rlhf_core.data.readers import read_parquet_rows
    from rlhf_core.models.tiny import build_tiny_model, gsm8k_texts

    hf_logging.disable_progress_bar()
    sizes = {**demo_model_sizes(), **SIZES[args.size or "1m"]}
    for key in ("hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "num_key_value_heads"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    model_dir = build_tiny_model(gsm8k_texts(args.gsm8k_dir, "train", limit=2000), tmp / "model", **sizes)
    train = preprocess_gsm8k(args.gsm8k_dir, str(tmp / "gsm8k"))["train"]
    n_prompts = args.prompts * (args.warmup + args.steps)
    rows = read_parquet_rows(train)[:n_prompts]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = [len(tokenizer.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=True,
                                                 return_dict=False)) for r in rows]
    subset = tmp / "train_subset.parquet"
    _write_rows(train, subset, n_prompts)
    return {"model_dir": model_dir, "train_file": str(subset), "max_prompt_length": max(lengths),
            "sizes": sizes, "n_prompts": n_prompts}


def _write_rows(src: str, dst: Path, n: int) -> None:
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(src).slice(0, n), dst)


# ---- peer: ours ------------------------------------------------------------------------------------------------
def ours_config(spec: dict, args, out_dir: Path):
    from rlhf_core.config import load_config, validate_ppo_config

    micro = args.prompts * args.n
    overrides = [
        f"actor_rollout_ref.model.path={spec['model_dir']}", f"critic.model.path={spec['model_dir']}",
        f"data.train_files={spec['train_file']}", f"data.max_prompt_length={spec['max_prompt_length']}",
        f"data.max_response_length={args.new_tokens}", f"data.train_batch_size={args.prompts}",
        "data.shuffle=False", "data.truncation=error",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}", "actor_rollout_ref.actor.use_torch_compile=False",
        f"actor_rollout_ref.rollout.name={args.rollout}", f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        "critic.ppo_micro_batch_size_per_gpu=8", "critic.forward_micro_batch_size_per_gpu=8",
        "trainer.n_gpus_per_node=1", f"trainer.device={args.device}", "trainer.logger=[console]",
        f"trainer.total_training_steps={args.warmup + args.steps + 1}", "trainer.save_freq=-1",
        "trainer.test_freq=-1", "trainer.val_before_train=False", f"trainer.default_local_dir={out_dir / 'ckpt'}",
    ]
    if args.remove_padding:
        overrides += ["actor_rollout_ref.model.use_remove_padding=True"]
    if args.dynamic_bsz:  # micro-batches cut by a token budget instead of the fixed micro_batch_size above
        budget = args.dynamic_bsz
        overrides += ["actor_rollout_ref.actor.use_dynamic_bsz=True",
                      f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}",
                      "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
                      f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={budget}",
                      "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
                      f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={budget}"]
    if args.bf16:  # bf16 compute on fp32 master weights (fsdp_config.mixed_precision), like TRL's bf16=True
        overrides += ["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16"]
    if args.rollout == "vllm":
        overrides += ["actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]
    config = load_config("ppo_trainer", overrides)
    validate_ppo_config(config, 1)
    return config


class _NoTracker:
    def log(self, data, step):
        pass


def run_ours_ray(spec: dict, args) -> dict:
    return run_ours(spec, args, use_ray=True)


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def build_ours(spec: dict, args, out_dir: Path, use_ray: bool = False):
    """Our trainer on the benchmark's config, workers started: in-process (one ``LocalWorkerGroup`` rank) or, with
    ``use_ray``, through ``main_ppo.build_worker_groups`` on an embedded Ray started here."""
    from rlhf_core.data.factory import create_rl_dataset
    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.models.loading import load_tokenizer
    from rlhf_core.reward import load_reward_manager
    from rlhf_core.trainer.ppo_trainer import RayPPOTrainer
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    config = ours_config(spec, args, out_dir)
    tokenizer = load_tokenizer(spec["model_dir"])
    train = create_rl_dataset([spec["train_file"]], tokenizer, config.data)

    def factory(cfg):
        return {"actor_rollout": LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})}

    if use_ray:
        from rlhf_core.distributed.ray_init import init_ray
        from rlhf_core.trainer.main_ppo import build_worker_groups

        init_ray(None, config.ray_init.num_cpus)
        factory = build_worker_groups
    trainer = RayPPOTrainer(config, tokenizer, factory, load_reward_manager(config, tokenizer, num_examine=0),
                            None, train, tracker=_NoTracker())
    trainer.init_workers()
    return trainer


def run_ours(spec: dict, args, use_ray: bool = False) -> dict:
    from rlhf_core.kernels.onednn_linear import onednn_is_faster

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_ours(spec, args, Path(tmp), use_ray)
        ends, tokens, rtokens, stages = [], [], [], {}
        t0 = time.perf_counter()
        for batch in trainer.train_dataloader:
            trainer.global_steps += 1
            metrics = trainer.train_step(batch, 0)
            sync_device(args.device)
            ends.append(time.perf_counter() - t0)
            tokens.append(metrics["perf/total_num_tokens"])
            rtokens.append(metrics["response_length/mean"] * len(batch) * args.n)
            if trainer.global_steps > args.warmup:
                for k, v in metrics.items():
                    if k.startswith("timing_s/"):
                        stages[k[9:]] = stages.get(k[9:], 0.0) + v / args.steps
            if trainer.global_steps >= args.warmup + args.steps:
                break
        worker_rss = None
        if use_ray:
            worker_rss = [round(r / 1024, 1) for r in
                          trainer.actor_wg.execute_all("peak_rss_kib")] if hasattr(trainer.actor_wg, "_actors") else None
        trainer.shutdown()
    return {**step_summary(ends, tokens, rtokens, args.warmup), "stages_s": {k: round(v, 4) for k, v in stages.items()},
            "peak_rss_mb": round(_peak_rss_mb(), 1), "worker_peak_rss_mb": worker_rss,
            # the float32 product library chosen here (onednn_linear.py); a Ray worker applies the same rule
            "fp32_linears": None if use_ray else ("oneDNN" if onednn_is_faster() else "torch")}


# ---- driver ----------------------------------------------------------------------------------------------------
def _peer_command(peer: str, spec_file: Path, args, threads: int | None = None) -> tuple[list[str], dict, Path]:
    """The command line, environment and result file of one peer's fresh interpreter (``threads``: its
    ``OMP_NUM_THREADS``, for peers run side by side; None keeps the caller's)."""
    out = spec_file.parent / f"result_{peer}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", peer, "--spec", str(spec_file),
           "--result", str(out)] + _passthrough(args)
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if peer.startswith("ours"):  # as `rlhf ppo` runs (rlhf_cli sets it before torch loads); peers keep the caller's
        from rlhf_core.distributed.threads import OMP_WAIT_POLICY

        env.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)
    return cmd, env, out


def _peer_result(returncode: int, output: str, out: Path) -> dict:
    if returncode != 0 or not out.exists():
        tail = "\n".join(output.strip().splitlines()[-15:])
        return {"error": f"exit {returncode}:\n{tail}"}
    return json.loads(out.read_text())


def run_peer_subprocess(peer: str, spec_file: Path, args) -> dict:
    """Run one peer in a fresh interpreter; returns its result dict, or ``{"skip": reason}`` / ``{"error": ...}``."""
    if peer == "trl" and not _importable("trl"):
        return {"skip": "trl is not installed (pip install 'trl==1.16.*' into this venv to measure it)"}
    cmd, env, out = _peer_command(peer, spec_file, args)
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.peer_timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.peer_timeout:.0f} s (--peer-timeout)"}
    return _peer_result(proc.returncode, proc.stdout + proc.stderr, out)


def run_peers_side_by_side(peers: list[str], spec_file: Path, args) -> dict[str, dict]:
    """All ``peers`` at once, each in its own interpreter with an equal share of the CPUs as ``OMP_NUM_THREADS``
    (``os.cpu_count() // len(peers)``, at least 1): on a machine that other jobs load, both see the same load at the
    same time, so their ratio holds where back-to-back runs swing. Results as :func:`run_peer_subprocess`."""
    threads = max(1, (os.cpu_count() or 1) // len(peers))
    results: dict[str, dict] = {}
    running = {}
    for peer in peers:
        if peer == "trl" and not _importable("trl"):
            results[peer] = {"skip": "trl is not installed (pip install 'trl==1.16.*' into this venv to measure it)"}
            continue
        cmd, env, out = _peer_command(peer, spec_file, args, threads)
        log = tempfile.TemporaryFile(mode="w+")
        running[peer] = (subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True, env=env),
                         log, out)
    deadline = time.monotonic() + args.peer_timeout
    for peer, (proc, log, out) in running.items():
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            results[peer] = {"error": f"timed out after {args.peer_timeout:.0f} s (--peer-timeout)"}
            continue
        log.seek(0)
        results[peer] = _peer_result(proc.returncode, log.read(), out)
        results[peer]["threads"] = threads
    return results


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _passthrough(args) -> list[str]:
    return [f"--steps={args.steps}", f"--warmup={args.warmup}", f"--device={args.device}", f"--prompts={args.prompts}",
            f"--n={args.n}", f"--new-tokens={args.new_tokens}", f"--lr={args.lr}", f"--rollout={args.rollout}"] + \
        (["--remove-padding"] if args.remove_padding else []) + (["--bf16"] if args.bf16 else []) + \
        ([f"--dynamic-bsz={args.dynamic_bsz}"] if args.dynamic_bsz else []) + \
        ([f"--size={args.size}"] if args.size else [])


def report(spec: dict, args, results: dict[str, dict], params: int, load_at_start: float) -> None:
    import torch

    sizes = spec["sizes"]
    print(f"GRPO step on {args.device}: tiny Qwen2 {params / 1e6:.2f} M params (hidden {sizes['hidden_size']}, "
          f"{sizes['num_layers']} layers, vocab {sizes['vocab_size']}), {args.prompts} prompts x {args.n} samples x "
          f"<= {args.new_tokens} new tokens, longest prompt {spec['max_prompt_length']} tokens; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}, "
          f"{args.steps} measured steps after {args.warmup} warm-up"
          + "".join(f"; ours with {o}" for o, on in (("use_remove_padding", args.remove_padding), ("bf16", args.bf16),
                                                     (f"use_dynamic_bsz, {args.dynamic_bsz} tokens", args.dynamic_bsz))
                    if on))
    for peer, r in results.items():
        name = {"ours": f"ours (RayPPOTrainer.train_step, 1 rank, {args.rollout})",
                "ours_ray": f"ours through Ray (rlhf ppo's worker group, {args.rollout})", "trl": "TRL GRPOTrainer",
                "hf": "plain HF reference loop"}[peer]
        if "skip" in r:
            print(f"  {name:46s}: SKIPPED - {r['skip']}")
        elif "error" in r:
            print(f"  {name:46s}: FAILED - {r['error']}")
        else:
            print(f"  {name:46s}: {r['s_per_step']:6.3f} s/step (median {r['median_s_per_step']:.3f}, "
                  f"{min(r['step_s']):.3f}-{max(r['step_s']):.3f})  {r['tokens_per_s']:8.0f} tokens/s  "
                  f"({r['response_tokens_per_s']:7.0f} response tokens/s; {r['tokens_per_step']:.0f} tokens/step, "
                  f"steps {r['step_s']}); peak RSS {r.get('peak_rss_mb', '-')} MB"
                  + (f", worker {r['worker_peak_rss_mb']} MB" if r.get("worker_peak_rss_mb") else "")
                  + (f"; float32 linears: {r['fp32_linears']}" if r.get("fp32_linears") and not args.bf16 else "")
                  + (f"; side by side, {r['threads']} threads" if r.get("threads") else ""))
            if r.get("stages_s"):
                print(f"  {'':46s}  stages (s): " + ", ".join(f"{k} {v:.3f}" for k, v in r["stages_s"].items()))
    print("  (tokens = valid prompt + response tokens of the step's sequences; s/step = wall time between step ends)")
    ours = results.get("ours", {})
    if "s_per_step" in ours and "s_per_step" in results.get("ours_ray", {}):
        ray = results["ours_ray"]
        print(f"ratio ours_ray/ours s/step: {ray['s_per_step'] / ours['s_per_step']:.2f}x, medians "
              f"{ray['median_s_per_step'] / ours['median_s_per_step']:.2f}x (target <= 1.10)")
    for peer in ("trl", "hf"):
        other = results.get(peer, {})
        if "s_per_step" in ours and "s_per_step" in other:
            print(f"ratio {peer}/ours s/step: {other['s_per_step'] / ours['s_per_step']:.2f}x, medians "
                  f"{other['median_s_per_step'] / ours['median_s_per_step']:.2f}x  "
                  f"(> 1: ours is faster); tokens/s ours/{peer}: {ours['tokens_per_s'] / other['tokens_per_s']:.2f}x")
    print(f"1-min load average {load_at_start:.1f} when these peers started, {os.getloadavg()[0]:.1f} now, on "
          f"{os.cpu_count()} CPUs (the ratios mean something only on an otherwise idle machine)")


def build_parser(description: str = __doc__.splitlines()[0]) -> argparse.ArgumentParser:
    """The benchmark's options (also ``bench_ray_path.py``'s workload options)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--rollout", default="hf", choices=("hf", "vllm"), help="our rollout engine")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--peer-timeout", type=float, default=300)
    ap.add_argument("--rounds", type=int, default=1, help="run the peers this many times, in reverse order every other "
                    "round, and print each round's ratios and their median (the host's speed drifts between runs)")
    ap.add_argument("--side-by-side", action="store_true", help="run the peers of a round at the same time, each "
                    "with cpu_count // len(peers) threads (a ratio that holds on a machine other jobs load)")
    ap.add_argument("--gsm8k-dir", default=os.environ.get("GSM8K_DIR", str(REPO.parent / "shared" / "data" / "gsm8k")))
    for key in ("hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "num_key_value_heads"):
        ap.add_argument("--" + key.replace("_", "-"), dest=key, type=int, default=None)
    ap.add_argument("--size", choices=sorted(SIZES), default=None, help="a model size of the cost curve")
    ap.add_argument("--remove-padding", action="store_true", help="our forwards packed (use_remove_padding)")
    ap.add_argument("--dynamic-bsz", type=int, default=None, metavar="TOKENS",
                    help="our micro-batches by token budget: use_dynamic_bsz with ppo_max_token_len_per_gpu and "
                    "log_prob_max_token_len_per_gpu = TOKENS (valid tokens per micro-batch)")
    ap.add_argument("--bf16", action="store_true", help="bf16 compute: ours via fsdp_config.mixed_precision, TRL bf16=True "
                    "(the plain HF loop stays fp32)")
    ap.add_argument("--json", help="also write all results to this file")
    ap.add_argument("--worker", choices=PEERS, help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap


def parse_args(argv):
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sys.path.insert(0, str(REPO))
    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        result = {"ours": run_ours, "ours_ray": run_ours_ray, "trl": run_trl, "hf": run_hf}[args.worker](spec, args)
        result.setdefault("peak_rss_mb", round(_peak_rss_mb(), 1))
        Path(args.result).write_text(json.dumps(result))
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device here")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(peers) - set(PEERS)
    if unknown:
        raise SystemExit(f"--peers: unknown {sorted(unknown)}; use some of {list(PEERS)}")
    with tempfile.TemporaryDirectory() as tmp:
        spec = prepare(args, Path(tmp))
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps(spec))
        rounds, loads = [], []
        for i in range(args.rounds):
            loads.append(os.getloadavg()[0])
            if args.side_by_side:
                rounds.append(run_peers_side_by_side(peers, spec_file, args))
            else:
                rounds.append({p: run_peer_subprocess(p, spec_file, args)
                               for p in (peers if i % 2 == 0 else peers[::-1])})
        params = count_params(spec["model_dir"])
    for i, results in enumerate(rounds):
        if args.rounds > 1:
            print(f"-- round {i + 1} of {args.rounds}, peers run in the order {list(results)}")
        report(spec, args, {p: results[p] for p in peers}, params, loads[i])
    if args.rounds > 1:
        report_rounds(rounds)
    if args.json:
        Path(args.json).write_text(json.dumps({"spec": {k: v for k, v in spec.items() if k != "model_dir"},
                                               "params": params, "device": args.device, "results": rounds[0],
                                               "rounds": rounds, "load_at_start": loads}, indent=1))
    return 0 if all("error" not in r for results in rounds for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""What FSDP2 at world size 1 costs the actor update of a tiny model (issue 38): CPU time of one update step.

    OMP_NUM_THREADS=1 python bench/bench_fsdp_ws1.py MODEL_DIR [--variants plain,fsdp,fsdp_keep] [--micro 64]
                                                              [--steps 15] [--rows 128] [--seq 44]
                                                              [--keep-freed-heap]

The update of ``bench/bench_short_prompts.py``'s workload without the trainer around it: ``--rows`` sequences of
``--seq`` random tokens (Countdown: 28-33 prompt + up to 12 response tokens), micro-batches of ``--micro`` rows,
the log-prob of the last 12 tokens as the loss, backward, gradient clip 1.0, fused AdamW. Variants: ``plain`` (the
HF model as loaded), ``fsdp`` (``fully_shard`` on each decoder layer and the root, one gloo rank, as
``workers/fsdp_utils.apply_fsdp2`` wraps it), ``fsdp_keep`` (the same with ``reshard_after_forward=False``). Each
variant runs in this process in turn after 3 warm-up steps; prints the median wall and **CPU** time (process
time: the figure that holds on a machine other jobs load) of ``--steps`` steps, and the minor page faults per step.
``--keep-freed-heap`` first applies the ranks' malloc settings (``rlhf_core.distributed.threads.keep_freed_heap``)
to this process, as ``rlhf ppo``'s ranks do; without it, glibc's defaults.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir")
    p.add_argument("--variants", default="plain,fsdp,fsdp_keep")
    p.add_argument("--micro", type=int, default=64)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--seq", type=int, default=44)
    p.add_argument("--keep-freed-heap", action="store_true")
    args = p.parse_args(argv)
    if args.keep_freed_heap:
        from rlhf_core.distributed.threads import keep_freed_heap

        print("keep_freed_heap:", keep_freed_heap())
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), RANK="0", WORLD_SIZE="1")
    from rlhf_core.distributed.worker_group import rendezvous_store

    dist.init_process_group("gloo", store=rendezvous_store(0, 1, "127.0.0.1", int(os.environ["MASTER_PORT"])),
                            rank=0, world_size=1)
    for variant in args.variants.split(","):
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
        if variant != "plain":
            for layer in model.model.layers:
                fully_shard(layer, reshard_after_forward=variant == "fsdp")
            fully_shard(model, reshard_after_forward=variant == "fsdp")
        opt = torch.optim.AdamW(list(model.parameters()), lr=1e-4, fused=True)
        ids = torch.randint(0, model.config.vocab_size, (args.rows, args.seq), generator=torch.Generator().manual_seed(0))

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            for s in range(0, args.rows, args.micro):
                x = ids[s:s + args.micro]
                logits = model(input_ids=x).logits[:, -13:-1].float()
                lp = torch.log_softmax(logits, -1).gather(-1, x[:, -12:, None]).squeeze(-1)
                (-lp.mean() * len(x) / args.rows).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        for _ in range(3):
            step()
        wall, cpu = [], []
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(args.steps):
            t, c = time.perf_counter(), time.process_time()
            step()
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        print(f"{variant:10s} micro {args.micro}: wall median {statistics.median(wall) * 1e3:8.1f} ms, "
              f"CPU median {statistics.median(cpu) * 1e3:7.1f} ms (min {min(cpu) * 1e3:.1f}), minor faults per step "
              f"{(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / args.steps:.0f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

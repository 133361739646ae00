"""Micro-benchmarks behind ten choices of the GRPO step on CPU, each against the alternative it replaced:

* ``sampling``: one draw per row from softmax probabilities, ``torch.multinomial`` (one exponential per vocabulary
  entry on CPU) vs ``hf_decode.sample_categorical`` (inverse transform, one uniform per row), 32 rows, vocabularies
  of 2,000 (the tiny models) and 151,936 (Qwen2.5's).
* ``adamw``: one ``AdamW.step`` on an FSDP2-sharded (one rank, gloo) tiny Qwen2 of the benchmark's 1 M and 20 M
  sizes: torch's CPU default (per-tensor loop), ``foreach=True`` and ``fused=True`` (``workers/optim.py``).
* ``entropy``: ``entropy_from_logits`` over ``(32, 128, 2000)`` float32 logits, the old form (``where(isfinite)``,
  chunks of 1,024 rows, under autograd) vs the current one (clamp, chunks of 128, no autograd for the metric).
* ``logprob``: ``logprobs_from_logits`` forward and backward over ``(32, 127, 2000)`` logits (a 1 M update's
  micro-batch with 128-token responses), the old form (a slice per 1,024-row chunk, autograd's gather and logsumexp
  backward) vs the current one (``algos.utils._LabelLogProb``: chunks inside one autograd function, the gradient
  written into one buffer); ``logprob_memory``: the peak resident memory of the same for ``(1, 4096, 32000)``
  float32 logits, each form in its own process.
* ``raycall``: the round trip of a Ray actor call carrying a 220 KB ``Batch`` each way (about one rollout batch of
  the benchmark), on an embedded Ray started with Ray's default ``max_direct_call_object_size`` (100 KiB: the batch
  goes through the object store) vs the 10 MiB that ``distributed/ray_init.py`` sets (inline in the call); each in
  its own process.
* ``packing``: the actor's response-logits forward and backward (``forward_response_logits``, log-prob sum) on 32
  distinct rows (prompts of 60-180 tokens left-padded, responses of 32-128 right-padded; one in three positions is
  padding) of random tiny Qwen2 models of the 1 M and 20 M sizes: padded, packed with transformers' block-diagonal
  mask (``n × n``), and packed with ``packing.varlen_sdpa`` (attention per sequence); then 8 of those prompts × 4
  (``rollout.n`` = 4, responses as before): the shared-prefix path (what CPU runs for repeated prompts), the same
  with its prompt pass packed (what ``use_remove_padding`` runs there) and varlen packing, each variant's calls
  taken in turn. ``--packing-sizes`` adds the 100 M model.
* ``rm_packing``: the reward model's scoring forward (no gradient) on the 32 distinct rows, padded vs varlen packed
  (``reward_model.model.use_remove_padding``), random tiny ``Qwen2ForSequenceClassification`` models of both sizes.
* ``attention``: bf16 attention forward and backward on the update's shapes, transformers' SDPA (torch's CPU
  flash kernel) vs ``matmul_attention`` (what the "sdpa" entry runs for bf16 on CPU), float32 alongside; then, for
  a bf16 copy of a float32 model, each one's log-prob error against the float32 model and the response-logits
  forward and backward of 8 prompts × 4 (``--packing-sizes`` as for ``packing``).
* ``gather``: the shared prefix's copy of each prompt's keys to its rows, forward and backward, by indexing vs
  ``index_select`` (what ``shared_prefix_logits`` runs), bf16 and float32.
* ``linear`` (``bench/bench_linear.py``): each linear layer's products, torch vs oneDNN, in a decode step
  (reordered weights, float32 and bf16) and in an update's float32 forward and backward (``OneDNNLinear``).

    OMP_NUM_THREADS=2 python bench/bench_kernels.py [--reps 50]
        [--only sampling,adamw,entropy,logprob,logprob_memory,raycall,packing,rm_packing,attention,gather,linear]
        [--packing-sizes 1m,20m,100m]

Prints the median microseconds / milliseconds of each variant over ``--reps`` calls after one warm-up call.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_timing import PACKING_SIZES as _PACKING_SIZES  # noqa: E402 - bench/ is the script's folder
from bench_timing import interleaved_median_ms as _interleaved_median_ms  # noqa: E402


def _median_ms(fn, reps: int) -> float:
    return _interleaved_median_ms([fn], reps)[0]


def bench_sampling(reps: int) -> None:
    from rlhf_core.workers.rollout.hf_decode import sample_categorical

    for vocab in (2000, 151936):
        probs = torch.softmax(torch.randn(32, vocab, generator=torch.Generator().manual_seed(0)), -1)
        n = reps if vocab < 10000 else max(5, reps // 10)
        a = _median_ms(lambda: torch.multinomial(probs, 1), n)
        b = _median_ms(lambda: sample_categorical(probs), n)
        print(f"sampling 32 x {vocab:>6}: multinomial {a:8.3f} ms   sample_categorical {b:7.3f} ms   ({a / b:.0f}x)")


def bench_adamw(reps: int) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    if not dist.is_initialized():
        from rlhf_core.distributed.worker_group import free_port, rendezvous_store

        dist.init_process_group("gloo", store=rendezvous_store(0, 1, "127.0.0.1", free_port()), rank=0, world_size=1)
    sizes = {"1m": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2),
             "20m": dict(hidden_size=384, intermediate_size=1152, num_hidden_layers=11, num_attention_heads=6,
                         num_key_value_heads=6)}
    for name, size in sizes.items():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=2000, **size))
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        row = []
        for label, kwargs in (("default", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kwargs)
            row.append(f"{label} {_median_ms(opt.step, max(5, reps // 5)):7.2f} ms")
        print(f"AdamW step, FSDP2 tiny Qwen2 {name:>3}: " + "   ".join(row))


def _entropy_old(logits: torch.Tensor) -> torch.Tensor:
    flat = logits.reshape(-1, logits.shape[-1])
    parts = []
    for s in range(0, flat.shape[0], 1024):
        chunk = flat[s:s + 1024].float()
        lse = torch.logsumexp(chunk, dim=-1, keepdim=True)
        p = torch.exp(chunk - lse)
        finite = torch.where(torch.isfinite(chunk), chunk, torch.zeros((), device=chunk.device))
        parts.append(lse.squeeze(-1) - (p * finite).sum(-1))
    return torch.cat(parts).reshape(logits.shape[:-1])


def bench_entropy(reps: int) -> None:
    from rlhf_core.algos.utils import entropy_from_logits

    logits = torch.randn(32, 128, 2000, requires_grad=True)
    old = _median_ms(lambda: _entropy_old(logits), max(5, reps // 5))

    def new():
        with torch.no_grad():
            return entropy_from_logits(logits.detach())

    torch.testing.assert_close(new(), _entropy_old(logits).detach(), rtol=1e-5, atol=1e-5)
    print(f"entropy (32, 128, 2000): where(isfinite), 1024-row chunks, autograd {old:6.2f} ms   "
          f"clamp, 128-row chunks, no autograd {_median_ms(new, max(5, reps // 5)):6.2f} ms")


def _logprobs_old(logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int = 1024) -> torch.Tensor:
    """The form ``logprobs_from_logits`` replaced: slices per chunk, autograd's gather and logsumexp backward."""
    flat, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1, 1)
    parts = []
    for s in range(0, flat.shape[0], chunk_rows):
        chunk = flat[s:s + chunk_rows].float()
        parts.append(chunk.gather(-1, flat_labels[s:s + chunk_rows]).squeeze(-1) - torch.logsumexp(chunk, dim=-1))
    return torch.cat(parts).reshape(labels.shape)


def bench_logprob(reps: int) -> None:
    from rlhf_core.algos.utils import logprobs_from_logits

    g = torch.Generator().manual_seed(0)
    base = torch.randn(32, 127, 2000, generator=g) * 3
    labels = torch.randint(0, 2000, (32, 127), generator=g)
    upstream = torch.randn(32, 127, generator=g)

    def fwd_bwd(fn):
        logits = base.clone().requires_grad_(True)
        fn(logits, labels).backward(upstream)
        return logits.grad

    torch.testing.assert_close(fwd_bwd(logprobs_from_logits), fwd_bwd(_logprobs_old), rtol=0, atol=0)
    old = _median_ms(lambda: fwd_bwd(_logprobs_old), max(5, reps // 5))
    new = _median_ms(lambda: fwd_bwd(logprobs_from_logits), max(5, reps // 5))
    print(f"log-probs of (32, 127, 2000) logits, forward + backward: slices + autograd {old:6.2f} ms   "
          f"one function, fused backward {new:6.2f} ms (gradients equal)")


_LOGPROB_MEMORY = """
import resource, sys, torch
sys.path.insert(0, {repo!r}); sys.path.insert(0, {bench!r})
from bench_kernels import _logprobs_old
from rlhf_core.algos.utils import logprobs_from_logits
fn = _logprobs_old if {old} else logprobs_from_logits
g = torch.Generator().manual_seed(0)
x = torch.randn(1, 4096, 32000, generator=g).requires_grad_(True)
labels = torch.randint(0, 32000, (1, 4096), generator=g)
import os
base = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20  # resident now, MB
fn(x, labels).sum().backward()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base)  # peak during the pass above that
"""


def bench_logprob_memory(reps: int) -> None:
    import subprocess

    row = []
    for label, old in (("slices + autograd", True), ("one function, fused backward", False)):
        code = _LOGPROB_MEMORY.format(repo=str(REPO), bench=str(REPO / "bench"), old=old)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        if out.returncode:
            raise RuntimeError(out.stderr[-2000:])
        row.append(f"{label} {float(out.stdout.strip().splitlines()[-1]):7.0f} MB")
    print("log-probs of (1, 4096, 32000) float32 logits (500 MB), forward + backward, peak RSS above the logits: "
          + "   ".join(row))


_RAY_CALL = """
import statistics, sys, time, ray, torch
sys.path.insert(0, {repo!r})
from rlhf_core.protocol import Batch
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
@ray.remote
class Echo:
    def call(self, batch):
        return batch
echo = Echo.remote()
batch = Batch({{k: torch.randint(0, 2000, (32, 216)) for k in ("input_ids", "attention_mask", "position_ids",
                                                              "responses")}}, {{}}, {{}})
ray.get(echo.call.remote(batch))
times = []
for _ in range({reps}):
    t = time.perf_counter()
    ray.get(echo.call.remote(batch))
    times.append(time.perf_counter() - t)
print(statistics.median(times) * 1e3)
ray.shutdown()
"""


def bench_raycall(reps: int) -> None:
    import subprocess

    from rlhf_core.distributed.ray_init import EMBEDDED_RAY_ENV

    code = _RAY_CALL.format(repo=str(REPO), reps=reps)
    row = []
    for label, size in (("Ray's default 100 KiB", "102400"),
                        ("ray_init's 10 MiB", EMBEDDED_RAY_ENV["RAY_max_direct_call_object_size"])):
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_max_direct_call_object_size": size}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        if out.returncode:
            raise RuntimeError(out.stderr[-2000:])
        row.append(f"{label} {float(out.stdout.strip().splitlines()[-1]):6.2f} ms")
    print("Ray call round trip, 220 KB batch each way: " + "   ".join(row))


_RAGGED = (32, 180, 128)  # rows, prompt width, response width of the packing benchmarks


def _ragged_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``(32, 308)`` int64: prompts of 60-180 tokens left-padded in the first 180
    columns, responses of 32-128 right-padded after them (seeded)."""
    g = torch.Generator().manual_seed(0)
    b, P, T = _RAGGED
    p_len, r_len = torch.randint(60, P + 1, (b,), generator=g), torch.randint(32, T + 1, (b,), generator=g)
    cols = torch.arange(P + T)[None]
    mask = ((cols >= P - p_len[:, None]) & (cols < P + r_len[:, None])).long()
    return torch.randint(1, 2000, (b, P + T), generator=g) * mask, mask


def bench_packing(reps: int, sizes: tuple[str, ...] = ("1m", "20m")) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlhf_core.protocol import Batch
    from rlhf_core.kernels import packing
    from rlhf_core.workers import actor

    b, P, T = _RAGGED
    ids, mask = _ragged_rows()
    rep = torch.arange(b) // 4 * 4  # rows 4k..4k+3 continue row 4k's prompt
    ids_n, mask_n = torch.cat([ids[rep, :P], ids[:, P:]], 1), torch.cat([mask[rep, :P], mask[:, P:]], 1)
    batches = [(name, Batch({"input_ids": i, "attention_mask": m, "position_ids": (m.cumsum(-1) - 1).clamp(min=0)},
                            {}, {})) for name, i, m in (("32 distinct prompts", ids, mask), ("8 prompts x 4", ids_n, mask_n))]
    varlen = packing.supports_varlen_attention
    never = lambda model: False  # noqa: E731
    # (label, packed, varlen check, shared prefix allowed in the path chosen for the model)
    variants = {"32 distinct prompts": (("padded", False, varlen, True), ("transformers packed", True, never, True),
                                        ("varlen packed", True, varlen, True)),
                "8 prompts x 4": (("shared prefix", False, varlen, True),
                                  ("shared prefix, packed prompts", True, varlen, True),
                                  ("varlen packed", True, varlen, False))}
    for name, size in ((k, _PACKING_SIZES[k]) for k in sizes):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=2000, **size)).train()
        for label, mb in batches:
            def step(packed: bool, shared: bool) -> None:
                model.zero_grad(set_to_none=True)
                chosen = actor.choose_response_forward(model, packed)
                path = dataclasses.replace(chosen, shared_prefix=chosen.shared_prefix and shared)
                logits = actor.forward_response_logits(model, mb, T, path=path)
                lp = torch.log_softmax(logits.float(), -1).gather(-1, mb["input_ids"][:, -T:, None])
                lp.mul(mb["attention_mask"][:, -T:, None]).sum().backward()

            def run(packed: bool, varlen_check, shared: bool) -> None:
                packing.supports_varlen_attention = varlen_check
                try:
                    step(packed, shared)
                finally:
                    packing.supports_varlen_attention = varlen

            fns = [lambda v=v: run(*v[1:]) for v in variants[label]]
            row = list(zip((v[0] for v in variants[label]), _interleaved_median_ms(fns, max(3, reps // 10))))
            valid = int(mb["attention_mask"].sum())
            print(f"response-logits forward + backward, {name:>3}, {label}, {valid} of {mb['attention_mask'].numel()} "
                  "positions valid: " + "   ".join(f"{v} {ms:8.1f} ms" for v, ms in row)
                  + "   (" + ", ".join(f"{row[0][0]} / {v} {row[0][1] / ms:.2f}x" for v, ms in row[1:]) + ")")


def bench_rm_packing(reps: int, sizes: tuple[str, ...] = ("1m", "20m")) -> None:
    """The reward model's scoring forward (no gradient), padded against ``use_remove_padding``'s varlen pack, on
    32 distinct rows of 60-180 prompt and 32-128 response tokens (the first batch of :func:`bench_packing`)."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from rlhf_core.kernels import packing

    ids, mask = _ragged_rows()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    for name, size in ((k, _PACKING_SIZES[k]) for k in sizes):
        torch.manual_seed(0)
        rm = Qwen2ForSequenceClassification(Qwen2Config(vocab_size=2000, num_labels=1, pad_token_id=0, **size)).eval()
        packed_ids, packed_pos, index = packing.pack_inputs(ids, mask, pos)
        with torch.no_grad():
            padded = _median_ms(lambda: rm(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False),
                                max(3, reps // 10))
            packed = _median_ms(lambda: packing.packed_forward(rm, mask, index, packed_ids, packed_pos),
                                max(3, reps // 10))
        print(f"reward-model forward (no grad), {name:>3}, {int(mask.sum())} of {mask.numel()} positions valid: "
              f"padded {padded:8.1f} ms   varlen packed {packed:8.1f} ms   ({padded / packed:.2f}x)")


def bench_attention(reps: int, sizes: tuple[str, ...] = ("1m", "20m")) -> None:
    """bf16 attention on CPU: transformers' SDPA (torch's CPU flash kernel) against ``matmul_attention``, forward and
    backward, on the update's shapes at each size's heads: the response pass of 8 prompts × 4 (32 rows of 128
    queries against 180 prompt columns, left padding masked, and the response causal) and a packed prompt pass's
    grid (8 rows of 180 causal). Float32 too, where SDPA is kept. Then, for a bf16 copy of a float32 model, the
    response log-probs' distance from the float32 model's with each attention, and the whole response-logits forward
    and backward (the shared prefix with packed prompts, as in ``packing``) with each."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from rlhf_core.protocol import Batch
    from rlhf_core.kernels import packing
    from rlhf_core.workers import actor
    from rlhf_core.kernels.matmul_attention import matmul_attention

    b, P, T = _RAGGED
    ids, mask = _ragged_rows()
    rep = torch.arange(b) // 4 * 4
    ids, mask = torch.cat([ids[rep, :P], ids[:, P:]], 1), torch.cat([mask[rep, :P], torch.ones_like(mask[:, P:])], 1)
    cols = torch.arange(P + T)
    causal = cols[None, :] <= (P + torch.arange(T))[:, None]
    response_mask = (causal[None] & mask[:, None, :].bool())[:, None]  # (32, 1, 128, 308)
    for name, size in ((k, _PACKING_SIZES[k]) for k in sizes):
        H, KV = size["num_attention_heads"], size["num_key_value_heads"]
        d = size["hidden_size"] // H
        module = torch.nn.Module()
        module.num_key_value_groups, module.is_causal = H // KV, True
        for dtype in (torch.bfloat16, torch.float32):
            for label, (rows, q, k), m in (("response pass", (b, T, P + T), response_mask),
                                           ("prompt grid", (b // 4, P, P), None)):
                g = torch.Generator().manual_seed(0)
                qkv = [torch.randn(rows, h, n, d, generator=g).to(dtype).requires_grad_()
                       for h, n in ((H, q), (KV, k), (KV, k))]
                grad = torch.randn(rows, q, H, d, generator=g).to(dtype)
                fns = [lambda fn=fn: fn(module, *qkv, m)[0].backward(grad)
                       for fn in (sdpa_attention_forward, matmul_attention)]
                sdpa_ms, mm_ms = _interleaved_median_ms(fns, max(5, reps // 5))
                print(f"attention forward + backward, {name:>4} ({H} heads, {KV} kv, d {d}), {str(dtype)[6:]:8s} "
                      f"{label} ({rows}, {q}, {k}): SDPA {sdpa_ms:8.2f} ms   matmul {mm_ms:8.2f} ms   "
                      f"({sdpa_ms / mm_ms:.2f}x)")
        torch.manual_seed(0)
        exact = Qwen2ForCausalLM(Qwen2Config(vocab_size=2000, **size)).train()
        model = copy.deepcopy(exact).to(torch.bfloat16)
        mb = Batch({"input_ids": ids * mask, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
                   {}, {})
        prefers = packing.prefers_matmul_attention

        def logprobs(m, use_matmul: bool) -> torch.Tensor:  # (32, 128) float32, with grad
            packing.prefers_matmul_attention = prefers if use_matmul else (lambda *a: False)
            try:
                logits = actor.forward_response_logits(m, mb, T, use_remove_padding=True)
            finally:
                packing.prefers_matmul_attention = prefers
            return torch.log_softmax(logits.float(), -1).gather(-1, mb["input_ids"][:, -T:, None])[..., 0]

        with torch.no_grad():
            ref = logprobs(exact, False)
            err = [(logprobs(model, use) - ref).abs() for use in (False, True)]
        print(f"response log-probs, bf16 against the float32 model, {name:>4}: SDPA max {float(err[0].max()):.4f} "
              f"mean {float(err[0].mean()):.5f}   matmul max {float(err[1].max()):.4f} mean {float(err[1].mean()):.5f} "
              "(nats)")

        def step(use_matmul: bool) -> None:
            model.zero_grad(set_to_none=True)
            logprobs(model, use_matmul).sum().backward()

        sdpa_ms, mm_ms = _interleaved_median_ms([lambda: step(False), lambda: step(True)], max(3, reps // 10))
        print(f"response-logits forward + backward, bf16, {name:>4}, 8 prompts x 4 x {T} (shared prefix, packed "
              f"prompts): SDPA {sdpa_ms:8.1f} ms   matmul {mm_ms:8.1f} ms   ({sdpa_ms / mm_ms:.2f}x)")


def bench_gather(reps: int) -> None:
    """The shared prefix's per-row copy of its prompt's keys (``shared_prefix_logits``): 8 prompts' ``(8, 2, 184,
    64)`` keys (a 20 M layer's) gathered to 32 rows, forward and backward (the backward sums each prompt's 4 rows),
    by indexing (``keys[inverse]``: backward ``index_put_`` with accumulation) and by ``index_select`` (backward
    ``index_add_``), bf16 and float32."""
    u, s, KV, P, d = 8, 4, 2, 184, 64
    inverse = torch.arange(u * s) // s
    for dtype in (torch.bfloat16, torch.float32):
        g = torch.Generator().manual_seed(0)
        keys = torch.randn(u, KV, P, d, generator=g).to(dtype).requires_grad_()
        grad = torch.randn(u * s, KV, P, d, generator=g).to(dtype)
        index_ms, select_ms = _interleaved_median_ms([lambda: keys[inverse].backward(grad),
                                                      lambda: keys.index_select(0, inverse).backward(grad)], reps)
        print(f"shared-prefix key gather forward + backward, {str(dtype)[6:]:8s} (8, 2, 184, 64) -> 32 rows: "
              f"indexing {index_ms:7.2f} ms   index_select {select_ms:7.2f} ms   ({index_ms / select_ms:.1f}x)")


def _bench_linear(reps: int, sizes: tuple[str, ...]) -> None:
    from bench_linear import bench_linear  # bench/bench_linear.py: the linear layers' products, in its own file

    bench_linear(reps, sizes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="sampling,adamw,entropy,logprob,logprob_memory,raycall,packing,rm_packing,"
                    "attention,gather,linear")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--packing-sizes", default="1m,20m", help="model sizes of packing, rm_packing, attention and linear, "
                    f"of {','.join(_PACKING_SIZES)}")
    args = ap.parse_args(argv)
    from rlhf_core import kernels

    kernels.install()  # the attention functions a worker registers at set-up (packing, matmul attention)
    sizes = tuple(k.strip() for k in args.packing_sizes.split(","))
    unknown = [k for k in sizes if k not in _PACKING_SIZES]
    if unknown:
        raise SystemExit(f"--packing-sizes: unknown size(s) {unknown}; choose from {list(_PACKING_SIZES)}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"1-min load {os.getloadavg()[0]:.2f}")
    for name in args.only.split(","):
        {"sampling": bench_sampling, "adamw": bench_adamw, "entropy": bench_entropy, "logprob": bench_logprob,
         "logprob_memory": bench_logprob_memory, "raycall": bench_raycall,
         "packing": lambda reps: bench_packing(reps, sizes),
         "rm_packing": lambda reps: bench_rm_packing(reps, sizes),
         "attention": lambda reps: bench_attention(reps, sizes), "gather": bench_gather,
         "linear": lambda reps: _bench_linear(reps, sizes)}[name.strip()](args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``use_dynamic_bsz`` on two real FSDP2 ranks (gloo, two spawned processes) whose token budgets cut their rows
into different numbers of micro-batches.

FSDP2 all-gathers the parameters in every forward and reduce-scatters the gradients in every backward, so each
rank must run as many micro-batches as the others: before the fix, rank 0 (4 long rows, a budget of one row)
ran 4 micro-batches and rank 1 (4 short rows, all within one budget) ran 1, and the run died in a gather
("Connection closed by peer"). Now both run 4, and the sharded gradient equals the gradient of the two ranks'
summed losses averaged (FSDP2 averages over ranks), computed here on an unsharded copy of the same model. A
budget below one rank's rows fails on both ranks (the other rank does not wait in a collective).
"""
from __future__ import annotations

import os
import socket

import torch

WIDTH, BUDGET = 24, 24  # rank 0: rows of 24 valid tokens (one per micro-batch); rank 1: rows of 5 (all in one)
LENGTHS = {0: [24, 24, 24, 24], 1: [5, 5, 5, 5]}


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2))


def _rows(rank: int):
    """``(input_ids, attention_mask)`` ``(4, WIDTH)`` of ``rank``'s shard, right-padded to its ``LENGTHS``."""
    g = torch.Generator().manual_seed(rank)
    mask = (torch.arange(WIDTH)[None] < torch.tensor(LENGTHS[rank])[:, None]).long()
    return torch.randint(1, 64, (4, WIDTH), generator=g) * mask, mask


def _loss(model, ids, mask):
    """Σ next-token log-probability over valid positions (a stand-in for the policy loss)."""
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, :-1].float(), -1)
    return (logp.gather(-1, ids[:, 1:, None])[..., 0] * mask[:, 1:]).sum()


def _rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from rlhf_core.protocol import Batch
    from rlhf_core.workers import batching
    from rlhf_core.workers.fsdp_utils import apply_fsdp2

    # each rank's output to its own file: with pytest's captured stderr inherited, a rank aborted in 2 of 12 runs
    # ("terminate called without an active exception"); with its own file, in none of 26
    log = open(os.path.join(out, f"rank_{rank}.log"), "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    from rlhf_core.distributed.worker_group import rendezvous_store

    # the store on 127.0.0.1 only (env:// would listen on every interface)
    dist.init_process_group("gloo", store=rendezvous_store(rank, world, "127.0.0.1", port), rank=rank, world_size=world)
    try:
        model = apply_fsdp2(_model(), {"wrap_policy": {"min_num_params": 0}}, "actor")
        ids, mask = _rows(rank)
        mbs = batching.micro_batches(Batch({"input_ids": ids, "attention_mask": mask}), None, True, BUDGET,
                                     "ppo_max_token_len_per_gpu")
        for mb in mbs:
            _loss(model, mb["input_ids"], mb["attention_mask"]).backward()
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        if rank == 0:
            torch.save(grads, os.path.join(out, "grads.pt"))
        torch.save([mb["attention_mask"].sum(-1).tolist() for mb in mbs], os.path.join(out, f"mbs_{rank}.pt"))
        try:  # a budget below rank 0's rows: both ranks raise, neither waits for the other
            batching.micro_batches(Batch({"input_ids": ids, "attention_mask": mask}), None, True, 20,
                                   "ppo_max_token_len_per_gpu")
        except ValueError as exc:
            torch.save(str(exc), os.path.join(out, f"error_{rank}.pt"))
        dist.barrier()  # neither rank tears gloo down while the other still talks (it aborted a run without this)
    finally:
        dist.destroy_process_group()


def test_ranks_run_the_same_number_of_micro_batches_and_the_gradient_is_the_mean(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.start_processes(_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    finally:
        for log in sorted(tmp_path.glob("rank_*.log")):
            print(f"--- {log.name}\n{log.read_text()[-3000:]}")  # shown by pytest when the test fails
    # rank 0: one 24-token row per micro-batch (4); rank 1: its 20 tokens fit one budget, split to 4 to match
    assert torch.load(tmp_path / "mbs_0.pt") == [[24], [24], [24], [24]]
    assert torch.load(tmp_path / "mbs_1.pt") == [[5], [5], [5], [5]]
    assert torch.load(tmp_path / "error_0.pt").startswith("ppo_max_token_len_per_gpu=20 is smaller than a sequence "
                                                          "of 24 tokens")
    assert torch.load(tmp_path / "error_1.pt").startswith("ppo_max_token_len_per_gpu=20 is smaller than a sequence "
                                                          "on another rank")
    model = _model()
    ((_loss(model, *_rows(0)) + _loss(model, *_rows(1))) / 2).backward()
    got = torch.load(tmp_path / "grads.pt")
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)

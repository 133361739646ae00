"""Ulysses sequence parallelism (``ulysses_sequence_parallel_size=2``) on two real FSDP2 ranks (gloo, two spawned
processes) against one rank without it: the same log-probs and entropies, the same update (metrics and weights),
for the actor; the same values and update for the critic; the same SFT loss, gradient norm and step. The same
two ranks run the all-to-all layout checks of ``ulysses_layout.py`` (one start-up of two processes for all).

The two ranks form one SP group (dp = 1): each gets half of the rows, as the worker group's dispatch gives them,
gathers the group's rows (``gather_rows``), runs every packed micro-batch split over both ranks (each rank its
half of the tokens; the attention exchanges heads for tokens by all-to-all) and keeps its own half of the outputs.

Tolerance: float32 throughout. The per-head attention, the projections and the head run on the same numbers as
the one-rank forward (the SP=2 logits equal the plain packed ones exactly here; tests/rlhf_core/distributed/
test_ulysses_layout.py), but each rank back-propagates its half of the tokens and FSDP sums the two partial
gradients: a different summation order over a sum of ~100 float32 terms of magnitude ≤ 1, rounding at most a
few ulps (~1e-7 relative each). ``atol=1e-5`` is far below what a wrong layout or a wrong scale gives (a token
attending to the wrong half, or a gradient counted twice, moves values by 1e-2 and more: checked by breaking
the all-to-all by hand while writing this test).
"""
from __future__ import annotations

import os
import socket

import pytest
import torch

from rlhf_core.protocol import Batch

pytestmark = pytest.mark.slow  # two spawned gloo ranks importing torch + transformers (once for the module)

P, T, B = 7, 5, 4
LR = 0.1


def _model(value_head: bool = False, prepare: bool = True):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, num_labels=1,
                      classifier_dropout=0.0)  # no dropout, as the loaders (a random mask would differ per run)
    cfg._attn_implementation = "sdpa"
    model = (Qwen2ForTokenClassification if value_head else Qwen2ForCausalLM)(cfg)
    if prepare:
        from rlhf_core import kernels

        kernels.prepare(model, "use_remove_padding")
    return model


def _batch() -> Batch:
    """``B`` rows of left-padded prompts (lengths 7, 4, 6, 2) and right-padded responses (lengths 5, 3, 5, 1):
    31 valid tokens in all (odd: the pack of a micro-batch of rows 0-1, 19 tokens, needs one padding token)."""
    g = torch.Generator().manual_seed(3)
    plen, rlen = torch.tensor([7, 4, 6, 2]), torch.tensor([5, 3, 5, 1])
    pmask = (torch.arange(P)[None] >= (P - plen)[:, None]).long()
    rmask = (torch.arange(T)[None] < rlen[:, None]).long()
    mask = torch.cat([pmask, rmask], 1)
    ids = torch.randint(1, 64, (B, P + T), generator=g) * mask
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0),
                  "responses": ids[:, P:], "response_mask": rmask,
                  "old_log_probs": -torch.rand(B, T, generator=g) * 4, "advantages": torch.randn(B, T, generator=g),
                  "values": torch.randn(B, T, generator=g), "returns": torch.randn(B, T, generator=g)},
                 meta={"temperature": 1.0})


def _config():
    from rlhf_core.config import load_config

    return load_config("ppo_trainer", ["actor_rollout_ref.model.path=unused", "critic.model.path=unused",
                                       "actor_rollout_ref.actor.entropy_coeff=0.01",
                                       "actor_rollout_ref.actor.grad_clip=1e9",
                                       "critic.grad_clip=1e9", "actor_rollout_ref.actor.ppo_epochs=1",
                                       "critic.ppo_epochs=1"])


def _run(sp, rank: int, world: int) -> dict:
    """Everything the test compares, computed on this rank: its rows' log-probs/entropies/values, the update's
    metrics, and the full weights after one update (plain SGD, ``lr`` 0.1: the weight change is the gradient)."""
    from rlhf_core.workers.actor import DataParallelPPOActor
    from rlhf_core.workers.critic import DataParallelPPOCritic
    from rlhf_core.workers.fsdp_utils import apply_fsdp2, full_state_dict

    cfg = _config()
    rows = _batch().chunk(world)[rank]
    out = {}
    shard = (lambda m, role: apply_fsdp2(m, {}, role)) if sp else (lambda m, role: m)  # one rank: the plain model
    actor_model = shard(_model(), "actor")
    actor = DataParallelPPOActor(cfg.actor_rollout_ref.actor, actor_model,
                                 torch.optim.SGD(actor_model.parameters(), LR),
                                 mini_batch_size=B // world * (sp.size if sp else 1), micro_batch_size=2,
                                 use_remove_padding=True, sp=sp)
    out["log_prob"], out["entropy"] = actor.compute_log_prob(rows, 2)
    out["actor_metrics"] = actor.update_policy(rows)
    out["actor_weights"] = {k: v.detach().clone() for k, v in full_state_dict(actor_model).items()}
    critic_model = shard(_model(value_head=True), "critic")
    critic = DataParallelPPOCritic(cfg.critic, critic_model, torch.optim.SGD(critic_model.parameters(), LR),
                                   mini_batch_size=B // world * (sp.size if sp else 1), micro_batch_size=2,
                                   use_remove_padding=True, sp=sp)
    out["values"] = critic.compute_values(rows)
    out["critic_metrics"] = critic.update_critic(rows)
    out["critic_weights"] = {k: v.detach().clone() for k, v in full_state_dict(critic_model).items()}
    return out


def _sft_batch() -> Batch:
    """4 right-padded SFT rows of 9, 4, 7 and 3 tokens (width 10), the loss on each row's tokens after the first 2."""
    g = torch.Generator().manual_seed(4)
    lens = torch.tensor([9, 4, 7, 3])
    mask = (torch.arange(10)[None] < lens[:, None]).long()
    loss_mask = mask * (torch.arange(10)[None] >= 2).long()
    return Batch({"input_ids": torch.randint(1, 64, (4, 10), generator=g) * mask, "attention_mask": mask,
                  "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0), "loss_mask": loss_mask})


def _sft_config(model_dir: str, sp: int):
    from tests.fixtures.config_fixtures import typed_config

    return typed_config("sft_trainer", f"model.partial_pretrain={model_dir}", "data.train_batch_size=4",
                        "data.micro_batch_size_per_gpu=1", "use_remove_padding=True", "optim.lr=1e-2",
                        "optim.warmup_steps_ratio=0", f"ulysses_sequence_parallel_size={sp}",
                        "trainer.n_gpus_per_node=2")


def _sft(config, rows: Batch) -> dict:
    from rlhf_core.trainer.sft_worker import SFTWorker
    from rlhf_core.workers.fsdp_utils import full_state_dict

    worker = SFTWorker(config, 4)
    worker.init_model()
    metrics = worker.train_step(rows)
    return {"sft_metrics": metrics,
            "sft_weights": {k: v.detach().clone() for k, v in full_state_dict(worker.model).items()}}


def _rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from rlhf_core.workers.ulysses import build_sequence_parallel
    from tests.rlhf_core.distributed.ulysses_layout import layout_results

    log = open(os.path.join(out, f"rank_{rank}.log"), "w")  # own file per rank (see test_workers_dynamic_bsz_ranks)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    torch.set_num_threads(1)
    from rlhf_core.distributed.worker_group import rendezvous_store

    dist.init_process_group("gloo", store=rendezvous_store(rank, world, "127.0.0.1", port), rank=rank, world_size=world)
    try:
        sp = build_sequence_parallel(2, "actor_rollout_ref.actor.ulysses_sequence_parallel_size")
        result = {"layout": layout_results(sp, rank), **_run(sp, rank, world),
                  **_sft(_sft_config(os.path.join(out, "model"), 2), _sft_batch().chunk(world)[rank])}
        torch.save(result, os.path.join(out, f"result_{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Both ranks' results (one spawn of two gloo ranks for every test here)."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("ulysses")
    _model(prepare=False).save_pretrained(out / "model")  # the SFT worker loads its model from a folder
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.start_processes(_rank, args=(2, port, str(out)), nprocs=2, join=True, start_method="spawn")
    finally:
        for log in sorted(out.glob("rank_*.log")):
            print(f"--- {log.name}\n{log.read_text()[-3000:]}")
    return [torch.load(out / f"result_{r}.pt") for r in range(2)] + [str(out / "model")]


def test_all_to_all_layout_gather_and_split_forward(ranks):
    from tests.rlhf_core.distributed.ulysses_layout import check_layout

    check_layout([ranks[0]["layout"], ranks[1]["layout"]])


def test_sp2_equals_one_rank_for_actor_and_critic(ranks):
    got = ranks[:2]
    want = _run(None, 0, 1)
    mask = _batch()["response_mask"].bool()
    for key in ("log_prob", "entropy", "values"):
        joined = torch.cat([got[0][key], got[1][key]])  # rank r holds rows 2r, 2r+1 (its dispatch shard)
        torch.testing.assert_close(joined[mask], want[key][mask], rtol=0, atol=1e-5, msg=key)
    for role in ("actor", "critic"):
        for r in range(2):  # every rank reports the mini-batch's metrics (grad_norm: the gradient's scale)
            assert got[r][f"{role}_metrics"].keys() == want[f"{role}_metrics"].keys()
            for k, v in want[f"{role}_metrics"].items():
                assert abs(got[r][f"{role}_metrics"][k] - v) <= 1e-5 * max(1.0, abs(v)), (role, k)
        before = {k: v for k, v in (_model(role == "critic").state_dict()).items()}
        moved = 0.0
        for k, w in want[f"{role}_weights"].items():
            torch.testing.assert_close(got[0][f"{role}_weights"][k], w, rtol=0, atol=1e-6, msg=k)
            moved = max(moved, float((w - before[k]).abs().max()))
        assert moved > 1e-3  # the update moved the weights (the comparison is not of two untouched copies)


def test_sft_sp2_equals_one_rank(ranks):
    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.trainer.sft_worker import SFTWorker
    from rlhf_core.workers.fsdp_utils import full_state_dict

    wg = LocalWorkerGroup(SFTWorker, {"config": _sft_config(ranks[2], 1), "total_steps": 4})
    try:
        wg.execute_all("init_model")
        want = wg.execute_dp("train_step", _sft_batch())[0]
        weights = {k: v.detach().clone() for k, v in full_state_dict(wg.worker.model).items()}
    finally:
        wg.shutdown()
    for r in range(2):
        got = ranks[r]["sft_metrics"]
        assert got["train/loss"] == pytest.approx(want["train/loss"], rel=1e-6)
        assert got["train/grad_norm"] == pytest.approx(want["train/grad_norm"], rel=1e-5)  # the gradient's scale
    # AdamW's first step is ~lr (1e-2) per weight whatever the gradient's size; a near-zero gradient's normalised
    # step may move by a few 1e-6 with the summation order (as tests/rlhf_core/trainer/test_sft_worker.py)
    for k, w in weights.items():
        torch.testing.assert_close(ranks[0]["sft_weights"][k], w, rtol=1e-4, atol=1e-5, msg=k)

"""Ulysses' all-to-all layout on two gloo ranks (spawned by test_ulysses_ranks.py) with hand-made tensors, the
gather of uneven blocks, the rows gathered and handed back, and the packed forward split over the two ranks
against the one-rank packed forward.

Hand-made input: element ``(h, s)`` of rank ``r``'s ``(1, H=4, n/2=3, d=1)`` query slice is ``100·h + 10·r + s``
(head ``h``, the rank's ``s``-th token, i.e. global token ``3r + s``). After :func:`seq_to_heads` rank ``r`` holds
heads ``2r, 2r+1`` for all 6 tokens, token ``t`` coming from rank ``t // 3``, position ``t % 3``, so its element
``(h', t)`` is ``100·(2r + h') + 10·(t // 3) + t % 3``.
"""
from __future__ import annotations

import torch


def _expected_heads(rank: int) -> torch.Tensor:
    return torch.tensor([[[100 * (2 * rank + h) + 10 * (t // 3) + t % 3] for t in range(6)] for h in range(2)],
                        dtype=torch.float32)[None]  # (1, 2, 6, 1)


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg)


def _pack():
    """Rows of 5, 2 and 4 valid tokens (left-padded to 6): 11 tokens, so the pack gets one padding token."""
    g = torch.Generator().manual_seed(5)
    lens = torch.tensor([5, 2, 4])
    mask = (torch.arange(6)[None] >= (6 - lens)[:, None]).long()
    return torch.randint(1, 32, (3, 6), generator=g) * mask, mask, torch.clamp(mask.cumsum(-1) - 1, min=0)


def layout_results(sp, rank: int) -> dict:
    """This rank's side of the layout checks (run inside test_ulysses_ranks.py's two spawned ranks: one start-up
    of two processes for every Ulysses test)."""
    from rlhf_core import kernels
    from rlhf_core.workers.ulysses import (gather_kept, gather_rows, heads_to_seq, own_rows, seq_to_heads,
                                               ulysses_packed_logits)
    from rlhf_core.protocol import Batch

    res = {"sp": (sp.size, sp.rank, sp.dp_size)}
    h, s = torch.meshgrid(torch.arange(4), torch.arange(3), indexing="ij")
    q = (100 * h + 10 * rank + s).float()[None, :, :, None].requires_grad_(True)  # (1, 4, 3, 1)
    heads = seq_to_heads(q, sp.group)
    res["heads"] = heads.detach()
    res["back"] = heads_to_seq(heads.transpose(1, 2), sp.group).transpose(1, 2).detach()  # inverse: q again
    (heads * (rank + 1)).sum().backward()  # d/dq: the weight of the rank that holds each head afterwards
    res["grad"] = q.grad
    block = torch.full((rank + 1, 2), float(rank), requires_grad=True)  # rank 0: 1 row, rank 1: 2 rows
    gathered = gather_kept(block, [1, 2], sp)
    res["gathered"] = gathered.detach()
    (gathered * torch.arange(3.0)[:, None]).sum().backward()
    res["block_grad"] = block.grad  # its own rows' weights only: no scaling
    rows = Batch({"x": torch.tensor([[rank * 10.0], [rank * 10.0 + 1]])})
    both = gather_rows(rows, sp)
    res["rows"], res["own"] = both["x"], own_rows(both, sp)["x"]
    kernels.install()
    res["logits"] = ulysses_packed_logits(_model(), *_pack(), sp, keep_last=3).detach()
    return res


def check_layout(got: list[dict]) -> None:
    """The assertions on both ranks' :func:`layout_results`."""
    from rlhf_core import kernels
    from rlhf_core.kernels.packing import packed_logits

    for r in range(2):
        assert got[r]["sp"] == (2, r, 1)
        assert torch.equal(got[r]["heads"], _expected_heads(r))
        h, s = torch.meshgrid(torch.arange(4), torch.arange(3), indexing="ij")
        assert torch.equal(got[r]["back"], (100 * h + 10 * r + s).float()[None, :, :, None])
        # heads 0-1 went to rank 0 (weight 1), heads 2-3 to rank 1 (weight 2), whichever rank held the token
        assert got[r]["grad"][0, :, :, 0].tolist() == [[1.0] * 3, [1.0] * 3, [2.0] * 3, [2.0] * 3]
        assert got[r]["gathered"].tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
        assert got[r]["rows"][:, 0].tolist() == [0.0, 1.0, 10.0, 11.0]  # group-rank order
        assert got[r]["own"][:, 0].tolist() == [10.0 * r, 10.0 * r + 1]
    assert got[0]["block_grad"].tolist() == [[0.0, 0.0]]  # row 0 of the gather, weight 0
    assert got[1]["block_grad"].tolist() == [[1.0, 1.0], [2.0, 2.0]]  # rows 1, 2: weights 1, 2
    # the split forward: the same logits on both ranks as one rank's packed forward (the same per-head arithmetic;
    # 1e-6 covers a different blocking of the projections over 6 instead of 12 tokens)
    kernels.install()
    want = packed_logits(_model(), *_pack(), keep_last=3)
    mask = _pack()[1][:, -3:].bool()
    assert mask.sum() == 8  # valid positions compared: row 1 has 2 tokens, only in the last 2 columns
    for r in range(2):
        torch.testing.assert_close(got[r]["logits"][mask], want[mask], rtol=0, atol=1e-6)
        assert torch.equal(got[r]["logits"][~mask], torch.zeros_like(got[r]["logits"][~mask]))

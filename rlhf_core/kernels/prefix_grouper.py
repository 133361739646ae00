"""verl's prefix-grouped forward (``actor_rollout_ref.actor.use_prefix_grouper``): one model call per group of rows
that share a prompt, the prompt's tokens in it once.

GRPO-style batches hold each prompt ``rollout.n`` times, consecutive rows with the same ``uid``. verl 0.9's
``verl/trainer/ppo/prefix_grouper_utils.py`` (with the external ``prefix_grouper`` package patched into the
attention functions) concatenates a group into one sequence ``[prompt, r_1, r_2, ...]`` in which the prompt
attends causally to itself ("prefix self-attention") and each response to the whole prompt and causally to itself
("suffix concat-attention"), so the prompt's tokens run through the layers once instead of ``n`` times. (In verl 0.9.0 no training worker
calls it: its legacy actor that did was removed, and the key only makes ``balance_batch`` move whole groups; here
the actor's and reference's passes run it, docs/SEMANTICS.md.)

Here the same sequence is built for transformers' own attention by a 4-D mask (transformers 5 passes a 4-D
``attention_mask`` to the attention functions as it is: ``masking_utils``): :func:`group_layout` lays group ``g``
out as one row of ``P + m·T`` columns, the prompt's ``P`` (left-padded) columns then ``m`` slots of ``T`` columns,
slot ``j`` holding row ``j`` of the group's response columns; :func:`block_mask` lets column ``q`` attend to
column ``k`` when ``k ≤ q``, ``k`` holds a token, and ``k`` is a prompt column or in ``q``'s slot. Every column
keeps the ``input_ids`` and ``position_ids`` it had in its row, so every valid token sees the same keys at the
same positions as in the plain forward: the logits are the plain forward's up to float rounding
(tests/rlhf_core/workers/test_workers_prefix_grouper.py: log-probs and gradients to 1e-5 in float32). Because every
slot sits at the same columns in every group, the LM head runs on the same ``1 + m·(T-1)`` columns of every
group (``logits_to_keep`` as an index tensor). Unlike the KV-cache shared prefix (``shared_prefix.py``) this is a
single forward, so it also runs with activation checkpointing.

Groups are the rows of one ``uid`` wherever they sit in the micro-batch (verl's ``build_pg_from_micro_batch`` takes
runs of consecutive rows; a dynamic-bsz partition or ``actor.shuffle`` may interleave them), or without a ``uid``
column the rows with the same prompt columns; the logits come back in the micro-batch's row order. A group cut over
two micro-batches is two smaller groups, as exact, its prompt run once per piece. Rows of one ``uid`` whose prompts
differ are refused (verl would silently use the first row's prompt for all of them).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from rlhf_core.kernels.model_support import support

# attention implementations that apply a 4-D attention_mask as given (flash-attention kernels take none)
MASKED_ATTENTION = ("sdpa", "eager")


def check_attention(model: nn.Module) -> None:
    """Raise ``ValueError`` naming ``use_prefix_grouper`` unless ``model`` attends through an implementation that
    applies a 4-D ``attention_mask`` as given (:data:`MASKED_ATTENTION`; flash-attention kernels take none)."""
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in MASKED_ATTENTION:
        raise ValueError(f"actor_rollout_ref.actor.use_prefix_grouper=True needs an attention implementation that "
                         f"takes a 4-D mask ({', '.join(MASKED_ATTENTION)}); the model uses {impl!r}")


def uid_groups(prompt_key: torch.Tensor, uids: Sequence | None) -> list[list[int]]:
    """The groups of a micro-batch: ``[[row, ...], ...]``, the rows of each ``uid`` wherever they sit (or, without
    uids, the rows with equal ``prompt_key``), groups in the order of their first row, rows ascending.

    Rows need not be consecutive: a dynamic-bsz partition, ``actor.shuffle`` or a balance that moves rows may
    interleave groups, and a group cut over two micro-batches is two smaller groups (each exact, its prompt run
    once per piece).

    Args:
        prompt_key: ``(b, K)`` a row's prompt (its prompt columns of ``input_ids``, ``attention_mask`` and
            ``position_ids`` side by side).
        uids: the micro-batch's ``uid`` column (length ``b``), or ``None``.

    Raises:
        ValueError: two rows of one uid whose prompts differ (naming the rows and the uid).
    """
    b = prompt_key.shape[0]
    if uids is None:
        _, labels = torch.unique(prompt_key, dim=0, return_inverse=True)
        labels = labels.tolist()
    else:
        labels = [str(u) for u in uids]
    by_label: dict = {}
    for i in range(b):
        by_label.setdefault(labels[i], []).append(i)
    groups = list(by_label.values())  # dicts keep insertion order: the order of each group's first row
    if uids is not None:
        for rows in groups:
            first = prompt_key[rows[0]]
            for r in rows[1:]:
                if not bool((prompt_key[r] == first).all()):
                    raise ValueError(f"use_prefix_grouper: rows {rows[0]} and {r} of a micro-batch share uid "
                                     f"{uids[r]!r} but not their prompt; a group's rows must hold the same prompt")
    return groups


def group_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 response_length: int, groups: list[list[int]]):
    """The grouped rows: ``(ids, valid, pos, slot)`` each ``(G, P + m·T)`` and ``m`` (the largest group).

    Row ``g`` is the prompt columns ``[:P]`` of the group's first row, then for ``j < m`` the response columns
    ``[P:]`` of the group's ``j``-th row, ``groups[g][j]`` (all padding, ``valid`` 0, when the group has fewer rows).
    ``slot`` is ``-1`` on prompt columns and ``j`` on slot ``j``."""
    T = int(response_length)
    P = input_ids.shape[1] - T
    m = max(len(rows) for rows in groups)
    G, dev = len(groups), input_ids.device
    firsts = torch.tensor([rows[0] for rows in groups], device=dev)
    # the row in slot j of group g (a valid index: the group's first row where the group is shorter)
    slots = torch.tensor([[rows[j] if j < len(rows) else rows[0] for j in range(m)] for rows in groups], device=dev)
    present = torch.tensor([[j < len(rows) for j in range(m)] for rows in groups], device=dev)

    def lay(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[firsts, :P], x[slots.flatten(), P:].view(G, m * T)], 1)

    valid = lay(attention_mask.bool())
    valid[:, P:] &= present.repeat_interleave(T, 1)
    slot = torch.cat([torch.full((P,), -1, device=dev), torch.arange(m, device=dev).repeat_interleave(T)])
    return lay(input_ids), valid, lay(position_ids), slot.expand(G, -1), m


def block_mask(valid: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """``(G, 1, L, L)`` bool, True where query column ``q`` may attend to key column ``k``: ``k ≤ q`` (causal), the
    key holds a token (``valid``), and the key is a prompt column (``slot == -1``) or in the query's slot.

    Example (a 2-token prompt, two 2-column slots, the second response one token long; rows = queries)::

        p0 p1 a0 a1 b0 b1
        1  .  .  .  .  .    p0
        1  1  .  .  .  .    p1
        1  1  1  .  .  .    a0
        1  1  1  1  .  .    a1
        1  1  .  .  1  .    b0
        1  1  .  .  1  .    b1 (padding: its own key is masked, its output is not used)
    """
    L = valid.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=valid.device).tril()
    same = (slot[:, :, None] == slot[:, None, :]) | (slot[:, None, :] == -1)
    return (causal[None] & same & valid[:, None, :]).unsqueeze(1)


def prefix_grouped_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          position_ids: torch.Tensor, response_length: int, uids: Sequence | None = None
                          ) -> torch.Tensor:
    """Logits predicting the response tokens, ``(b, T, V)``, from one forward of the grouped rows
    (:func:`group_layout`, :func:`block_mask`); logit ``t`` of a row is the plain forward's ``logits[:, P-1+t]``
    where response token ``t`` is valid, 0 where it is padding (finite, and masked by ``response_mask``).

    Inputs ``(b, P+T)`` with prompts left-padded in ``[:, :P]`` and responses right-padded in ``[:, P:]``, 2-D
    ``position_ids``; ``uids`` the ``uid`` column (length ``b``) or ``None``.

    Raises:
        ValueError: a prompt without a token in its last column (not this project's left-padded layout), 3-D
            ``position_ids``, an attention implementation that does not take a 4-D mask (``MASKED_ATTENTION``), and
            from :func:`uid_groups`.
    """
    T = int(response_length)
    P = input_ids.shape[1] - T
    check_attention(model)
    impl = model.config._attn_implementation
    if position_ids.dim() != 2:
        raise ValueError(f"use_prefix_grouper: position_ids of shape {tuple(position_ids.shape)} (multimodal rope) "
                         "are not supported; only (b, S)")
    if P <= 0 or not bool(attention_mask[:, P - 1].all()):
        raise ValueError("use_prefix_grouper: every prompt must end in its last column (left padding); a row's "
                         f"column {P - 1} is padding")
    b = input_ids.shape[0]
    groups = uid_groups(torch.cat([input_ids[:, :P], attention_mask[:, :P], position_ids[:, :P]], 1), uids)
    ids, valid, pos, slot, m = group_layout(input_ids, attention_mask, position_ids, T, groups)
    mask = block_mask(valid, slot)
    if impl == "eager":  # eager adds the mask to the scores: 0 where attended, the dtype's minimum elsewhere
        dtype = model.get_input_embeddings().weight.dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    # the columns whose logits are used: the prompt's last, and in slot j its first T-1 (the last predicts nothing)
    keep = torch.cat([torch.tensor([P - 1]), P + (torch.arange(m)[:, None] * T + torch.arange(T - 1)).flatten()])
    keep = keep.to(ids.device)
    if support(model).logits_to_keep:
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                       logits_to_keep=keep).logits
    else:
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, keep]
    K = logits.shape[1]  # 1 + m·(T-1)
    # for row r (group g, slot j): the group's column 0 then the slot's T-1 columns, as indices into (G·K)
    index = torch.empty(b, T, dtype=torch.long)
    for g, rows in enumerate(groups):
        for j, r in enumerate(rows):
            index[r, 0] = g * K
            index[r, 1:] = g * K + 1 + j * (T - 1) + torch.arange(T - 1)
    out = logits.reshape(-1, logits.shape[-1]).index_select(0, index.flatten().to(logits.device))
    out = out.view(b, T, -1)
    # response token t (t ≥ 1) is predicted by token t-1, padding where the response ended: zero logits there
    tail = attention_mask[:, P:-1].bool() if T > 1 else attention_mask[:, :0].bool()
    used = torch.cat([torch.ones(b, 1, dtype=torch.bool, device=tail.device), tail], 1).to(out.device)
    return out * used.unsqueeze(-1).to(out.dtype)

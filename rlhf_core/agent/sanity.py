"""Tokenization sanity check of a multi-turn trajectory (verl ``multi_turn.tokenization_sanity_check_mode``).

A ``tool_agent`` trajectory is built turn by turn: the prompt's ids, each assistant turn's sampled ids, each
tool/user turn rendered alone (:func:`rlhf_core.agent.loops.render_turn`). Training sees those ids. This check
compares them, at the end of the trajectory, with one re-tokenization of the whole conversation
(``apply_chat_template(messages, tools=..., add_generation_prompt=False)``), as verl's
``AsyncRolloutRequest.finalize`` (``verl/workers/rollout/schemas.py``) does:

* ``strict``: any difference in the token ids is reported (verl compares the decoded texts; here the ids, so
  two tokenizations of the same text are reported too);
* ``ignore_strippable``: only a text difference that is not whitespace on both sides (``str.strip()`` empty) is
  reported; e.g. ChatML's ``"\\n"`` after an ``<|im_end|>`` that the incremental layout lacks (the assistant
  turn ends at the EOS the policy sampled) is ignored;
* ``disable``: no check.

A report is a warning, as in verl (training goes on). With ChatML templates ``strict`` reports every trajectory
that has a tool/user turn or ends with EOS (the ``"\\n"`` above); ``ignore_strippable`` is the useful mode there.
"""
from __future__ import annotations

import difflib
from typing import Any, Sequence

from rlhf_core.data.prompts import encode

SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")


def _context(text: str, start: int, end: int, chars: int = 10) -> str:
    return repr(text[max(0, start - chars): end + chars])


def tokenization_mismatch(tokenizer: Any, incremental_ids: Sequence[int], full_ids: Sequence[int], mode: str,
                          where: str, prompt_length: int = 0) -> str | None:
    """The message reporting how ``incremental_ids`` (the trajectory's prompt + response ids) differ from
    ``full_ids`` (the whole conversation re-tokenized), or ``None`` when ``mode`` accepts them.

    Args:
        mode: one of :data:`SANITY_CHECK_MODES`. where: names the trajectory (row) in the message.
        prompt_length: the prompt's token count, to give the first differing position in the response too.

    Returns:
        ``"<where>: ... first differing token at position k (response position k - prompt_length): incremental
        '...' vs full '...'"`` (``strict``) or ``"... first non-whitespace text difference at character c ..."``
        (``ignore_strippable``); ``None`` for equal ids, for ``disable``, and for whitespace-only differences
        under ``ignore_strippable``.

    Raises:
        ValueError: an unknown ``mode`` (naming the key and the choices).
    """
    if mode not in SANITY_CHECK_MODES:
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode={mode!r}: "
                         f"use one of {SANITY_CHECK_MODES}")
    incremental_ids, full_ids = list(incremental_ids), list(full_ids)
    if mode == "disable" or incremental_ids == full_ids:
        return None
    head = (f"{where}: the incrementally built token ids differ from a full re-tokenization of the conversation "
            f"(multi_turn.tokenization_sanity_check_mode={mode})")
    if mode == "strict":
        k = next((i for i, (a, b) in enumerate(zip(incremental_ids, full_ids)) if a != b),
                 min(len(incremental_ids), len(full_ids)))
        inc = tokenizer.decode(incremental_ids[k:k + 8], skip_special_tokens=False)
        full = tokenizer.decode(full_ids[k:k + 8], skip_special_tokens=False)
        return (f"{head}: first differing token at position {k} (response position {k - prompt_length}) of "
                f"{len(incremental_ids)} incremental / {len(full_ids)} full ids: incremental {inc!r} vs full {full!r}")
    inc_text = tokenizer.decode(incremental_ids, skip_special_tokens=False)
    full_text = tokenizer.decode(full_ids, skip_special_tokens=False)
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, full_text, inc_text, autojunk=False).get_opcodes():
        if tag != "equal" and (full_text[i1:i2].strip() or inc_text[j1:j2].strip()):
            return (f"{head}: first non-whitespace text difference at character {j1} of the incremental text: "
                    f"incremental {_context(inc_text, j1, j2)} vs full {_context(full_text, i1, i2)}")
    return None


def check_trajectory(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None,
                     prompt_ids: Sequence[int], response_ids: Sequence[int], last_turn_start: int,
                     eos_ids: set[int], mode: str, where: str) -> str | None:
    """:func:`tokenization_mismatch` of one trajectory against its conversation ``messages`` (the prompt's
    messages, then every assistant turn's decoded text and every kept tool/user turn, in order).

    A last assistant turn that does not end with an EOS id (cut by ``response_length``) has no closing in the
    ids while the template would close it; the check then covers the conversation up to that turn
    (``messages[:-1]`` with the generation prompt against ``prompt_ids + response_ids[:last_turn_start]``).
    """
    if mode == "disable":
        return None
    response_ids = list(response_ids)
    closed = bool(response_ids) and response_ids[-1] in eos_ids
    if not closed:
        messages, response_ids = messages[:-1], response_ids[:last_turn_start]
    text = tokenizer.apply_chat_template(list(messages), tools=tools, add_generation_prompt=not closed, tokenize=False)
    return tokenization_mismatch(tokenizer, list(prompt_ids) + response_ids, encode(tokenizer, text), mode, where,
                                 len(prompt_ids))

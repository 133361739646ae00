"""Reward-model worker (verl ``fsdp_workers.RewardModelWorker``): a frozen FSDP2 sequence-classification model
scoring each (prompt, response) with one scalar, written on the last valid response token (``rm_scores (B, T)``).

* Model: ``AutoModelForSequenceClassification`` with ``num_labels=1`` from ``reward_model.model.path`` (its
  ``pad_token_id`` set from the RM tokenizer when the checkpoint has none), parameters float32 (or
  ``fsdp_config.model_dtype``), no gradients, sharded with FSDP2 (``fsdp_config.min_num_params`` or
  ``wrap_policy.min_num_params``, ``param_offload``, ``fsdp_size``, ``reshard_after_forward``).
* Score of a sequence: the score head's output at the sequence's **last valid token** (last position with
  attention mask 1), read from the head's per-token output. (HF's own pooling picks the last token that is not
  ``pad_token_id``, which is wrong when EOS equals the pad id; verl's token-classification RM reads the same
  last-valid position as here.)
* Inputs: when ``reward_model.model.input_tokenizer`` is set and differs from the RM's tokenizer (vocabulary,
  special tokens or chat template), each row is re-templated (verl ``_switch_chat_template``): the valid response
  ids are decoded with the policy tokenizer, its EOS text removed, appended as an ``assistant`` turn to the row's
  ``raw_prompt`` messages (``data.return_raw_chat=True``), rendered with the RM tokenizer's chat template
  (``add_generation_prompt=False``), tokenized without extra special tokens, cut to ``reward_model.max_length``
  keeping the first tokens (verl's ``truncation='right'``; a warning is logged) — ``null`` means no limit, as the
  config documents (verl falls back to the policy's ``P + T``, which can cut the response off) — right-padded.
  Otherwise the policy's own ``input_ids``/``attention_mask``/``position_ids`` are scored.
* Micro-batches of ``reward_model.micro_batch_size_per_gpu`` rows (or by ``forward_max_token_len_per_gpu`` with
  ``use_dynamic_bsz``); rows keep their order.
* ``reward_model.model.use_remove_padding``: each micro-batch's valid tokens run as one packed sequence
  (:mod:`rlhf_core.kernels.packing`: per-sequence attention), and each row's score is read at its last token in
  the pack; the same scores as the padded forward to float rounding. A model without a ``score`` head keeps the
  padded forward (HF's pooling would pool the whole pack); a model whose packed forward is not known to equal the
  padded one is refused at start-up (:func:`~rlhf_core.kernels.packing.check_packing_support`).
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification

from rlhf_core.config.structured import full_key
from rlhf_core.kernels.packing import pack_inputs, packed_forward
from rlhf_core.models.loading import import_external_libs, load_tokenizer, local_path, to_torch_dtype
from rlhf_core.protocol import Batch
from rlhf_core.workers import batching
from rlhf_core.workers.fsdp_utils import device
from rlhf_core.workers.model_setup import micro_per_rank, prepare_role_model
from rlhf_core.workers.profiler import ProfiledWorker, profiled_stage

logger = logging.getLogger(__name__)


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers encode and template identically (vocabulary, special tokens, chat template)."""
    specials = ("bos_token", "eos_token", "pad_token", "unk_token")
    return (a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)
            and all(getattr(a, s, None) == getattr(b, s, None) for s in specials))


def last_valid_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(b,)`` int64: the last position with mask 1 in each row of ``attention_mask (b, L)`` (L−1 if none)."""
    L = attention_mask.shape[-1]
    return (L - 1 - attention_mask.flip(-1).ne(0).long().argmax(-1)).long()


def scores_on_last_response_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` float32 with ``scores (B,)`` at position ``max(L − 1, 0)``, ``L = response_mask.sum(-1)``, 0
    elsewhere (the reward managers' placement, so an empty response keeps its score on position 0)."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.ne(0).sum(-1) - 1).clamp(min=0).cpu()
    out[torch.arange(len(out)), last] = scores.float().cpu()
    return out


def right_padded(rows: list[list[int]], pad_token_id: int) -> Batch:
    """``input_ids``, ``attention_mask``, ``position_ids`` ``(b, max len)`` int64 from unpadded id lists."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)})


def load_reward_model(model_cfg: Any, pad_token_id: int | None, dtype: str | torch.dtype = "float32"):
    """``AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)`` on CPU, frozen, in eval mode."""
    import_external_libs(model_cfg.external_lib)
    try:
        path = local_path(str(model_cfg.path))
    except OSError as exc:  # FileNotFoundError included
        raise type(exc)(f"reward model: {full_key(model_cfg, 'path')}={model_cfg.path!r}: {exc}") from exc
    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=1, dtype=to_torch_dtype(dtype), trust_remote_code=bool(model_cfg.trust_remote_code))
    if model.config.pad_token_id is None and pad_token_id is not None:
        model.config.pad_token_id = int(pad_token_id)
    model.requires_grad_(False)
    return model.eval()


class RewardModelWorker(ProfiledWorker):
    """Scores generated sequences with a reward model; see the module docstring.

    Args:
        config: the full PPO config (``reward_model.*``, ``actor_rollout_ref.model.*``).
    """

    profiler_role, profiler_key = "reward_model", "reward_model.profiler"

    def __init__(self, config) -> None:
        self.config = config
        self.rm_cfg = config.reward_model
        self.module = self.tokenizer = self.input_tokenizer = None
        self.switch_chat_template = False
        self.use_remove_padding = False  # reward_model.model.use_remove_padding, where the model has a score head
        self._head_outputs: list[torch.Tensor] = []

    def init_model(self) -> None:
        """Load the RM tokenizer (and the policy's input tokenizer), the model, shard it, hook the score head.

        Raises:
            ValueError: both or neither of ``micro_batch_size_per_gpu`` / ``micro_batch_size`` without dynamic bsz.
        """
        cfg, mcfg = self.rm_cfg, self.rm_cfg.model
        trust = bool(mcfg.trust_remote_code)
        self.tokenizer = load_tokenizer(str(mcfg.path), trust)
        if mcfg.input_tokenizer:
            self.input_tokenizer = load_tokenizer(str(mcfg.input_tokenizer), trust)
            self.switch_chat_template = not same_tokenizer(self.input_tokenizer, self.tokenizer)
        self.dynamic = bool(cfg.use_dynamic_bsz)
        self.micro_batch_size = micro_per_rank(cfg, "micro_batch_size_per_gpu", "micro_batch_size", self.dynamic)
        fsdp = mcfg.fsdp_config  # verl's RM section has no model_dtype: the RM loads in float32
        model = load_reward_model(mcfg, self.tokenizer.pad_token_id, "float32")
        head = getattr(model, "score", None)
        if head is not None:  # the per-token scores, before HF pools them at the last non-pad token
            head.register_forward_hook(lambda _m, _i, out: self._head_outputs.append(out))
        else:
            logger.warning("reward model %s has no 'score' head: using its pooled logits (HF picks the last token that "
                           "is not pad_token_id)%s", type(model).__name__,
                           "; reward_model.model.use_remove_padding=True runs the padded forward" if
                           mcfg.use_remove_padding else "")
        self.use_remove_padding = bool(mcfg.use_remove_padding) and head is not None
        # min_num_params, or verl 0.6's spelling wrap_policy.min_num_params when only that one is set
        min_params = int(fsdp.min_num_params) or int(fsdp.wrap_policy.min_num_params)
        self.module = prepare_role_model(
            model, "reward_model", {"wrap_policy": {"min_num_params": min_params},
                                    "param_offload": bool(fsdp.param_offload), "fsdp_size": int(fsdp.fsdp_size),
                                    "reshard_after_forward": bool(fsdp.reshard_after_forward),
                                    "forward_prefetch": bool(fsdp.forward_prefetch)},
            full_key(mcfg, "use_remove_padding") if self.use_remove_padding else None)

    # ---- inputs --------------------------------------------------------------------------------------------
    def rm_inputs(self, batch: Batch) -> Batch:
        """The RM's ``input_ids``, ``attention_mask``, ``position_ids`` for this shard (see the module docstring).

        Raises:
            ValueError: re-templating is needed but the batch has no ``raw_prompt`` (``data.return_raw_chat``).
        """
        if not self.switch_chat_template:
            return Batch({k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")})
        if "raw_prompt" not in batch:
            raise ValueError("reward_model.model.input_tokenizer differs from the reward model's tokenizer, so the "
                             "chat is re-templated from the prompt messages: set data.return_raw_chat=True")
        src, dst = self.input_tokenizer, self.tokenizer
        responses = batch["responses"]
        lengths = _response_mask(batch).ne(0).sum(-1).tolist()
        max_length = self.rm_cfg.max_length
        rows = []
        for i in range(len(batch)):
            response = src.decode(responses[i, :int(lengths[i])].tolist())
            if src.eos_token:
                response = response.replace(src.eos_token, "")
            chat = [dict(m) for m in batch["raw_prompt"][i]] + [{"role": "assistant", "content": response}]
            text = dst.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
            ids = dst(text, add_special_tokens=False)["input_ids"]
            if max_length and len(ids) > int(max_length):
                logger.warning("reward model input of %d tokens cut to reward_model.max_length=%s",
                               len(ids), max_length)
                ids = ids[:int(max_length)]
            rows.append(ids)
        return right_padded(rows, dst.pad_token_id)

    # ---- compute -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _forward_micro_batch(self, mb: Batch) -> torch.Tensor:
        """``(b,)`` float32 CPU: the score at each row's last valid token (packed with ``use_remove_padding``).

        Raises:
            ValueError: packed, a row without a valid token (it has no last token to score), and from
                :func:`~rlhf_core.kernels.packing.pack_inputs`."""
        dev = device()
        ids, mask, pos = (mb[k].to(dev) for k in ("input_ids", "attention_mask", "position_ids"))
        self._head_outputs.clear()
        if self.use_remove_padding:
            lengths = mask.ne(0).sum(-1)
            if not bool(lengths.all()):
                raise ValueError(f"reward model, use_remove_padding: row {int((lengths == 0).nonzero()[0, 0])} of "
                                 "the micro-batch has no valid token (attention_mask all 0)")
            packed_ids, packed_pos, index = pack_inputs(ids, mask, pos)
            packed_forward(self.module, mask, index, packed_ids, packed_pos)
            per_token = self._head_outputs[-1][0]  # (n, 1), the packed tokens in row-major order
            self._head_outputs.clear()
            return per_token[lengths.cumsum(0) - 1, 0].float().cpu()  # each row's last token in the pack
        out = self.module(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        per_token = self._head_outputs[-1] if self._head_outputs else None
        self._head_outputs.clear()
        if per_token is None or per_token.dim() != 3:
            return out.logits.reshape(len(mask), -1)[:, 0].float().cpu()
        last = last_valid_index(mask)
        return per_token[torch.arange(len(mask), device=per_token.device), last, 0].float().cpu()

    @profiled_stage("compute_rm_score")
    def compute_rm_score(self, batch: Batch) -> Batch:
        """``Batch{rm_scores (B, T) float32}``: each row's RM score on its last valid response token, 0 elsewhere.

        Needs ``responses (B, T)``, ``input_ids``/``attention_mask``/``position_ids (B, P+T)``, ``response_mask``
        (else ``attention_mask[:, -T:]``) and, when re-templating, ``raw_prompt``."""
        if self.module is None:
            raise RuntimeError("RewardModelWorker.compute_rm_score before init_model")
        inputs = self.rm_inputs(batch)
        self.module.eval()
        scores = [self._forward_micro_batch(mb) for mb in batching.micro_batches(
            inputs, self.micro_batch_size, self.dynamic, self.rm_cfg.forward_max_token_len_per_gpu,
            "reward_model.forward_max_token_len_per_gpu")]
        return Batch({"rm_scores": scores_on_last_response_token(torch.cat(scores), _response_mask(batch))})


def _response_mask(batch: Batch) -> torch.Tensor:
    t = batch["responses"].shape[-1]
    return batch["response_mask"] if "response_mask" in batch else batch["attention_mask"][:, -t:]

"""Data-parallel PPO actor (verl ``DataParallelPPOActor``): log-probs and the clipped policy update.

Runs on every rank with this rank's shard; the model is FSDP2-sharded (or plain, for a single process).
Loss per mini-batch: ``pg_loss − entropy_coeff·entropy + kl_loss_coef·kl_loss`` with every term aggregated by
``loss_agg_mode`` over the *whole* mini-batch (global token/sequence counts all-reduced across ranks), so the
update does not depend on the micro-batch split or the world size.

``kl_loss_type: full`` uses the exact vocabulary KL(π_θ ‖ π_ref) per response token from full logits: the
reference model (``ref_model``, held by the same worker in role ``actor_rollout_ref``) runs forward on the same
micro-batch without gradients, both logits divided by the same temperature as the log-probs.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Mapping

import torch
from torch import nn

from rlhf_core.algos.kl import kl_penalty, kl_penalty_full
from rlhf_core.algos.utils import entropy_from_logits, logprobs_from_logits
from rlhf_core.algos.advantages_token_baseline import sum_pi_squared_from_logits
from rlhf_core.workers.ulysses import gather_rows, own_rows, sp_size_of, ulysses_packed_logits
from rlhf_core.protocol import Batch
from rlhf_core.workers import batching
from rlhf_core.workers.actor_loss import actor_micro_loss
from rlhf_core.workers.fsdp_utils import device
from rlhf_core.kernels import support
from rlhf_core.kernels.packing import packed_logits
from rlhf_core.kernels.prefix_grouper import check_attention, prefix_grouped_logits
from rlhf_core.kernels.shared_prefix import checkpointing_disables_cache, shared_prefix_logits
from rlhf_core.workers.on_policy import first_forward_is_old_log_prob
from rlhf_core.workers.pad_to_length import pad_bucket_of, pad_pack_to_bucket
from rlhf_core.workers.update_loop import UpdateSchedule, run_update

logger = logging.getLogger(__name__)
_COMPILED: dict[str, "_CompiledOrEager"] = {}
_CPU_EAGER_NOTED = False


class _CompiledOrEager:
    """``torch.compile(fn, dynamic=True)``; if compiling or running the compiled function raises, warn once and
    stay eager (same numbers, only slower) instead of failing the run."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.compiled = torch.compile(fn, dynamic=True)

    def __call__(self, *args, **kwargs):
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - compile back-ends fail in many ways; eager is always correct
                logger.warning("use_torch_compile: compiling %s failed (%s: %s); running it eagerly",
                               self.fn.__name__, type(exc).__name__, exc)
                self.compiled = None
        return self.fn(*args, **kwargs)


def hot_functions(use_torch_compile: bool):
    """``(logprobs_from_logits, entropy_from_logits)``, ``torch.compile``-d when ``use_torch_compile`` and CUDA is
    available (verl compiles ``entropy_from_logits`` the same way). On CPU they stay eager, logged once: on a
    few-core CPU the compile time outweighs the gain for these element-wise kernels."""
    global _CPU_EAGER_NOTED
    if not use_torch_compile:
        return logprobs_from_logits, entropy_from_logits
    if not torch.cuda.is_available():
        if not _CPU_EAGER_NOTED:
            logger.info("use_torch_compile=True: log-prob/entropy run eagerly on CPU (compiling costs more than it "
                        "saves on a few CPU cores); they are compiled on CUDA")
            _CPU_EAGER_NOTED = True
        return logprobs_from_logits, entropy_from_logits
    for fn in (logprobs_from_logits, entropy_from_logits):
        if fn.__name__ not in _COMPILED:
            _COMPILED[fn.__name__] = _CompiledOrEager(fn)
    return _COMPILED[logprobs_from_logits.__name__], _COMPILED[entropy_from_logits.__name__]


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (transformers causal LMs: the LM head then runs on the kept
    positions only); a token-classification value model does not (its head is ``hidden → 1``, cheap anyway)."""
    return support(model).logits_to_keep


@dataclass(frozen=True)
class ResponseForward:
    """The path :func:`forward_response_logits` takes for one model, chosen once (:func:`choose_response_forward`,
    at the actor's or critic's init) from the model's :class:`~rlhf_core.kernels.KernelSupport` and the device.

    Attributes:
        shared_prefix: run each distinct prompt of a micro-batch once when prompts repeat
            (:func:`~rlhf_core.kernels.shared_prefix.shared_prefix_logits`).
        packed: ``use_remove_padding``: the valid tokens packed (:func:`~rlhf_core.kernels.packing.packed_logits`).
        logits_to_keep: the model's forward takes ``logits_to_keep`` (the LM head runs on the wanted positions).
        active_dropout: the model drops in train mode (its forward must then not depend on the micro-batch's shape).
        device: where the micro-batch is moved (``fsdp_utils.device``).
        pad_bucket: ``fsdp_config.pad_to_length`` on: a packed forward's token count is rounded up to a multiple of
            ``fsdp_config.pad_to_length_bucket`` (:func:`pad_pack_to_bucket`); ``None``: off.
        prefix_grouper: ``actor.use_prefix_grouper``: every micro-batch runs verl's prefix-grouped forward, one
            model call with each group's prompt once (:func:`~rlhf_core.kernels.prefix_grouper.prefix_grouped_logits`).
        sp: the role's :class:`~rlhf_core.workers.ulysses.SequenceParallel` (``ulysses_sequence_parallel_size``
            > 1): the packed forward is split over its group (no shared prefix); ``None``: one rank runs it whole.
    """
    shared_prefix: bool
    packed: bool
    logits_to_keep: bool
    active_dropout: bool
    device: torch.device
    pad_bucket: int | None = None
    prefix_grouper: bool = False
    sp: Any = None


def choose_response_forward(model: nn.Module, use_remove_padding: bool,
                            pad_bucket: int | None = None, prefix_grouper: bool = False,
                            sp: Any = None) -> ResponseForward:
    """The :class:`ResponseForward` of ``model``: packed when ``use_remove_padding``; the shared prefix where the
    model supports it, except packed on GPU (packed or not, on CPU a prompt that repeats runs once, rollout.n > 1:
    less arithmetic than packing saves, BENCHMARKS.md "`use_remove_padding`"; on GPU use_remove_padding packs as
    verl does); ``prefix_grouper`` (``actor.use_prefix_grouper``) takes verl's prefix-grouped forward instead.

    Raises:
        ValueError: ``prefix_grouper`` with an ``sp`` (the grouped forward is not split over an SP group; the config
            load refuses it first, ``config/prefix_grouper.py``); from ``check_attention`` under ``prefix_grouper``.
    """
    if prefix_grouper and sp is not None:
        raise ValueError(f"actor_rollout_ref.actor.use_prefix_grouper=True with ulysses_sequence_parallel_size="
                         f"{sp.size}: the grouped forward is not split over the SP group; set one of them off")
    described, dev = support(model), device()
    if prefix_grouper:  # refused at init, before any batch: the grouped forward needs a 4-D attention mask
        check_attention(model)
    return ResponseForward(shared_prefix=described.shared_prefix and not (use_remove_padding and dev.type != "cpu")
                           and sp is None,
                           packed=bool(use_remove_padding), logits_to_keep=described.logits_to_keep,
                           active_dropout=described.active_dropout, device=dev,
                           pad_bucket=pad_bucket if use_remove_padding else None, prefix_grouper=bool(prefix_grouper),
                           sp=sp)


def trim_left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop the leading columns that are padding in every row of a micro-batch.

    Prompts arrive left-padded to ``data.max_prompt_length`` (verl's layout), so a micro-batch whose longest prompt
    is shorter carries columns no row attends to. Their removal leaves every valid position's output unchanged:
    positions come from ``position_ids``, and a masked key adds exactly 0 to the attention softmax. The response
    columns are the last ones, so slices taken from the end (``[:, -T-1:-1]``) are unaffected.

    Args:
        input_ids, attention_mask: ``(b, S)`` int64 (``attention_mask`` 1 on valid tokens); position_ids: ``(b, S)``
            (or ``(b, 3, S)``: the last dimension is cut).

    Returns:
        The three tensors as ``(b, S - k)`` views, ``k`` = the number of leading columns whose mask is 0 in every
        row (0 when the first column holds a token, or when no row holds any).
    """
    k = int(attention_mask.any(dim=0).int().argmax()) if attention_mask.numel() else 0
    return input_ids[:, k:], attention_mask[:, k:], position_ids[..., k:]  # (b, S) or mrope's (b, 3, S)


def forward_response_logits(model: nn.Module, mb: Batch, response_length: int, use_remove_padding: bool = False,
                            path: ResponseForward | None = None) -> torch.Tensor:
    """Logits predicting the response tokens: ``logits[:, P-1 : P+T-1]`` → ``(b, T, V)`` (ARCHITECTURE alignment).

    Inputs ``input_ids``, ``attention_mask``, ``position_ids`` of shape ``(b, P+T)``; ``use_remove_padding`` runs
    the valid tokens packed (:mod:`rlhf_core.kernels.packing`; same values, 0 at pads), except on CPU for a
    micro-batch whose prompts repeat, which takes the shared-prefix path below (faster there; its prompt pass then
    runs packed where the model attends per sequence: ``packing.supports_varlen_attention``). The padded forward stops
    before the last position (its logits predict nothing used; not under active dropout), and when the model takes
    ``logits_to_keep`` the LM head runs on the ``T`` positions wanted only (the prompt's logits are never used:
    ``(V / hidden)``-times the hidden state's size per position saved, forward and backward). Columns that are
    padding in every row are dropped first (:func:`trim_left_padding`), and a prompt that repeats in the
    micro-batch runs once (:func:`~rlhf_core.kernels.shared_prefix.shared_prefix_logits`), both except while a model
    with active dropout trains: its dropout masks are drawn per element, so a width or a prompt pass that depends on
    the micro-batch would make the update depend on the micro-batch split (our loaders turn dropout off; a user's
    model may not).

    ``path``: the model's :class:`ResponseForward`, chosen once by its actor or critic; without it, it is chosen
    here from ``use_remove_padding`` (which it otherwise overrides)."""
    if path is None:
        path = choose_response_forward(model, use_remove_padding)
    ids, mask, pos = mb["input_ids"], mb["attention_mask"], mb["position_ids"]
    batch_free = not (model.training and path.active_dropout)  # outputs may not depend on the micro-batch's shape
    if batch_free:
        ids, mask, pos = trim_left_padding(ids, mask, pos)
    ids, mask, pos = ids.to(path.device), mask.to(path.device), pos.to(path.device)
    if path.prefix_grouper and response_length > 0:  # one call per micro-batch: the shapes never depend on dropout
        return prefix_grouped_logits(model, ids, mask, pos, response_length, mb["uid"] if "uid" in mb else None)
    keep = response_length + 1 if path.logits_to_keep else None
    if batch_free and path.shared_prefix and not checkpointing_disables_cache(model):
        # None when no prompt repeats; use_remove_padding runs its prompt pass packed
        shared = shared_prefix_logits(model, ids, mask, pos, response_length, pack_prompts=path.packed)
        if shared is not None:
            return shared
    if path.packed:
        b = ids.shape[0]
        if path.pad_bucket is not None:
            ids, mask, pos = pad_pack_to_bucket(ids, mask, pos, path.pad_bucket)
        if path.sp is not None:  # ulysses_sequence_parallel_size > 1: the pack split over the SP group
            return ulysses_packed_logits(model, ids, mask, pos, path.sp, keep_last=keep)[:b, -response_length - 1:-1]
        return packed_logits(model, ids, mask, pos, keep_last=keep)[:b, -response_length - 1:-1]
    # the last position predicts nothing that is used: the forward stops before it (slicing its logits off instead
    # cost a zero-filled (b, T, V) gradient in the backward). The full width under active dropout, so its masks are
    # drawn over the same shape as ever, and for an empty response (logits_to_keep=0 would mean all positions).
    full = not batch_free or response_length == 0
    if not full:
        ids, mask, pos = ids[:, :-1], mask[:, :-1], pos[..., :-1]
        keep = None if keep is None else response_length
    extra = {} if keep is None else {"logits_to_keep": keep}
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, **extra).logits
    if full:
        return logits[:, -response_length - 1:-1]
    return logits if keep is not None else logits[:, -response_length:]


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits`` in float32 divided by ``temperature``; at temperature 1 the float32 logits themselves (``x / 1``
    is ``x`` exactly, so the division, a pass over ``(b, T, V)`` forward and another backward, is skipped)."""
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


class DataParallelPPOActor:
    """Policy (or reference) forward and update on one rank.

    Args:
        config: ``actor_rollout_ref.actor`` (for a reference model only the forward is used).
        model: the (FSDP2-wrapped) causal LM.
        optimizer: ``None`` for a reference model.
        mini_batch_size: sequences per mini-batch on this rank (``ppo_mini_batch_size × n ÷ (world ÷ sp)``).
        micro_batch_size: sequences per micro-batch on this rank (``ppo_micro_batch_size_per_gpu``).
        ref_model: the frozen reference causal LM, needed only for ``kl_loss_type: full`` (may be set later).
        activation_offload: ``model.enable_activation_offload``: the training forward runs under
            ``save_on_cpu(pin_memory=True)`` on CUDA (a no-op on CPU).
        prefix_grouper: ``actor.use_prefix_grouper``, for the policy and its reference alike (verl copies the
            actor's key to the reference): verl's prefix-grouped forward (:class:`ResponseForward`).
        sp: ``ulysses_sequence_parallel_size`` > 1: this rank's
            :class:`~rlhf_core.workers.ulysses.SequenceParallel`. Each call then gathers the SP group's rows,
            runs each packed micro-batch split over the group and returns this rank's rows
            (docs/PARALLELISM.md); ``use_remove_padding`` must be on.

    ``config.use_torch_compile`` and ``config.fsdp_config.use_torch_compile`` (both) compile the log-prob/entropy
    functions on CUDA (see :func:`hot_functions`).
    The entropy settings are read from ``config.fsdp_config`` (verl 0.9's new engine reads that copy; each copy
    follows the role's key by default, so setting either works): ``entropy_from_logits_with_chunking`` computes
    the entropy ``entropy_from_logits_chunk_size`` rows at a time (else in the default 128-row chunks of
    :func:`~rlhf_core.algos.utils.entropy_from_logits`; the same values either way) and ``entropy_checkpointing``
    recomputes it in the backward (``torch.utils.checkpoint``: its ``(rows, V)`` intermediates are not kept; the same
    gradient). ``config.calculate_entropy`` computes the entropy in the update even when ``entropy_coeff`` is 0, for
    the ``actor/entropy_loss`` metric (verl 0.9).
    """

    def __init__(self, config: Mapping[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 mini_batch_size: int | None = None, micro_batch_size: int | None = None,
                 ref_model: nn.Module | None = None, activation_offload: bool = False,
                 use_remove_padding: bool = False, prefix_grouper: bool = False, sp: Any = None) -> None:
        self.config = config
        self.prefix_grouper = bool(prefix_grouper)
        self.sp = sp  # ulysses_sequence_parallel_size > 1: this rank's SequenceParallel (workers/ulysses.py)
        self.activation_offload = bool(activation_offload)
        # verl 0.6's legacy worker reads the role's key, verl 0.9.1's engine fsdp_config's copy: either False is eager
        self._logprobs_fn, self._entropy_fn = hot_functions(bool(config.use_torch_compile)
                                                            and bool(config.fsdp_config.use_torch_compile))
        engine = config.fsdp_config  # verl 0.9's new engine reads these copies of the role's keys
        self.entropy_chunk_rows = (int(engine.entropy_from_logits_chunk_size)
                                   if engine.entropy_from_logits_with_chunking else None)
        self.entropy_checkpointing = bool(engine.entropy_checkpointing)
        self.model = model
        self.optimizer = optimizer
        self.mini_batch_size = mini_batch_size
        self.micro_batch_size = micro_batch_size
        self.update_calls = 0  # seeds the per-call mini-batch shuffle; saved with the checkpoint's extra state
        # distillation.distillation_loss when distillation.enabled (set by the worker): the update adds its loss
        # against the batch's teacher log-probs (rlhf_core/workers/actor_loss.py)
        self.distillation: Any = None
        self._ref_model = ref_model
        self.use_remove_padding = use_remove_padding  # model.use_remove_padding; chooses the forward paths

    @property
    def use_remove_padding(self) -> bool:
        """``model.use_remove_padding``: the forwards run packed. Setting it chooses the policy's (and the
        reference's) :class:`ResponseForward` again, once."""
        return self._use_remove_padding

    @use_remove_padding.setter
    def use_remove_padding(self, value: bool) -> None:
        self._use_remove_padding = bool(value)
        bucket = pad_bucket_of(self.config.fsdp_config)
        self._path = choose_response_forward(self.model, self._use_remove_padding, bucket, self.prefix_grouper, self.sp)
        self._ref_path = (None if self._ref_model is None else
                          choose_response_forward(self._ref_model, self._use_remove_padding, bucket, self.prefix_grouper,
                                                  self.sp))

    @property
    def ref_model(self) -> nn.Module | None:
        """The frozen reference model for ``kl_loss_type: full`` (its forward path is chosen when it is set)."""
        return self._ref_model

    @ref_model.setter
    def ref_model(self, model: nn.Module | None) -> None:
        self._ref_model = model
        bucket = pad_bucket_of(self.config.fsdp_config)
        self._ref_path = (None if model is None else
                          choose_response_forward(model, self._use_remove_padding, bucket, self.prefix_grouper, self.sp))

    # ---- forward -------------------------------------------------------------------------------------------
    def _log_prob_entropy(self, mb: Batch, temperature: float, with_entropy: bool, return_logits: bool = False,
                          entropy_grad: bool = True):
        """``(log_prob (b, T), entropy (b, T) or None)`` (+ the temperature-scaled logits ``(b, T, V)`` float32
        when ``return_logits``). With ``entropy_grad=False`` the entropy is computed without autograd (a metric
        only: no graph is kept for it)."""
        T = mb["responses"].shape[-1]
        logits = tempered(forward_response_logits(self.model, mb, T, path=self._path), temperature)
        log_prob = self._logprobs_fn(logits, mb["responses"].to(logits.device))
        entropy = None
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropy = self.entropy(logits)
        return (log_prob, entropy, logits) if return_logits else (log_prob, entropy)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """Entropy per position of ``logits (b, T, V)`` → ``(b, T)`` float32, in ``entropy_chunk_rows``-row chunks
        when set, recomputed in the backward under ``entropy_checkpointing`` while autograd records."""
        kwargs = {} if self.entropy_chunk_rows is None else {"chunk_rows": self.entropy_chunk_rows}
        if self.entropy_checkpointing and torch.is_grad_enabled() and logits.requires_grad:
            return torch.utils.checkpoint.checkpoint(self._entropy_fn, logits, use_reentrant=False, **kwargs)
        return self._entropy_fn(logits, **kwargs)

    @torch.no_grad()
    def ref_response_logits(self, mb: Batch, temperature: float) -> torch.Tensor:
        """The reference model's logits predicting the response tokens, ÷ ``temperature``: ``(b, T, V)`` float32.

        Raises:
            RuntimeError: when this actor has no ``ref_model`` (``kl_loss_type: full`` needs role actor_rollout_ref).
        """
        if self.ref_model is None:
            raise RuntimeError("kl_loss_type 'full' needs the reference model in the actor's worker "
                               "(role actor_rollout_ref): the exact KL is computed from both models' full logits")
        self.ref_model.eval()
        return tempered(forward_response_logits(self.ref_model, mb, mb["responses"].shape[-1],
                                                path=self._ref_path), temperature)

    def kl_loss_terms(self, mb: Batch, log_prob: torch.Tensor, logits: torch.Tensor | None,
                      temperature: float) -> torch.Tensor:
        """Per-token KL of the policy vs the reference for the KL loss, ``(b, T)`` (``kl_loss_type``):
        ``full`` → :func:`kl_penalty_full` on the current and reference logits; else :func:`kl_penalty` on
        ``log_prob`` and ``mb["ref_log_prob"]``."""
        kind = self.config.kl_loss_type
        if kind == "full":
            return kl_penalty_full(logits, self.ref_response_logits(mb, temperature))
        return kl_penalty(log_prob, mb["ref_log_prob"].to(log_prob.device), kind)

    @torch.no_grad()
    def compute_log_prob(self, batch: Batch, micro_batch_size: int | None, use_dynamic_bsz: bool = False,
                         max_token_len: int | None = None, calculate_entropy: bool = True,
                         calculate_sum_pi_squared: bool = False):
        """Log π(response_t) and entropies of this rank's shard, logits divided by ``batch.meta['temperature']``.

        Returns ``(log_probs (B, T) float32 CPU, entropys (B, T) float32 CPU or None)``; rows keep their order.
        With ``calculate_sum_pi_squared`` a third item, ``sum_pi_squared (B, T)`` float32 CPU: Σ_v π(v)² of the same
        tempered distribution (:func:`~rlhf_core.algos.advantages_token_baseline.sum_pi_squared_from_logits`)."""
        temperature = float(batch.meta.get("temperature", 1.0)) or 1.0
        self.model.eval()
        batch = gather_rows(batch, self.sp)  # sequence parallelism: the SP group's rows on each of its ranks
        lps, ents, spps = [], [], []
        for mb in batching.micro_batches(batch, micro_batch_size, use_dynamic_bsz, max_token_len,
                                         "log_prob_max_token_len_per_gpu", keep_uids=self.prefix_grouper,
                                         sp_size=sp_size_of(self.sp)):
            lp, ent, *logits = self._log_prob_entropy(mb, temperature, calculate_entropy,
                                                      return_logits=calculate_sum_pi_squared)
            lps.append(lp.float().cpu())
            if ent is not None:
                ents.append(ent.float().cpu())
            if calculate_sum_pi_squared:
                spps.append(sum_pi_squared_from_logits(logits[0]).cpu())
        out = (torch.cat(lps), (torch.cat(ents) if calculate_entropy else None))
        out = (*out, torch.cat(spps)) if calculate_sum_pi_squared else out
        return tuple(own_rows(x, self.sp) for x in out)

    @torch.no_grad()
    def compute_full_kl(self, batch: Batch, micro_batch_size: int | None, use_dynamic_bsz: bool = False,
                        max_token_len: int | None = None) -> torch.Tensor:
        """Exact KL(π_θ ‖ π_ref) per response token from both models' full logits, each divided by
        ``batch.meta['temperature']``, for ``algorithm.kl_penalty: full``: ``(B, T)`` float32 CPU, rows in order,
        not masked.

        Raises:
            RuntimeError: without a ``ref_model`` (see :meth:`ref_response_logits`).
        """
        temperature = float(batch.meta.get("temperature", 1.0)) or 1.0
        self.model.eval()
        batch = gather_rows(batch, self.sp)
        out = []
        for mb in batching.micro_batches(batch, micro_batch_size, use_dynamic_bsz, max_token_len,
                                         "log_prob_max_token_len_per_gpu", keep_uids=self.prefix_grouper,
                                         sp_size=sp_size_of(self.sp)):
            logits = tempered(forward_response_logits(self.model, mb, mb["responses"].shape[-1],
                                                      path=self._path), temperature)
            out.append(kl_penalty_full(logits, self.ref_response_logits(mb, temperature)).cpu())
        return own_rows(torch.cat(out), self.sp)

    # ---- update (the loop is rlhf_core.workers.update_loop; the loss is rlhf_core.workers.actor_loss) ---------
    def _micro_loss(self, mb: Batch, temperature: float, n_tok: float, n_seq: float,
                    bypass: Any = None) -> tuple[torch.Tensor, dict]:
        """This micro-batch's contribution to the mini-batch loss and its metric contributions:
        :func:`~rlhf_core.workers.actor_loss.actor_micro_loss` (``bypass``: the rollout-correction bypass settings)."""
        return actor_micro_loss(self, mb, temperature, n_tok, n_seq, bypass)

    def update_policy(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over this rank's shard: one optimizer step per mini-batch (:func:`run_update`).

        Needs ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``, ``response_mask``,
        ``old_log_probs``, ``advantages`` (+ ``ref_log_prob`` with ``use_kl_loss`` unless ``kl_loss_type: full``,
        ``rollout_log_probs`` or ``rollout_is_weights`` with ``rollout_is``). Returns metrics averaged over
        mini-batches, identical on every rank: ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``,
        ``actor/pg_clipfrac_lower``, ``actor/kl_loss`` + ``actor/kl_coef`` (with
        ``use_kl_loss``), ``actor/entropy_loss`` (the update's aggregated entropy, with ``entropy_coeff != 0`` or
        ``calculate_entropy``), ``actor/grad_norm``, ``actor/skipped_steps`` (non-finite grad norm → no step).
        The LR is stepped by the worker. No ``actor/entropy``: as in verl, that metric is the rollout batch's
        entropy before the update (the trainer's ``old_log_prob`` stage), which an update value would overwrite.
        """
        if self.optimizer is None:
            raise RuntimeError("update_policy needs an optimizer (this actor is a reference model)")
        cfg = self.config
        batch = gather_rows(batch, self.sp)  # every rank of an SP group updates on the group's rows
        if "old_log_probs" not in batch and not first_forward_is_old_log_prob(
                self.model, len(batch), self.mini_batch_size, int(cfg.ppo_epochs)):
            raise ValueError("update_policy without old_log_probs needs one PPO epoch, one mini-batch and no dropout "
                             "(workers/on_policy.py); compute them with compute_log_prob first")
        temperature = float(batch.meta.get("temperature", 1.0)) or 1.0
        rc = batch.meta.get("rollout_correction")  # set by the trainer in verl 0.9 bypass mode
        bypass = SimpleNamespace(**rc) if rc else None
        schedule = UpdateSchedule(
            ppo_epochs=int(cfg.ppo_epochs), mini_batch_size=self.mini_batch_size or len(batch),
            micro_batch_size=self.micro_batch_size, use_dynamic_bsz=bool(cfg.use_dynamic_bsz),
            max_token_len=cfg.ppo_max_token_len_per_gpu, shuffle=bool(cfg.shuffle),
            seed=0 if cfg.data_loader_seed is None else int(cfg.data_loader_seed), grad_clip=cfg.grad_clip,
            activation_offload=self.activation_offload,
            no_sync=bool(cfg.fsdp_config.use_no_sync_for_gradient_accumulation), keep_uids=self.prefix_grouper,
            sp_size=1 if self.sp is None else self.sp.size)
        out = run_update("actor", self.model, self.optimizer, batch, schedule,
                         lambda mb, n_tok, n_seq: self._micro_loss(mb, temperature, n_tok, n_seq, bypass),
                         self.update_calls)
        self.update_calls += 1
        if cfg.use_kl_loss:
            out["actor/kl_coef"] = float(cfg.kl_loss_coef)
        return out

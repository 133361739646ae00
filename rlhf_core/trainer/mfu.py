"""Model FLOPs utilisation of the actor update (``perf/mfu/actor``), estimated on the driver.

verl's ``FlopsCounter``: achieved FLOPs / (peak FLOPs of the device × number of workers). FLOPs of one training
pass over the batch = ``6 · N · tokens + 6 · L · heads · head_dim · Σ seqlen²`` exactly as verl's
``_estimate_qwen2_flops`` (``verl/utils/flops_counter.py``): N = the dense matmul parameters of the HF config, the
embedding and the LM head both counted (``2 · vocab · hidden``, as verl), L layers, seqlen = valid tokens per
sequence (the causal attention's score and value products, forward + backward); the update runs ``ppo_epochs``
passes. A forward-only pass (the log-prob passes) is a third of that (:func:`forward_flops`).

Peak FLOP/s of one rank (:func:`rank_peak_flops`, asked of every actor rank once per run): on a CUDA device, the
bf16 dense peak of its name (the table below, as verl); on CPU, *measured* once per process by timing a large
square GEMM in the actor's compute dtype at the rank's thread count, and per core (:func:`cpu_peak_flops`). A device whose peak
is not known (an unlisted GPU, a dtype the CPU cannot multiply) has no MFU: the metric is left out, never
reported as 0.
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Sequence

import torch
from transformers import AutoConfig

from rlhf_core.models.loading import local_path

logger = logging.getLogger(__name__)

PEAK_BF16_FLOPS = {  # dense bf16 tensor-core peaks, FLOP/s
    "H200": 989e12, "H100": 989e12, "H800": 989e12, "H20": 148e12, "A100": 312e12, "A800": 312e12,
    "L40S": 362e12, "L40": 181e12, "A10": 125e12, "4090": 165e12, "B200": 2250e12, "MI300X": 1307e12,
}
GEMM_BUDGET_S = 0.2  # wall time of one CPU peak measurement
_GEMM_SIZES = (256, 512, 1024, 2048)  # square GEMM sizes tried, smallest first
_GEMM_MIN_S = 0.005  # a GEMM shorter than this is too small to show the peak: the next size is tried


def device_peak_flops(device_name: str | None) -> float | None:
    """Peak FLOP/s for a CUDA device name (``"NVIDIA H200"`` → 989e12); ``None`` when unknown or None."""
    if not device_name:
        return None
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in device_name:
            return PEAK_BF16_FLOPS[key]
    return None


def cpu_peak_flops(dtype: torch.dtype = torch.float32, threads: int | None = None) -> float | None:
    """Measured peak matmul FLOP/s of this CPU process in ``dtype`` with ``threads`` intra-op threads (default: the
    current ``torch.get_num_threads()``); measured once per process and (dtype, threads), then cached.

    The measurement (:func:`gemm_flops_per_s`): square ``torch.mm`` of size n×n in ``dtype``, n the first of 256,
    512, 1024, 2048 whose one product takes ≥ 5 ms after a warm-up product, repeated for the rest of its time;
    rate = 2·n³ / (fastest product's seconds). It runs twice, each for half of :data:`GEMM_BUDGET_S` (0.2 s in
    all): at ``threads`` threads timed by the wall clock, and at one thread timed by that thread's CPU time (the
    per-core rate); the peak is the larger of the first rate and ``threads`` × the per-core rate. The per-core rate
    on CPU time is there because on a shared machine a busy core holds back every multi-threaded product and
    preempts a single-threaded one (on the 2-core test machine under load: 2.1 GFLOP/s at two threads, 90 at one,
    by the wall clock), and a peak measured so would put MFU above 1 once the load lifts. So the peak is what a
    large, well-shaped GEMM reaches at that thread count with ideal scaling, not the datasheet peak: the MFU it
    gives is a fraction of what this CPU can do in practice, and not above it.

    Returns:
        FLOP/s, or ``None`` when ``dtype`` cannot be multiplied on this CPU (the error is logged).
    """
    return _measure_gemm_peak(dtype, int(threads) if threads is not None else torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _measure_gemm_peak(dtype: torch.dtype, threads: int) -> float | None:
    try:
        if threads <= 1:
            peak = gemm_flops_per_s(dtype, 1, GEMM_BUDGET_S, clock=time.thread_time)
        else:
            peak = max(gemm_flops_per_s(dtype, threads, GEMM_BUDGET_S / 2),
                       threads * gemm_flops_per_s(dtype, 1, GEMM_BUDGET_S / 2, clock=time.thread_time))
    except RuntimeError as exc:  # e.g. a dtype without a CPU matmul kernel
        logger.warning("perf/mfu/actor: cannot measure the CPU's %s matmul peak: %s", dtype, exc)
        return None
    logger.info("perf/mfu/actor: CPU peak %.1f GFLOP/s (%s, %d threads)", peak / 1e9, dtype, threads)
    return peak


def gemm_flops_per_s(dtype: torch.dtype, threads: int, budget_s: float,
                     clock: Callable[[], float] = time.perf_counter) -> float:
    """FLOP/s of the fastest n×n ``torch.mm`` in ``dtype`` at ``threads`` threads within about ``budget_s`` seconds
    of wall time (n as in :func:`cpu_peak_flops`), each product timed by ``clock`` (seconds; ``time.thread_time``
    counts only this thread's CPU time, right for one thread, whose product runs on the calling thread). The thread
    count is restored afterwards; the operands are constants (a GEMM's speed does not depend on the values), so no
    RNG is drawn from and later samples are unchanged.

    Raises:
        RuntimeError: from ``torch.mm`` when ``dtype`` has no CPU matmul kernel.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        for n in _GEMM_SIZES:
            a, b = torch.full((n, n), 0.5, dtype=dtype), torch.full((n, n), 0.25, dtype=dtype)
            torch.mm(a, b)  # warm-up: allocations, kernel selection
            best = _time_mm(a, b, clock)
            if best >= _GEMM_MIN_S or time.perf_counter() - start >= budget_s / 2:
                break
        while time.perf_counter() - start < budget_s:
            best = min(best, _time_mm(a, b, clock))
    finally:
        torch.set_num_threads(before)
    return 2.0 * n ** 3 / best


def _time_mm(a: torch.Tensor, b: torch.Tensor, clock: Callable[[], float]) -> float:
    t0 = clock()
    torch.mm(a, b)
    return max(clock() - t0, 1e-9)


def rank_peak_flops(dtype: torch.dtype) -> float | None:
    """Peak FLOP/s of the calling rank: the CUDA device's table entry when CUDA is available (``None`` for an
    unlisted device), else :func:`cpu_peak_flops` in ``dtype`` at the current thread count."""
    if torch.cuda.is_available():
        return device_peak_flops(torch.cuda.get_device_name())
    return cpu_peak_flops(dtype)


def matmul_params(hf_config: Any) -> float:
    """Dense matmul parameters per token of a decoder LM as verl's ``_estimate_qwen2_flops`` counts them:
    ``L · (3 · hidden · intermediate + hidden · (2 · heads · head_dim + 2 · kv_heads · head_dim)) + 2 · vocab ·
    hidden`` (q/k/v/o projections, the SwiGLU MLP, the embedding and the LM head)."""
    h = int(hf_config.hidden_size)
    layers = int(hf_config.num_hidden_layers)
    heads = int(hf_config.num_attention_heads)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or h // heads)
    inter = int(getattr(hf_config, "intermediate_size", 4 * h))
    attn = h * (heads * head_dim * 2 + kv_heads * head_dim * 2)
    mlp = 3 * h * inter
    return float(layers * (attn + mlp) + 2 * int(hf_config.vocab_size) * h)


def training_flops(hf_config: Any, seqlens: Sequence[int], passes: int = 1) -> float:
    """FLOPs of ``passes`` training passes (forward + backward) over sequences of ``seqlens`` valid tokens:
    ``6 · matmul_params · Σ seqlen + 6 · L · heads · head_dim · Σ seqlen²`` per pass (verl's qwen2 formula)."""
    heads = int(hf_config.num_attention_heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or int(hf_config.hidden_size) // heads)
    tokens = float(sum(seqlens))
    attn = 6.0 * int(hf_config.num_hidden_layers) * heads * head_dim * float(sum(s * s for s in seqlens))
    return (6.0 * matmul_params(hf_config) * tokens + attn) * passes


def forward_flops(hf_config: Any, seqlens: Sequence[int]) -> float:
    """FLOPs of one forward pass (a log-prob pass) over ``seqlens``: a third of :func:`training_flops` (the
    backward costs twice the forward, the convention behind verl's factor 6)."""
    return training_flops(hf_config, seqlens, 1) / 3.0


def estimate_mfu(hf_config: Any, seqlens: Sequence[int], seconds: float, peak_flops: float | None,
                 passes: int = 1) -> float | None:
    """MFU of ``passes`` training passes over ``seqlens`` that took ``seconds`` on workers whose peaks sum to
    ``peak_flops`` FLOP/s: :func:`training_flops` / (``seconds`` · ``peak_flops``). ``None`` (unknown) when the
    peak is unknown or not positive, or ``seconds`` is not positive."""
    if peak_flops is None or peak_flops <= 0 or seconds <= 0:
        return None
    return training_flops(hf_config, seqlens, passes) / (seconds * peak_flops)


def load_hf_config(model_config: Any) -> Any | None:
    """The HF config of ``actor_rollout_ref.model`` (``path``, ``trust_remote_code``), or ``None`` with a warning
    when the driver cannot load it (e.g. a remote-code model): MFU is then unknown."""
    try:
        return AutoConfig.from_pretrained(local_path(str(model_config.path)),
                                          trust_remote_code=bool(model_config.trust_remote_code))
    except Exception as exc:  # a remote-code model the driver cannot load: MFU unknown
        logger.warning("perf/mfu/actor unavailable: %s", exc)
        return None


def actor_mfu(hf_config: Any | None, seqlens: Sequence[int], seconds: float, rank_peaks: Sequence[float | None],
              passes: int) -> float | None:
    """``perf/mfu/actor``: :func:`estimate_mfu` against the sum of the actor ranks' peaks (``rank_peaks``, one per
    rank, from :func:`rank_peak_flops`); ``None`` when ``hf_config`` is ``None`` or any rank's peak is unknown."""
    if hf_config is None or not rank_peaks or any(p is None or p <= 0 for p in rank_peaks):
        return None
    return estimate_mfu(hf_config, seqlens, seconds, float(sum(rank_peaks)), passes)


class ActorMFU:
    """``perf/mfu/actor`` of the PPO driver's actor updates: the model config is read and every actor rank's peak
    FLOP/s asked (``peak_flops``, measured on CPU) once, at the first update.

    Args:
        model_config: ``actor_rollout_ref.model``. actor_wg: the actor worker group. ppo_epochs: passes per update.
    """

    def __init__(self, model_config: Any, actor_wg: Any, ppo_epochs: int) -> None:
        self.model_config, self.actor_wg, self.ppo_epochs = model_config, actor_wg, int(ppo_epochs)
        self.loaded = False
        self.hf_config: Any | None = None
        self.peaks: list = []

    def __call__(self, seqlens: Sequence[int], seconds: float) -> float | None:
        """:func:`actor_mfu` of an update over ``seqlens`` that took ``seconds``; ``None`` when the model config
        cannot be read or a peak is unknown (including a worker group whose workers have no ``peak_flops``)."""
        if not self.loaded:
            self.hf_config, self.loaded = load_hf_config(self.model_config), True
            self.peaks = self._ask_peaks() if self.hf_config is not None else []
        return actor_mfu(self.hf_config, seqlens, seconds, self.peaks, self.ppo_epochs)

    def _ask_peaks(self) -> list:
        try:
            return list(self.actor_wg.execute_all("peak_flops"))
        except AttributeError as exc:  # Ray re-raises a worker's AttributeError as one
            logger.warning("perf/mfu/actor left out: the actor workers report no peak_flops (%s)", exc)
            return []

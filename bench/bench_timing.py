"""What ``bench_kernels.py`` and ``bench_linear.py`` share: the interleaved timer and the model sizes.

Its own file so the two benchmarks import it and not each other (``bench_kernels`` runs ``bench_linear``).
"""
from __future__ import annotations

import statistics
import time

# the packing / linear benchmarks' Qwen2 sizes (about 1M, 20M and 100M parameters with a 2,000-token vocabulary)
PACKING_SIZES = {"1m": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2),
                 "20m": dict(hidden_size=384, intermediate_size=1152, num_hidden_layers=11, num_attention_heads=6,
                             num_key_value_heads=2),
                 "100m": dict(hidden_size=768, intermediate_size=2304, num_hidden_layers=14, num_attention_heads=12,
                              num_key_value_heads=4)}


def interleaved_median_ms(fns: list, reps: int) -> list[float]:
    """The median milliseconds of each of ``fns`` over ``reps`` calls after one warm-up call each, the calls taken in
    turn (rep 1 of every function, then rep 2, ...), so that a host whose speed drifts slows every variant alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, out in zip(fns, times):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return [statistics.median(t) * 1e3 for t in times]

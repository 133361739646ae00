"""Validation metrics per data source (verl ``verl/trainer/ppo/metric_utils.py::process_validation_metrics``).

Samples are grouped by ``(data_source, uid)`` — one group per prompt *instance*, so two prompts with the same
text but different uids are separate groups. For every numeric variable in ``infos_dict`` (``reward`` and the
scorer's extras; string variables such as ``pred`` are skipped as variables) and every group of ``N`` samples:

* ``mean@N``, ``std@N`` (population std, ``np.std``; only when ``N > 1``);
* for ``n`` in ``2, 4, 8, …`` below ``N``, and ``N`` itself: ``best@n/mean``, ``best@n/std``, ``worst@n/mean``,
  ``worst@n/std`` — the mean and std over 1000 bootstrap subsets of size ``n`` (drawn with replacement) of
  the subset's max / min; ``maj@n/mean``, ``maj@n/std`` when ``infos_dict`` has ``pred``: the value of the
  majority-voted prediction. Bootstrap draws use ``np.random.RandomState(seed)`` re-seeded per call, the
  same stream as verl's ``np.random.seed(seed); np.random.choice(...)``, without touching the global RNG.
* Beyond verl, for the *core* variable only (``acc`` if present, else ``reward``, else ``score``): the
  unbiased ``pass@k = 1 − C(N−c, k) / C(N, k)`` (Chen et al. 2021, arXiv:2107.03374 eq. 1) for
  ``k`` in ``1, 2, 4, …`` up to ``N`` and ``N`` itself, where ``c`` counts samples whose value is ``> 0.5``
  (a 0/1 accuracy or a 0/1 reward counts as correct when 1; a fractional reward counts above one half).

Each metric is then averaged over the groups of a data source. A group of ``N`` samples has no ``pass@k`` for
``k > N``, so ``pass@k`` averages only the groups with at least ``k`` samples; ``pass@k/num_prompts`` (next to it,
for the core variable) says how many groups that is — never a silent drop (``pass@1/num_prompts`` counts every
group of the data source).

Majority vote tie rule (deterministic): among predictions with the highest count, the one that appears first
in the (bootstrap) sample wins, and its value is that of its first occurrence (verl's ``calc_maj_val``).
"""
from __future__ import annotations

from collections import defaultdict
from math import comb
from numbers import Number

import numpy as np

N_BOOTSTRAP = 1000


def _doublings(first: int, n_resps: int) -> list[int]:
    """``first, 2·first, 4·first, …`` below ``n_resps``, then ``n_resps``."""
    sizes, n = [], first
    while n < n_resps:
        sizes.append(n)
        n *= 2
    return sizes + [n_resps]


def _ns(n_resps: int) -> list[int]:
    """``2, 4, 8, …`` below ``n_resps``, then ``n_resps`` (verl's subset sizes)."""
    return _doublings(2, n_resps)


def pass_k_values(n_resps: int) -> list[int]:
    """``1, 2, 4, …`` below ``n_resps``, then ``n_resps`` (pass@k sizes)."""
    return _doublings(1, n_resps)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: ``1 − C(n−c, k) / C(n, k)``.

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def majority_value(preds: list, vals: list) -> float:
    """The value of the most frequent prediction; ties go to the prediction seen first (see module doc)."""
    counts: dict = {}
    first_val: dict = {}
    for p, v in zip(preds, vals):
        try:
            hash(p)
        except TypeError:  # e.g. a list-valued prediction: vote on its text
            p = repr(p)
        counts[p] = counts.get(p, 0) + 1
        first_val.setdefault(p, v)
    best = max(counts, key=counts.get)  # max returns the first key (insertion order) among ties
    return first_val[best]


def bootstrap_metric(
    vals: list, subset_size: int, preds: list | None = None, n_bootstrap: int = N_BOOTSTRAP, seed: int = 42
) -> dict[str, tuple[float, float]]:
    """``{"best": (mean, std), "worst": (mean, std)[, "maj": (mean, std)]}`` over bootstrap subsets."""
    # One (n_bootstrap, subset_size) draw is the same stream as n_bootstrap sequential draws (C order).
    idx = np.random.RandomState(seed).choice(len(vals), size=(n_bootstrap, subset_size), replace=True)
    subsets = np.asarray(vals, dtype=np.float64)[idx]
    best, worst = subsets.max(axis=1), subsets.min(axis=1)
    out = {"best": (float(best.mean()), float(best.std())), "worst": (float(worst.mean()), float(worst.std()))}
    if preds is not None:
        maj = [majority_value([preds[i] for i in row], [vals[i] for i in row]) for row in idx]
        out["maj"] = (float(np.mean(maj)), float(np.std(maj)))
    return out


def _is_numeric(values: list) -> bool:
    return all(isinstance(v, (Number, np.number)) and not isinstance(v, complex) for v in values)


def core_variable(var_names) -> str:
    """``acc`` if reported, else ``reward``, else ``score`` (verl's rule, with ``score`` as a last resort)."""
    names = set(var_names)
    return "acc" if "acc" in names else ("reward" if "reward" in names else "score")


def group_metrics(vals: list, preds: list | None, seed: int, with_pass_at_k: bool) -> dict[str, float]:
    """All metrics of one variable over one group of ``N = len(vals)`` samples."""
    n = len(vals)
    metric = {f"mean@{n}": float(np.mean(vals))}
    if n > 1:
        metric[f"std@{n}"] = float(np.std(vals))
        for size in _ns(n):
            boot = bootstrap_metric(vals, size, preds=preds, seed=seed)
            for name, (mean, std) in boot.items():
                metric[f"{name}@{size}/mean"], metric[f"{name}@{size}/std"] = mean, std
    if with_pass_at_k:
        c = sum(1 for v in vals if float(v) > 0.5)
        for k in pass_k_values(n):
            metric[f"pass@{k}"] = pass_at_k(n, c, k)
    return metric


def process_validation_metrics(
    data_sources: list[str], uids: list[str], infos_dict: dict[str, list], seed: int = 42
) -> dict[str, dict[str, dict[str, float]]]:
    """``data_source → variable → metric name → value`` (see the module docstring for every metric).

    Args:
        data_sources: per-sample data source, length ``B``.
        uids: per-sample prompt uid, length ``B`` (samples of one prompt share it).
        infos_dict: variable name → per-sample values, each length ``B`` (e.g. ``reward``, ``acc``, ``pred``).
            A variable with a non-numeric value (``None``, strings) is not summarised.
        seed: bootstrap seed.

    Raises:
        ValueError: when a list's length differs from ``len(data_sources)``.
    """
    b = len(data_sources)
    for name, vals in {"uids": uids, **infos_dict}.items():
        if len(vals) != b:
            raise ValueError(f"{name} has {len(vals)} values but there are {b} data_sources")
    groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (ds, uid) in enumerate(zip(data_sources, uids)):
        groups[str(ds)][str(uid)].append(i)
    core = core_variable(infos_dict)
    preds_all = infos_dict.get("pred")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for ds, uid2idx in groups.items():
        per_var: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for idx in uid2idx.values():
            for var, all_vals in infos_dict.items():
                vals = [all_vals[i] for i in idx]
                if not _is_numeric(vals):
                    continue
                preds = [preds_all[i] for i in idx] if preds_all is not None else None
                for m, v in group_metrics(vals, preds, seed, with_pass_at_k=(var == core)).items():
                    per_var[var][m].append(v)
        out[ds] = {var: {m: float(np.mean(v)) for m, v in ms.items()} for var, ms in per_var.items()}
        if core in per_var:  # how many prompts each pass@k covers (groups with >= k samples)
            out[ds][core].update({f"{m}/num_prompts": float(len(v)) for m, v in per_var[core].items()
                                  if m.startswith("pass@")})
    return out


def val_metrics_to_names(metrics_dict: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """Flatten to ``val-core/<ds>/<var>/<metric>`` and ``val-aux/<ds>/<var>/<metric>`` (verl ``_validate``).

    ``val-core`` holds the core variable's (``acc`` else ``reward``, else ``score``) metrics that start with
    ``mean``, ``maj`` or ``best`` at the largest ``n`` of that variable (e.g. ``mean@4``, ``maj@4/mean``,
    ``best@4/std``); everything else is ``val-aux``.
    """
    named: dict[str, float] = {}
    for ds, var2metric in metrics_dict.items():
        core = core_variable(var2metric)
        for var, metric2val in var2metric.items():
            n_max = max(int(m.split("@")[-1].split("/")[0]) for m in metric2val)
            for m, v in metric2val.items():
                is_core = var == core and m.startswith(("mean", "maj", "best")) and f"@{n_max}" in m
                named[f"{'val-core' if is_core else 'val-aux'}/{ds}/{var}/{m}"] = v
    return named

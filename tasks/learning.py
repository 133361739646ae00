"""The flow's learning summary as plain functions: the core validation metric before and after PPO
(:func:`validation_before_after`) and its one line (:func:`learning_line`).
"""

from __future__ import annotations

from typing import Any, Iterable


def validation_before_after(rows: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The core validation metric before training (the step-0 validation) and at the last step it was logged, from
    ``file``-sink rows (``{"step", "name", "value"}``, all segments together).

    The metric is ``val-core/<data_source>/acc/mean@N`` when a scorer reports ``acc`` (greedy accuracy with
    ``val_kwargs.do_sample=False, n=1``), else ``val-core/<data_source>/reward/mean@N``; the first such name in
    sorted order when there are several data sources. The baseline is the validation of step 0 only
    (``trainer.val_before_train``): a later first validation is not "before" (it comes after training steps),
    so without a step-0 row ``before``/``gain`` are None rather than a step compared with itself.

    Returns:
        ``{"name", "before_step", "before", "after_step", "after", "gain", "first_step", "first"}``: ``before_step``
        is 0 or None; ``after_step`` is the last step with a value after step 0 (None when only step 0 was
        validated); ``gain = after - before`` when both exist, else None; ``first_step``/``first``: the earliest
        validation. None when no core validation metric was logged.
    """
    series: dict[str, dict[int, float]] = {}
    for row in rows:
        name = str(row.get("name", ""))
        if name.startswith("val-core/") and ("/acc/mean@" in name or "/reward/mean@" in name):
            series.setdefault(name, {})[int(row["step"])] = float(row["value"])
    if not series:
        return None
    acc = sorted(n for n in series if "/acc/mean@" in n)
    name = acc[0] if acc else sorted(series)[0]
    points = series[name]
    first, last = min(points), max(points)
    before_step = 0 if 0 in points else None
    after_step = last if last > 0 else None
    before = None if before_step is None else points[0]
    after = None if after_step is None else points[after_step]
    gain = None if before is None or after is None else after - before
    return {"name": name, "before_step": before_step, "before": before, "after_step": after_step, "after": after,
            "gain": gain, "first_step": first, "first": points[first]}


def learning_line(summary: dict[str, Any] | None, val_prompts: int) -> str:
    """The flow's one-line learning summary of :func:`validation_before_after`'s result.

    ``<name> on <val_prompts> held-out prompts: step 0: 0.010 -> step 20: 0.350 (gain +0.340)``; without a step-0
    validation it gives the last value and says that there is nothing before training to compare with (and that
    ``trainer.val_before_train=True`` adds it); with only step 0 it says that nothing was validated after training.
    """
    if summary is None:
        return "no validation metric was logged (trainer.val_before_train / test_freq)"
    head = f"{summary['name']} on {val_prompts} held-out prompts: "
    if summary["gain"] is not None:
        return (f"{head}step 0: {summary['before']:.3f} -> step {summary['after_step']}: {summary['after']:.3f} "
                f"(gain {summary['gain']:+.3f})")
    if summary["after"] is None:
        return f"{head}step 0: {summary['before']:.3f}; no validation after training (trainer.test_freq)"
    earlier = ("" if summary["first_step"] == summary["after_step"]
               else f"; first validated at step {summary['first_step']}: {summary['first']:.3f}")
    return (f"{head}step {summary['after_step']}: {summary['after']:.3f} (no step-0 validation to compare with; "
            f"trainer.val_before_train=True adds one{earlier})")

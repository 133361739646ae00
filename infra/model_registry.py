"""The final policy in the MLflow model registry, and a reward-over-steps chart.

:func:`register_policy` logs a merged (``from_pretrained``-loadable) Hugging Face folder as
artifact ``hf_model`` of the ppo run and creates a new version of the registered model named
after the experiment, tagged with its lineage: the datasets (path and sha256), the SFT parent
model and the PPO checkpoint it was merged from; alias ``candidate`` moves to it. The flow registers
after evaluation and the regression gate: :func:`record_verdict` puts the evaluation metrics and the
gate's verdict on the version and moves alias ``champion`` to it only when the gate passed, so a serving
job loads ``models:/<name>@champion``. :func:`reward_chart` draws ``critic/score/mean`` (and
``val-core/.../reward/mean@N`` when present) over the global step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402

from infra import lineage  # noqa: E402
from rlhf_core.redact import redact_text  # noqa: E402

SCORE_KEY = "critic/score/mean"
CANDIDATE = "candidate"
"""Alias of the newest registered version, whatever its gate said."""
CHAMPION = "champion"
"""Alias of the newest version whose regression gate passed (``models:/<name>@champion``)."""
GATE_TAG = "regression_gate"
GATE_PASSED, GATE_FAILED = "passed", "failed"
GATE_NO_BASELINE = "no baseline"  # the gate is on, but no earlier successful run was there to compare with
GATE_OFF = "off"                  # no baseline configured (regression_gate.baseline null)
EVAL_TAG_PREFIX = "eval."
TAG_VALUE_LIMIT = 5000            # characters of the gate's text kept in a version tag


def register_policy(run_id: str, hf_dir: str | Path, model_name: str,
                    lineage_tags: Mapping[str, Any]) -> str:
    """Log ``hf_dir`` as artifact ``hf_model`` of ``run_id`` and register it as a new version of
    ``model_name``, which alias :data:`CANDIDATE` then names; returns the version (``"1"``, ``"2"``, ...).

    A folder above ``lineage.ARTIFACT_LIMIT_BYTES`` is not copied: the version's source is then
    the folder itself (it must stay where it is, on storage the MLflow users can read).

    Args:
        lineage_tags: e.g. ``{"sft_model": path, "ppo_checkpoint": path, "dataset.<data>_train.sha256":
            hex}``; set on the model version as tags.

    Returns ``"none"`` (nothing registered) when lineage is degraded (:func:`infra.lineage.degraded`).
    """
    if lineage.degraded() is not None:
        return "none"
    c = lineage.client()
    copied = lineage.log_dir_artifact(run_id, hf_dir, "hf_model")
    source = f"{c.get_run(run_id).info.artifact_uri}/hf_model" if copied else Path(hf_dir).resolve().as_uri()
    if not c.search_registered_models(filter_string=f"name = '{model_name}'"):
        try:
            c.create_registered_model(model_name, description="policies trained by the rlhf flow")
        except Exception:  # noqa: BLE001 - created concurrently by another flow run
            pass
    version = c.create_model_version(model_name, source=source, run_id=run_id,
                                     tags={k: str(v) for k, v in lineage_tags.items()},
                                     description=f"merged policy of MLflow run {run_id}")
    c.set_registered_model_alias(model_name, CANDIDATE, str(version.version))
    lineage.set_tags(run_id, {"registered_model": f"{model_name}/{version.version}"})
    return str(version.version)


def record_verdict(model_name: str, version: str, evaluation: Mapping[str, float], verdict: str,
                   detail: str | None = None, baseline_run_id: str | None = None) -> list[str]:
    """Put the evaluation and the regression gate's verdict on version ``version`` of ``model_name``, and move
    alias :data:`CHAMPION` to it when ``verdict`` is :data:`GATE_PASSED` (otherwise the alias stays where it was).

    The version gets tags ``eval.<metric>`` (each evaluation metric, MLflow-safe name: ``pass@1`` →
    ``pass_at_1``), ``regression_gate`` (the verdict), ``regression_gate.baseline`` and ``regression_gate.detail``
    (the gate's text, cut to :data:`TAG_VALUE_LIMIT` characters), and a description that says all of it.

    Args:
        evaluation: the evaluate stage's metrics, e.g. ``{"test_score/openai/gsm8k": 0.45}`` ({} when skipped).
        verdict: :data:`GATE_PASSED`, :data:`GATE_FAILED`, :data:`GATE_NO_BASELINE` or :data:`GATE_OFF`.
        detail: the gate's text (per data source: means, difference, 95 % interval).

    Returns:
        The aliases the version holds afterwards, sorted (``["candidate", "champion"]`` after a passed gate);
        ``[]`` when lineage is degraded (nothing is recorded).

    Raises:
        ValueError: ``verdict`` is not one of the four.
    """
    from rlhf_core.trainer.tracking import sanitize_mlflow_name

    if verdict not in (GATE_PASSED, GATE_FAILED, GATE_NO_BASELINE, GATE_OFF):
        raise ValueError(f"record_verdict: verdict {verdict!r} is not one of passed, failed, no baseline, off")
    if lineage.degraded() is not None:
        return []
    c = lineage.client()
    tags = {EVAL_TAG_PREFIX + sanitize_mlflow_name(k): f"{float(v):.6g}" for k, v in evaluation.items()}
    tags[GATE_TAG] = verdict
    if baseline_run_id:
        tags[f"{GATE_TAG}.baseline"] = baseline_run_id
    if detail:
        tags[f"{GATE_TAG}.detail"] = detail[:TAG_VALUE_LIMIT]
    for key, value in tags.items():
        c.set_model_version_tag(model_name, version, key, redact_text(value))
    if verdict == GATE_PASSED:
        c.set_registered_model_alias(model_name, CHAMPION, version)
    old = c.get_model_version(model_name, version).description or ""
    scores = ", ".join(f"{k} {float(v):.4f}" for k, v in sorted(evaluation.items())) or "not evaluated"
    promoted = f"; alias {CHAMPION} moved here" if verdict == GATE_PASSED else f"; alias {CHAMPION} not moved"
    text = (f"{old.split(chr(10))[0]}\nEvaluation: {scores}\nRegression gate: {verdict}{promoted}"
            + (f"\n{detail}" if detail else ""))
    c.update_model_version(model_name, version, description=redact_text(text))
    return sorted(c.get_model_version(model_name, version).aliases)


def reward_chart(rows: list[tuple[int, str, float]], path: str | Path) -> str:
    """Draw the score curves of ``rows`` = ``(step, key, value)`` to a PNG at ``path``.

    Plots :data:`SCORE_KEY` and every ``val-core/<ds>/reward/mean@N`` / ``acc/mean@N`` key found.

    Returns:
        ``path`` as a string.

    Raises:
        ValueError: no row has a score key.
    """
    series: dict[str, list[tuple[int, float]]] = {}
    for step, key, value in rows:
        if key == SCORE_KEY or (key.startswith("val-core/") and ("/reward/mean@" in key or "/acc/mean@" in key)):
            series.setdefault(key, []).append((int(step), float(value)))
    if not series:
        raise ValueError(f"no {SCORE_KEY} or val-core reward/acc metric to draw")
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=key)
    ax.set_xlabel("global step")
    ax.set_ylabel("score")
    ax.set_title("reward / accuracy over PPO steps")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)

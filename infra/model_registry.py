"""The final policy in the MLflow model registry, and a reward-over-steps chart.

:func:`register_policy` logs a merged (``from_pretrained``-loadable) Hugging Face folder as
artifact ``hf_model`` of the ppo run and creates a new version of the registered model named
after the experiment, tagged with its lineage: the datasets (path and sha256), the SFT parent
model and the PPO checkpoint it was merged from. :func:`reward_chart` draws
``critic/score/mean`` (and ``val-core/.../reward/mean@N`` when present) over the global step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402

from infra import lineage  # noqa: E402

SCORE_KEY = "critic/score/mean"


def register_policy(run_id: str, hf_dir: str | Path, model_name: str,
                    lineage_tags: Mapping[str, Any]) -> str:
    """Log ``hf_dir`` as artifact ``hf_model`` of ``run_id`` and register it as a new version of
    ``model_name``; returns the version (``"1"``, ``"2"``, ...).

    A folder above ``lineage.ARTIFACT_LIMIT_BYTES`` is not copied: the version's source is then
    the folder itself (it must stay where it is, on storage the MLflow users can read).

    Args:
        lineage_tags: e.g. ``{"sft_model": path, "ppo_checkpoint": path, "dataset.gsm8k_train.sha256":
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
    lineage.set_tags(run_id, {"registered_model": f"{model_name}/{version.version}"})
    return str(version.version)


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

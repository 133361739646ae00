"""Every MLflow link the product hands out opens the model-training view, seen in a real headless Chromium.

A real ``mlflow server`` (``infra.servers.mlflow_server_command``, on 127.0.0.1) serves a store that the
product's own lineage code filled: a parent run named after its flow run, a stage run, a stage served from
Prefect's cache, a summary artifact and a registered model version that passed its gate. Each link
(``infra.lineage.run_url`` — what the Prefect summary and link artifacts and the end-of-run summary print —,
``experiment_url`` and the registered version's link) is opened with a fresh browser profile, whose remembered
view is MLflow's default, GenAI; the page must show the model-training side bar (Model registry; on a run or
experiment page also Runs and Models) and none of the GenAI one (Prompts, AI Gateway; on a run page also
Observability, Sessions, Judges). The control: the same run link without ``?workflowType=machine_learning``
shows the GenAI view.

Needs a Chromium binary (Debian: ``apt-get install -y chromium``); skipped, saying so, without one. Set
``RLHF_SCREENSHOT_DIR`` to keep a screenshot of the parent run's page.
"""

from __future__ import annotations

import html as html_lib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from conftest_services import *  # noqa: F401,F403

pytestmark = pytest.mark.slow

CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
ML_ONLY = {"Model registry"}         # in the side bar of the model-training view only (any page)
GENAI_ONLY = {"Prompts", "AI Gateway"}  # in the side bar of the GenAI view only (any page)


def _texts(html: str) -> set[str]:
    """The text nodes of a dumped DOM (scripts and styles left out)."""
    html = re.sub(r"<(script|style)\b.*?</\1>", "", html, flags=re.S)
    return {html_lib.unescape(t).strip() for t in re.split(r"<[^>]+>", html) if t.strip()}


def _shown(texts: set[str]) -> str:
    """The page's words for an assertion message (colour swatches left out)."""
    return " | ".join(t for t in sorted(texts) if not t.startswith("#"))[:4000]


def _open(url: str, profile: Path, screenshot: Path | None = None, dom: Path | None = None) -> set[str]:
    """Load ``url`` in headless Chromium with a fresh profile, let the app run 20 s of virtual time; return the
    page's texts (and write a screenshot, the DOM when asked)."""
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            f"--user-data-dir={profile}", "--virtual-time-budget=20000", "--window-size=1400,900"]
    if screenshot is not None:  # without the last flag a screenshot under a virtual time budget never returns
        subprocess.run(args + [f"--screenshot={screenshot}", "--run-all-compositor-stages-before-draw", url],
                       capture_output=True, timeout=180, check=True)
    out = subprocess.run(args + ["--dump-dom", url], capture_output=True, text=True, timeout=180, check=True)
    if dom is not None:
        dom.write_text(out.stdout)
    return _texts(out.stdout)


@pytest.fixture
def mlflow_server(rlhf_env, free_port, tmp_path, monkeypatch):
    """A real MLflow server on the home's SQLite store, on 127.0.0.1:<free port>; MLFLOW_TRACKING_URI points at it."""
    from infra.servers import mlflow_server_command

    monkeypatch.delenv("RLHF_BIND_HOST", raising=False)
    cmd = mlflow_server_command(f"sqlite:///{rlhf_env / 'mlflow.db'}", free_port,
                                artifacts_destination=str(tmp_path / "mlartifacts"))
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    url = f"http://127.0.0.1:{free_port}"
    try:
        deadline = time.monotonic() + 240  # about 50 s on a busy 2-core machine
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
                time.sleep(1)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        yield url
    finally:
        os.killpg(proc.pid, 15)  # the server and its workers only (own session)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=30)
        log.close()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian: apt-get install -y chromium)")
def test_every_mlflow_link_opens_the_model_training_view(mlflow_server, tmp_path, capsys):
    from flows import artifacts
    from infra import lineage
    from tasks.register import publish_version

    with lineage.pipeline_run("rlhf", "fr-2", {"ppo_steps": 2}, run_name="practical-fox") as parent:
        with lineage.pipeline_run("rlhf", "fr-1", {}, run_name="earlier-owl") as earlier:
            with lineage.stage_run("sft", {}, earlier, flow_run_id="fr-1", flow_run_name="earlier-owl") as sft_run:
                pass
        cached = lineage.cached_stage_run("sft", sft_run, parent, "fr-2", "practical-fox")
        with lineage.stage_run("ppo", {"a": 1}, parent, flow_run_id="fr-2", flow_run_name="practical-fox") as ppo:
            lineage.log_metrics(ppo, {"critic/score/mean": 0.5}, step=1)
        lineage.log_text_artifact(parent, "# rlhf flow run summary", "summary.md")
    policy = tmp_path / "hf_policy"
    policy.mkdir()
    (policy / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    registered = publish_version(ppo, policy, "rlhf", {"flow_run_id": "fr-2"}, {"test_score/openai/gsm8k": 0.5},
                                 "passed", "passed vs eval-1")
    experiment = lineage.client().get_run(parent).info.experiment_id
    # MLflow's own "View run ... at: <link without the query>" lines are off (infra.home.embedded_defaults)
    assert "View run" not in capsys.readouterr().out

    links = {"parent run (Prefect summary and link artifacts, end-of-run summary)": artifacts.mlflow_run_url(parent),
             "ppo stage run": lineage.run_url(ppo), "cached sft stage run": lineage.run_url(cached),
             "experiment": lineage.experiment_url(experiment), "registered version": registered["url"]}
    shots = Path(os.environ.get("RLHF_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    for i, (what, url) in enumerate(links.items()):
        assert url.startswith(mlflow_server) and url.endswith("?workflowType=machine_learning"), (what, url)
        texts = _open(url, tmp_path / f"profile-{i}", shots / "mlflow_parent_run.png" if i == 0 else None,
                      shots / f"page_{i}.html")
        assert ML_ONLY <= texts and not GENAI_ONLY & texts, (what, url, _shown(texts))
        if "run" in what or what == "experiment":
            assert {"Runs", "Models"} <= texts and not {"Observability", "Sessions", "Judges"} & texts, (what, url)
        else:  # the version page itself, with the aliases the gate gave it
            assert "Page Not Found" not in texts and {"@\u00a0candidate", "@\u00a0champion"} <= texts, (url, _shown(texts))
        if i == 0:  # the run page itself: the run's name and its named child runs are on it
            assert {"practical-fox", "ppo · practical-fox", "sft · practical-fox"} <= texts, _shown(texts)
    assert (shots / "mlflow_parent_run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the control: a fresh browser given the link without the query lands in the GenAI view
    texts = _open(links["ppo stage run"].split("?")[0], tmp_path / "profile-control")
    assert GENAI_ONLY | {"Observability", "Sessions", "Judges"} <= texts and not ML_ONLY & texts, _shown(texts)

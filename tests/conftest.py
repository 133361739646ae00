"""Shared fixtures: the real GSM8K data beside the repo, and one tiny model built from it per session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _gsm8k_dir() -> Path:
    return Path(os.environ.get("GSM8K_DIR", REPO_ROOT.parent / "shared" / "data" / "gsm8k")).resolve()


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """The original GSM8K jsonl folder (``$GSM8K_DIR`` or ``../shared/data/gsm8k``)."""
    path = _gsm8k_dir()
    if not (path / "train.jsonl").exists():
        pytest.fail(f"GSM8K data not found at {path}; set GSM8K_DIR")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, gsm8k_dir) -> str:
    """A tiny Qwen2 model + BPE tokenizer trained on GSM8K train text, as a Hugging Face directory."""
    from rlhf_core.models.tiny import build_tiny_model, gsm8k_texts

    out = tmp_path_factory.mktemp("tiny_model") / "model"
    return build_tiny_model(gsm8k_texts(gsm8k_dir, "train", limit=2000), out, vocab_size=1000)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


# The end-to-end modules that take longest on 2 cores (CI's --durations), started first so that pytest-xdist's
# workers do not end the run with one of them alone on one worker while the other idles (longest first).
LONGEST_FIRST = ("test_ray_cluster_e2e.py", "test_deploy_experiment.py", "test_prefect_server.py",
                 "test_learning_e2e.py", "test_faults.py", "test_flow_e2e.py", "test_flow_tools_e2e.py",
                 "test_config_reads_e2e.py")


def pytest_collection_modifyitems(config, items):
    """Start the longest end-to-end modules first (a stable sort: a module's tests stay together and in order),
    and skip ``gpu``-marked tests cleanly when no CUDA device is present."""
    order = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch import failure is reported elsewhere
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def _no_ray_session_leaks_between_modules():
    """Each module starts without a Ray session and leaves none behind.

    A test that starts Ray in-process (``init_ray``, a trainer run) and fails or forgets to shut it down would
    otherwise hand its session to the next module: a fixture that builds its own cluster then connects to the
    stale one, and a check that a code path starts no Ray sees it running.
    """
    import sys

    def shutdown() -> None:
        ray = sys.modules.get("ray")  # never import Ray just to find it is not running
        if ray is not None and ray.is_initialized():
            ray.shutdown()

    shutdown()
    yield
    shutdown()

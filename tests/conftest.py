"""Shared fixtures: the real GSM8K data beside the repo, and one tiny model built from it per session."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

# the session's Prefect services, defined once here (a fixture imported into each test module would be one definition,
# hence one server, per module): the temporary-database harness and the real server on 127.0.0.1
from conftest_services import prefect_harness, prefect_server  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _gsm8k_dir() -> Path:
    return Path(os.environ.get("GSM8K_DIR", REPO_ROOT.parent / "shared" / "data" / "gsm8k")).resolve()


@pytest.fixture(autouse=True, scope="session")
def _kernels_installed():
    """The kernels' attention functions registered with transformers, as every worker and engine does at set-up
    (``rlhf_core.kernels.install``): tests call the kernels directly, without a worker."""
    from rlhf_core import kernels

    kernels.install()


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
# workers do not end the run with one of them alone on one worker while the other idles (longest first; a module
# with a module-scoped fixture runs on one worker as a whole: pytest_xdist_make_scheduler below).
LONGEST_FIRST = ("test_flow_e2e.py", "test_faults.py", "test_ray_cluster_e2e.py", "test_prefect_server.py",
                 "test_deploy_experiment.py", "test_flow_tools_e2e.py", "test_learning_e2e.py",
                 "test_config_reads_e2e.py", "test_exact_resume.py")


_SHARED_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope\s*=\s*["'](module|class|package)["']""")
_XDIST_GROUP = re.compile(r"""pytest\.mark\.xdist_group\(\s*(?:name\s*=\s*)?["']([^"']+)["']""")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``-n N`` (``--dist load``), except that the tests of a module that defines a module-, class- or
    package-scoped fixture go to one worker together, so that fixture is built once, not once per worker that got
    one of its tests (test_faults.py's reference run, test_flow_e2e.py's flow run, test_exact_resume.py's runs were
    built on both workers, in parallel, on 2 cores); and the modules marked ``pytest.mark.xdist_group("NAME")`` (in
    their text) go to one worker together, so a session fixture they share is built once (the Prefect server of
    test_prefect_server.py and test_deploy_experiment.py). Every other test is its own unit, as under ``load``; units
    start in collection order (``LONGEST_FIRST``). pytest-xdist's ``loadgroup`` does not group under pytest 9."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    units: dict[str, str | None] = {}

    def module_unit(path: str) -> str | None:
        """The unit of every test of the module at ``path``: its group, the module, or None (one unit per test)."""
        if path not in units:
            file = config.rootpath / path
            text = file.read_text() if file.suffix == ".py" and file.is_file() else ""
            group = _XDIST_GROUP.search(text)
            units[path] = f"group:{group.group(1)}" if group else path if _SHARED_FIXTURE.search(text) else None
        return units[path]

    class ModuleFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return module_unit(nodeid.split("::", 1)[0]) or nodeid

        def _reschedule(self, node) -> None:
            # the next unit once the worker holds only the test it cannot start before it knows the next one
            # (``load`` and ``loadscope`` top up at 2 left: with end-to-end tests of minutes each, one worker then
            # queues a long test behind two others while the other idles)
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
            elif self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)

        def schedule(self) -> None:
            self.config.option.loadscopereorder = False  # keep the collection order (longest modules first)
            super().schedule()

    return ModuleFixtureScheduling(config, log)


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


@pytest.fixture(autouse=True)
def _omp_wait_policy_restored():
    """``rlhf_cli.main`` sets OMP_WAIT_POLICY for its process (before torch loads, as the ``rlhf`` command); a test
    calling it in-process must not hand that to later tests (a Ray started later would inherit it)."""
    saved = os.environ.get("OMP_WAIT_POLICY")
    yield
    if saved is None:
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = saved


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

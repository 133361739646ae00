"""reward_model.sandbox_fusion (verl 0.9 reward.sandbox_fusion): code data sources are scored by a Sandbox Fusion
``run_code`` service. A real HTTP server on 127.0.0.1 plays the service: it runs the posted Python with the posted
stdin (a subprocess), records every request body and counts the requests in flight (each held 0.2 s), so
max_concurrent and memory_limit_mb are seen from the server's side."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlhf_core.reward.custom import reward_function_from_config
from rlhf_core.reward.scorers import UnknownDataSourceError
from rlhf_core.reward.scorers.sandbox_fusion import SandboxFusion, extract_code

from tests.fixtures.config_fixtures import typed_config

HOLD_S = 0.2


class _Sandbox(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock, self.in_flight, self.peak, self.bodies = threading.Lock(), 0, 0, []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/run_code"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.in_flight += 1
            srv.peak = max(srv.peak, srv.in_flight)
            srv.bodies.append(body)
        try:
            time.sleep(HOLD_S)
            run = subprocess.run([sys.executable, "-c", body["code"]], input=body["stdin"] or "",
                                 capture_output=True, text=True, timeout=body["run_timeout"])
            reply = {"status": "Success" if run.returncode == 0 else "Failed",
                     "run_result": {"status": "Finished", "stdout": run.stdout, "return_code": run.returncode}}
        finally:
            with srv.lock:
                srv.in_flight -= 1
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def sandbox():
    srv = _Sandbox()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


# doubles its input; 6 cases, of which the 4th expects a wrong answer → 5 of 6 pass
ANSWER = "Here it is:\n```python\nprint(2 * int(input()))\n```\n"
CASES = {"inputs": ["1", "2", "3", "4", "5", "6"], "outputs": ["2", "4", "6", "9", "10", "12"]}


def test_max_concurrent_bounds_requests_and_memory_limit_is_sent(sandbox):
    cfg = typed_config("ppo_trainer", f"reward_model.sandbox_fusion.url={sandbox.url}",
                       "reward_model.sandbox_fusion.max_concurrent=2",
                       "reward_model.sandbox_fusion.memory_limit_mb=333")
    score = reward_function_from_config(cfg)
    out = score("codecontests", ANSWER, json.dumps(CASES))
    assert out == {"score": pytest.approx(5 / 6), "passed": 5, "cases": 6, "api_errors": 0}
    assert sandbox.peak == 2  # six cases, two at a time
    assert len(sandbox.bodies) == 6 and {b["memory_limit_MB"] for b in sandbox.bodies} == {333}
    assert {b["stdin"] for b in sandbox.bodies} == set(CASES["inputs"])
    assert all(b["language"] == "python" and b["code"].strip().startswith("print(2 * int(input()))")
               for b in sandbox.bodies)
    # with verl's default bound (64) all six cases are in flight together: the bound above was max_concurrent's
    sandbox.peak = 0
    wide = reward_function_from_config(typed_config("ppo_trainer", f"reward_model.sandbox_fusion.url={sandbox.url}"))
    assert wide("apps", ANSWER, CASES)["score"] == pytest.approx(5 / 6)
    assert sandbox.peak == 6


def test_top_level_sandbox_fusion_section_replaces_reward_models(sandbox):
    # verl 0.9.1: a top-level sandbox_fusion with a key set becomes reward.sandbox_fusion; its null keys → defaults
    cfg = typed_config("ppo_trainer", "reward_model.sandbox_fusion.url=http://127.0.0.1:1/unused",
                       "reward_model.sandbox_fusion.memory_limit_mb=77",
                       f"sandbox_fusion.url={sandbox.url}", "sandbox_fusion.max_concurrent=1")
    out = reward_function_from_config(cfg)("taco", ANSWER, CASES)
    assert out["passed"] == 5 and sandbox.peak == 1
    assert {b["memory_limit_MB"] for b in sandbox.bodies} == {1024}


def test_more_than_ten_cases_score_the_first_ten(sandbox):
    # verl's continuous score: 12 cases, the last two wrong → the first 10 all pass → 1.0, all 12 are run
    cases = {"inputs": [str(i) for i in range(12)], "outputs": [str(2 * i) for i in range(10)] + ["x", "y"]}
    fn = reward_function_from_config(typed_config("ppo_trainer", f"reward_model.sandbox_fusion.url={sandbox.url}"))
    assert fn("codeforces", ANSWER, cases) == {"score": 1.0, "passed": 10, "cases": 12, "api_errors": 0}


def test_without_a_url_code_sources_are_refused_and_no_fence_scores_zero(sandbox):
    with pytest.raises(UnknownDataSourceError, match="reward_model.sandbox_fusion.url"):
        reward_function_from_config(typed_config("ppo_trainer"))("codecontests", ANSWER, CASES)
    fn = reward_function_from_config(typed_config("ppo_trainer", f"reward_model.sandbox_fusion.url={sandbox.url}"))
    assert fn("codecontests", "print(1)", CASES)["score"] == 0.0 and sandbox.bodies == []
    with pytest.raises(ValueError, match="fn_name"):
        fn("apps", ANSWER, {"fn_name": "solve", "inputs": [], "outputs": []})


def test_unreachable_sandbox_scores_zero_and_extract_code(caplog):
    import pickle

    sb = pickle.loads(pickle.dumps(SandboxFusion("http://127.0.0.1:1/run_code", 4, 256)))  # nothing listens there
    from rlhf_core.reward.scorers.sandbox_fusion import compute_score

    # every case failed for the service, counted in api_errors, and one warning names the URL (a wrong URL would
    # otherwise train on all-zero code rewards unnoticed)
    with caplog.at_level("WARNING", logger="rlhf_core.reward.scorers.sandbox_fusion"):
        assert compute_score(sb, ANSWER, CASES) == {"score": 0.0, "passed": 0, "cases": 6, "api_errors": 6}
    assert [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()][0].startswith(
        "sandbox_fusion: http://127.0.0.1:1/run_code did not answer")
    assert extract_code("```py\nx = 1\n```") == "x = 1\n"
    assert extract_code("a ```python\nA\n``` b ```python\nB\n```") == "\nB\n"
    assert extract_code("no fence") is None

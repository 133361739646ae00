"""``actor_rollout_ref.nccl_timeout`` becomes the worker process group's collective timeout (gloo here)."""
from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import torch
import torch.distributed.distributed_c10d as c10d
from rlhf_core.distributed.worker_group import free_port, setup_process_group
setup_process_group(0, 1, "127.0.0.1", free_port(), collective_timeout_s={timeout})
print(c10d._get_default_group()._get_backend(torch.device("cpu")).options._timeout.total_seconds())
"""


def test_process_group_gets_the_configured_timeout():
    # a fresh process: this one may already hold a default group (LocalWorkerGroup reuses it)
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(timeout=42)], capture_output=True, text=True,
                         timeout=120, check=True)
    assert float(out.stdout.strip().splitlines()[-1]) == 42.0  # torch's default would be 1800 (30 min)

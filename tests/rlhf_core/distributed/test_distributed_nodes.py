"""``trainer.nnodes > 1``: one placement group per node, on distinct nodes (a 2-node in-process Ray cluster)."""
from __future__ import annotations

import os
import sys

import pytest
import ray
import ray.cloudpickle

from rlhf_core.distributed import RayWorkerGroup
from tests.paths import REPO

pytestmark = pytest.mark.ray  # starts Ray: calls Cluster

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class _Rank:
    def __init__(self) -> None:
        import torch.distributed as dist

        self.rank = dist.get_rank()

    def whoami(self) -> int:
        return self.rank


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_ranks_are_placed_one_node_each(two_nodes):
    wg = RayWorkerGroup(_Rank, 2, {}, num_cpus_per_worker=1, nnodes=2, pg_timeout_s=60, ready_timeout_s=120)
    try:
        nodes = wg.node_ids()
        assert len(set(nodes)) == 2  # one rank on each node
        assert wg.execute_all("whoami") == [0, 1]  # and they form one process group
    finally:
        wg.shutdown()


def test_more_nodes_than_the_cluster_has_names_what_is_missing(two_nodes):
    with pytest.raises(TimeoutError, match=r"trainer.nnodes=3 needs 3 nodes .* has 2 such node"):
        RayWorkerGroup(_Rank, 3, {}, num_cpus_per_worker=1, nnodes=3, pg_timeout_s=5)
    with pytest.raises(ValueError, match="must divide the world size 3"):
        RayWorkerGroup(_Rank, 3, {}, num_cpus_per_worker=1, nnodes=2)


def test_embedded_ray_never_attaches_to_a_cluster_started_on_this_machine(two_nodes):
    """While ``two_nodes`` runs, ``/tmp/ray/ray_current_cluster`` names its head (Ray's ``Cluster`` writes it, as
    ``ray start`` does); a bare ``ray.init()`` would attach to it and then refuse ``num_cpus``. ``init_ray(None)``
    and ``connect_ray(None)`` start instances of their own: another GCS address and the 1 CPU asked for."""
    import subprocess

    code = ("import sys, ray; from rlhf_core.distributed.ray_init import init_ray; from infra.ray_cluster import "
            "connect_ray\n"
            "for start in (lambda: init_ray(None, 1), lambda: connect_ray(None, num_cpus=1)):\n"
            "    start(); print(ray.get_runtime_context().gcs_address, ray.cluster_resources()['CPU']); "
            "ray.shutdown()\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    repo = str(REPO)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=repo, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.split() for line in proc.stdout.splitlines() if line.count(" ") == 1 and ":" in line]
    assert len(lines) == 2, proc.stdout
    for address, cpus in lines:
        assert address != two_nodes.address and float(cpus) == 1.0

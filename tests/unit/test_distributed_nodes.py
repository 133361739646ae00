"""``trainer.nnodes > 1``: one placement group per node, on distinct nodes (a 2-node in-process Ray cluster)."""
from __future__ import annotations

import os
import sys

import pytest
import ray
import ray.cloudpickle

from rlhf_core.distributed import RayWorkerGroup

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

"""Ray start-up and worker groups (one Ray actor per rank, a torch.distributed group across them)."""
from rlhf_core.distributed.ray_init import init_ray
from rlhf_core.distributed.worker_group import LocalWorkerGroup, RayWorkerGroup

__all__ = ["init_ray", "RayWorkerGroup", "LocalWorkerGroup"]

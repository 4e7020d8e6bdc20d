"""PyTorch on HALO: the ``"halo"`` torch.distributed backend.

``import halo.torch`` registers the backend ``"halo"`` for CPU and CUDA tensors; then
torch programs run on HALO unchanged. A whole job::

    import torch.distributed as dist
    import halo.torch                                   # registers "halo"

    dist.init_process_group(backend="halo")             # was: "gloo" / "nccl"

or only the expert-parallel group, the rest staying on gloo or NCCL::

    dist.init_process_group(backend="gloo")
    ep_group = dist.new_group(ep_ranks, backend="halo")
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=ep_group)

Megatron-LM's all-to-all token dispatcher calls
``torch.distributed.all_to_all_single(..., group=ep_group)`` (forward and backward, in
its ``_AllToAll`` autograd function), so with its expert-parallel group made on
``"halo"`` its MoE layers move their tokens over HALO without a line changed.

Start the job as usual (torchrun, ``halo launch``, mpirun, srun with ``RANK`` /
``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT``, or any ``init_method``): the backend
bootstraps from the store torch gives each process group (the group's rank 0 puts
HALO's unique id, which holds a random secret, in the store), so it needs no
HALO-specific environment. torch's ``timeout`` is HALO's: every operation, and joining,
fails with ``torch.distributed.DistBackendError`` naming what went wrong once it has
passed, on every rank; a rank that dies makes the others raise, never hang.

Operations: ``all_to_all_single`` (even, uneven and zero splits), ``all_to_all``
(lists), ``all_reduce`` (SUM, AVG, PRODUCT, MIN, MAX; BAND/BOR on bool), ``reduce``,
``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``,
``reduce_scatter_tensor``, ``broadcast``, ``barrier``, ``gather``, ``scatter``,
``send``/``recv``/``isend``/``irecv`` with tags; ``async_op=True`` returns a work
object (``wait``, ``is_completed``, ``get_future``, ``exception``) backed by HALO's
non-blocking requests. Data types: float16, bfloat16, float32, float64, int8, uint8,
int32, int64, bool (and complex for SUM/AVG). CUDA tensors go to HALO's device path
(NCCL / RCCL on torch's current stream) in the two all-to-alls; the other operations
take CPU tensors and say so otherwise. Autograd: torch's functional collectives
(``torch.distributed._functional_collectives.all_to_all_single_autograd``, whose
backward is the reverse all-to-all) and ``torch.distributed.nn.functional`` work over
the backend, as does Megatron's ``_AllToAll``.
docs/TORCH.md has the details, what is not supported and the figures against gloo.
"""

from __future__ import annotations

import torch.distributed as dist

from ._comm import Communicator
from ._torch_pg import NAME, ProcessGroupHalo, create_backend

__all__ = [
    "NAME",
    "ProcessGroupHalo",
    "communicator",
    "is_halo_group",
]


def _register() -> None:
    if NAME in getattr(dist.Backend, "backend_list", ()) and NAME.upper() in getattr(
        dist.Backend, "_plugins", {}
    ):
        return
    dist.Backend.register_backend(NAME, create_backend, devices=["cpu", "cuda"])


_register()


def _pg(group):
    return dist.group.WORLD if group is None else group


def is_halo_group(group=None) -> bool:
    """Whether ``group`` (default: the world group) runs on the ``"halo"`` backend."""
    return isinstance(_pg(group), ProcessGroupHalo)


def communicator(group=None) -> Communicator:
    """The HALO communicator behind a ``"halo"`` process group (default: the world
    group), for HALO's own calls (topology, algorithm choice, the MoE exchange)."""
    pg = _pg(group)
    if not isinstance(pg, ProcessGroupHalo):
        raise ValueError(
            f"the process group {pg!r} is not on the halo backend: make it with "
            "dist.init_process_group('halo') or dist.new_group(ranks, backend='halo')"
        )
    return pg.communicator

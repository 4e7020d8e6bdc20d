"""torch.distributed's collective signatures over HALO, for PyTorch and Megatron-LM.

``halo.torch.all_to_all_single`` takes exactly the arguments of
``torch.distributed.all_to_all_single`` (output, input, output_split_sizes,
input_split_sizes, group=None, async_op=False) and has its meaning: split sizes are
rows along dim 0, ``None`` is an even split, the result lands in ``output``.

Megatron-LM's all-to-all token dispatcher (``MoEAlltoAllTokenDispatcher``) moves its
tokens through ``megatron/core/tensor_parallel/mappings.py``, whose ``_AllToAll``
autograd function (forward and backward) calls ``torch.distributed.all_to_all_single``
once. Two lines switch it to HALO:

    import halo.torch                          # 1. added below `import torch`

    halo.torch.all_to_all_single(              # 2. was: torch.distributed.all_to_all_single(
        output,
        input,
        output_split_sizes=output_split_sizes,
        input_split_sizes=input_split_sizes,
        group=group,
    )

and the job is started with ``halo launch`` (or torchrun: HALO reads the same
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``).

What to know:

- ``all_to_all_single`` and ``all_to_all`` take contiguous CPU tensors (the host
  transports) or CUDA / ROCm tensors (the device path: libhalo gets ``data_ptr()`` and
  ``torch.cuda.current_stream().cuda_stream``, and enqueues the exchange on that stream
  as NCCL / RCCL groups, like torch.distributed with NCCL). The device path needs NCCL or
  RCCL at run time (torch's own ``nvidia-nccl`` wheel is found); without it the call
  raises :class:`halo.HaloError` (``UNHANDLED_DEVICE_ERROR``) naming every place
  libhalo looked. It has not been run on a GPU yet (docs/ARCHITECTURE.md). The other
  calls take CPU tensors only.
- The world communicator is made on first use with :func:`halo.init` (or set with
  :func:`init`). HALO's ranks must be torch.distributed's global ranks (both come
  from ``RANK`` under ``halo launch`` and torchrun); this is checked when
  torch.distributed is initialised.
- ``group``: ``None`` or the world group use the world communicator; a
  :class:`halo.Communicator` is used as is; another torch ``ProcessGroup`` (Megatron's
  expert-parallel group) gets its own HALO communicator, split from the world on the
  group's first use and kept. That split is collective over the whole world: every
  rank must make its first call on its group of a given layout at the same point, as
  SPMD training code does (each rank in one expert-parallel group, all dispatching
  in the same step). To control this, split yourself and pass the communicator, or
  register it with :func:`set_group_communicator`.
- ``async_op=True`` returns a completed work object: HALO's collectives block.
- Like torch.distributed, this is not autograd-aware; Megatron's ``_AllToAll`` is.

torch is imported only when needed (a torch ``ProcessGroup``, ``get_future``), never
when this module is imported; with numpy arrays these functions work without torch.
"""

from __future__ import annotations

import sys
import threading

from . import _comm
from ._comm import Communicator

__all__ = [
    "init",
    "communicator",
    "set_group_communicator",
    "all_to_all_single",
    "all_to_all",
    "all_reduce",
    "barrier",
]

_lock = threading.Lock()
_world = None  # Communicator
_groups = {}  # tuple of global ranks -> Communicator


def _torch():
    try:
        import torch  # the real torch: absolute import
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("halo.torch needs PyTorch (pip install torch)") from e
    return torch


def init(comm: Communicator | None = None) -> Communicator:
    """Sets the world communicator (``comm``, else :func:`halo.init` from the
    environment) and returns it. Called on first use otherwise."""
    global _world
    with _lock:
        if comm is not None:
            _world = comm
        elif _world is None:
            _world = _comm.init()
        world = _world
    _check_torch_world(world)
    return world


def _check_torch_world(world: Communicator) -> None:
    torch = sys.modules.get("torch")  # not imported: torch.distributed is not running
    if torch is None or not hasattr(torch, "distributed"):
        return
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        size, rank = dist.get_world_size(), dist.get_rank()
        if (size, rank) != (world.size, world.rank):
            raise ValueError(
                f"torch.distributed is rank {rank} of {size} but HALO is rank "
                f"{world.rank} of {world.size}: start both from the same launcher "
                "environment (RANK, WORLD_SIZE)"
            )


def _world_comm() -> Communicator:
    return _world if _world is not None else init()


def set_group_communicator(group, comm: Communicator) -> None:
    """Uses ``comm`` for the torch ``ProcessGroup`` ``group`` from now on."""
    _groups[_group_ranks(group)] = comm


def _group_ranks(group) -> tuple:
    dist = _torch().distributed
    return tuple(int(r) for r in dist.get_process_group_ranks(group))


def communicator(group=None) -> Communicator:
    """The HALO communicator for ``group`` (see the module's documentation)."""
    if isinstance(group, Communicator):
        return group
    world = _world_comm()
    if group is None:
        return world
    dist = _torch().distributed
    if group is getattr(dist.GroupMember, "WORLD", object()):
        return world
    ranks = _group_ranks(group)
    if ranks == tuple(range(world.size)):
        return world
    comm = _groups.get(ranks)
    if comm is None:
        if world.rank not in ranks:
            raise ValueError(f"rank {world.rank} is not a member of the group {list(ranks)}")
        # Collective over the world: each rank joins the communicator of its group.
        comm = world.split(color=min(ranks), key=ranks.index(world.rank))
        _groups[ranks] = comm
    return comm


class _Completed:
    """What ``async_op=True`` returns: the work is already done."""

    def __init__(self, result):
        self._result = result

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def synchronize(self) -> None:
        pass

    def get_future(self):
        fut = _torch().futures.Future()
        fut.set_result(self._result)
        return fut


def _done(result, async_op: bool):
    return _Completed(result) if async_op else None


def all_to_all_single(
    output,
    input,
    output_split_sizes=None,
    input_split_sizes=None,
    group=None,
    async_op=False,
):
    """``torch.distributed.all_to_all_single`` over HALO: ``input`` split along dim 0
    by ``input_split_sizes`` (``None``: evenly) goes to the ranks of ``group``;
    what they send lands in ``output``, split by ``output_split_sizes``. Returns
    ``None``, or a completed work object with ``async_op=True``."""
    communicator(group).all_to_all_single(output, input, output_split_sizes, input_split_sizes)
    return _done([output], async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """``torch.distributed.all_to_all`` over HALO."""
    communicator(group).all_to_all(output_tensor_list, input_tensor_list)
    return _done(output_tensor_list, async_op)


def all_reduce(tensor, op=None, group=None, async_op=False):
    """``torch.distributed.all_reduce`` over HALO, in place: ``op`` is
    ``torch.distributed.ReduceOp.SUM`` (the default), ``MAX`` or ``MIN``."""
    name = "sum"
    if op is not None:
        name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
        if not isinstance(name, str):
            name = str(name)
    communicator(group).all_reduce(tensor, name.lower())
    return _done([tensor], async_op)


def barrier(group=None, async_op=False, device_ids=None):
    """``torch.distributed.barrier`` over HALO."""
    communicator(group).barrier()
    return _done(None, async_op)

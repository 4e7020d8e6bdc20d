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

:class:`MoeDispatcher` is DeepEP's dispatcher shape over a ``"halo"`` group: ``dispatch``
and ``combine`` with autograd, tokens de-duplicated per destination node both ways
(forward and backward).

docs/TORCH.md has the details, what is not supported and the figures against gloo.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._comm import Communicator, MoeHandle
from ._torch_pg import NAME, ProcessGroupHalo, create_backend

__all__ = [
    "EventOverlap",
    "MoeDispatcher",
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


# -- the MoE dispatcher (issue 29) ------------------------------------------------------

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _run(call, inp, out, works) -> None:
    """``call(inp, out)``, blocking when ``works`` is None, else started non-blocking
    (``haloIMoe*``) with its work appended to ``works``."""
    if works is None:
        call(inp, out)
    else:
        works.append(call(inp, out, async_op=True))


class EventOverlap:
    """What ``dispatch`` and ``combine`` return last with ``async_finish=True``
    (DeepEP's ``EventOverlap``): the exchange is running on the communicator's worker
    and its outputs are not ready until :meth:`current_stream_wait` (or the end of a
    ``with event:`` block) returns. Work queued on the same group after it runs after
    it; a blocking call on the group waits for it first."""

    def __init__(self, works):
        self._works = list(works)

    def current_stream_wait(self) -> None:
        """Blocks until the exchange has finished (CPU tensors: there is no stream to
        make wait); raises ``halo.HaloError`` if it failed. A second call returns at
        once."""
        works, self._works = self._works, []
        for w in works:
            w.wait()

    def is_completed(self) -> bool:
        """Whether the exchange has finished, without blocking."""
        return all(w.is_completed() for w in self._works)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.current_stream_wait()
        return False

    def __repr__(self) -> str:
        return f"<halo.torch.EventOverlap {len(self._works)} pending>"


class _Dispatch(torch.autograd.Function):
    """Tokens to their experts' rows; backward: the rows' gradients summed back."""

    @staticmethod
    def forward(ctx, x, handle, works):
        ctx.handle = handle
        out = x.new_empty((handle.num_recv_rows, x.shape[1]))
        _run(handle.dispatch, x.detach().contiguous(), out, works)
        return out

    @staticmethod
    def backward(ctx, grad):
        h = ctx.handle
        gx = grad.new_empty((h.num_tokens, grad.shape[1]))
        h.combine(grad.contiguous(), gx)
        return gx, None, None


class _Combine(torch.autograd.Function):
    """Rows summed back to their tokens; backward: each token's gradient to its rows."""

    @staticmethod
    def forward(ctx, y, handle, works):
        ctx.handle = handle
        out = y.new_empty((handle.num_tokens, y.shape[1]))
        _run(handle.combine, y.detach().contiguous(), out, works)
        return out

    @staticmethod
    def backward(ctx, grad):
        h = ctx.handle
        gy = grad.new_empty((h.num_recv_rows, grad.shape[1]))
        h.dispatch(grad.contiguous(), gy)
        return gy, None, None


class _DispatchPairs(torch.autograd.Function):
    """One value per (token, slot) to its row; backward: the rows' values back."""

    @staticmethod
    def forward(ctx, w, handle, works):
        ctx.handle = handle
        out = w.new_empty((handle.num_recv_rows,))
        _run(handle.dispatch_pairs, w.detach().contiguous(), out, works)
        return out

    @staticmethod
    def backward(ctx, grad):
        h = ctx.handle
        gw = grad.new_empty((h.num_tokens, h.top_k))
        h.combine_pairs(grad.contiguous(), gw)
        return gw, None, None


class MoeDispatchHandle:
    """What :meth:`MoeDispatcher.dispatch` returns for :meth:`MoeDispatcher.combine`:
    the exchanged routing (:class:`halo.MoeHandle`, kept by the autograd graph for the
    backward) and its layout at this rank."""

    def __init__(self, handle: MoeHandle):
        self.handle = handle
        layout = handle.layout()
        #: This rank's experts (global ids, ascending).
        self.local_experts = layout["local_experts"]
        #: Rows per local expert (DeepEP's ``num_recv_tokens_per_expert_list``).
        self.tokens_per_expert = layout["tokens_per_expert"]
        #: Per received row: its expert's global id, source rank, token at the source.
        self.row_expert = torch.tensor(layout["row_expert"], dtype=torch.long)
        self.row_src_rank = torch.tensor(layout["row_src_rank"], dtype=torch.long)
        self.row_src_token = torch.tensor(layout["row_src_token"], dtype=torch.long)

    def __repr__(self) -> str:
        return f"<halo.torch.MoeDispatchHandle {self.handle!r}>"


class MoeDispatcher:
    """DeepEP's MoE dispatcher over a ``"halo"`` process group: ``dispatch`` sends each
    token to the ranks of its top-k experts, ``combine`` brings the experts' rows back
    and sums them per token. Both are autograd functions, each other's backward, and
    **de-duplicated both ways**: a token goes to a remote node once, however many of
    its experts live there, and is replicated inside the node; the rows of one token on
    one node are added there before one row goes back (forward and backward alike).

    Expert placement is a table (``expert_rank[e]``: the rank of expert ``e``; default:
    contiguous blocks, expert ``e`` on rank ``e // (num_experts // size)``, Megatron's),
    so expert migration is a new table (:meth:`set_expert_rank`). ``mode``: ``"auto"``
    (de-duplicate where the routing lets it save rows, else the direct
    all-to-all-v), ``"dedup"`` or ``"direct"``.

    Example (every rank)::

        dispatcher = halo.torch.MoeDispatcher(ep_group, num_experts=16, hidden=1024)
        recv_x, recv_topk_idx, recv_topk_weights, tokens_per_expert, handle = \
            dispatcher.dispatch(x, topk_idx, topk_weights)
        outs = [experts[i](rows) for i, rows in enumerate(recv_x.split(tokens_per_expert))]
        y = torch.cat(outs) * recv_topk_weights.unsqueeze(-1)
        out = dispatcher.combine(y, handle)

    Differences from DeepEP's ``Buffer.dispatch``: ``recv_x`` has one row per (token,
    local expert), already grouped by local expert (ascending id) then source rank then
    token, so no permutation is needed before the grouped GEMM; ``recv_topk_idx`` and
    ``recv_topk_weights`` are therefore 1-D (one expert id and one gate per row), and
    ``tokens_per_expert`` is a list of Python ints known once the routing is exchanged.
    CPU tensors only (the device path of the MoE calls is not built yet);
    ``async_finish=True`` overlaps the rows' exchange with the caller's work (the
    routing is exchanged first, blocking), there is no ``previous_event`` (CPU work
    is done when the call is made); no masked (``-1``) slots; no FP8.
    """

    def __init__(self, group, num_experts: int, hidden: int, expert_rank=None, mode="auto"):
        self.comm = communicator(group)
        self.num_experts = int(num_experts)
        self.hidden = int(hidden)
        self.mode = mode
        n = self.comm.size
        if expert_rank is None:
            if self.num_experts < 1 or self.num_experts % n:
                raise ValueError(
                    f"{self.num_experts} experts do not split evenly over {n} ranks: "
                    "pass expert_rank (the rank of each expert)"
                )
            per = self.num_experts // n
            expert_rank = [e // per for e in range(self.num_experts)]
        self.set_expert_rank(expert_rank)

    def set_expert_rank(self, expert_rank) -> None:
        """A new placement (after expert migration): ``expert_rank[e]`` is the rank of
        expert ``e``; the same table on every rank (checked at the next dispatch)."""
        table = [int(q) for q in expert_rank]
        if len(table) != self.num_experts:
            raise ValueError(f"expert_rank has {len(table)} entries, not num_experts = {self.num_experts}")
        self.expert_rank = table

    @property
    def local_experts(self) -> list:
        """This rank's experts (global ids, ascending): the order of ``recv_x``'s groups."""
        me = self.comm.rank
        return [e for e, q in enumerate(self.expert_rank) if q == me]

    def _check(self, x, what: str) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, not {type(x).__name__}")
        if x.device.type != "cpu":
            raise ValueError(
                f"{what} is on {x.device}: MoeDispatcher takes CPU tensors (the device path "
                "of the MoE calls is not built yet)"
            )

    def dispatch(self, x, topk_idx, topk_weights=None, async_finish=False):
        """Sends this rank's tokens ``x`` (``tokens x hidden``, a float type) to their
        experts ``topk_idx`` (``tokens x k``, int64, distinct per token). Collective.

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, tokens_per_expert,
        handle)``: the rows for this rank's experts (``rows x hidden``, grouped by local
        expert), each row's expert id, each row's gate from ``topk_weights`` (``tokens
        x k``; ``None`` without it), the rows per local expert, and the handle for
        :meth:`combine`. ``recv_x`` and ``recv_topk_weights`` carry gradients back to
        ``x`` and ``topk_weights``.

        With ``async_finish=True`` (DeepEP's) the routing is exchanged before it returns
        (``tokens_per_expert`` is known) but the rows move in the background: a sixth
        element, an :class:`EventOverlap`, says when ``recv_x`` and
        ``recv_topk_weights`` are ready (``event.current_stream_wait()``); ``x`` and
        ``topk_weights`` must not be written until then.
        """
        try:
            self._check_dispatch(x, topk_idx, topk_weights)
        except (TypeError, ValueError):
            # Take part in the routing exchange with an argument it refuses: the other
            # ranks fail naming this rank instead of waiting for it.
            try:
                self.comm.moe_route(None, self.expert_rank, self.mode)
            except (TypeError, ValueError):
                pass
            raise
        h = self.comm.moe_route(topk_idx.detach().to(torch.long).contiguous(), self.expert_rank, self.mode)
        handle = MoeDispatchHandle(h)
        works = [] if async_finish else None
        recv_x = _Dispatch.apply(x, h, works)
        weights = None if topk_weights is None else _DispatchPairs.apply(topk_weights, h, works)
        out = (recv_x, handle.row_expert, weights, list(handle.tokens_per_expert), handle)
        return (*out, EventOverlap(works)) if async_finish else out

    def _check_dispatch(self, x, topk_idx, topk_weights) -> None:
        self._check(x, "x")
        self._check(topk_idx, "topk_idx")
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"x has shape {tuple(x.shape)}, not (tokens, hidden = {self.hidden})")
        if x.dtype not in _FLOATS:
            raise TypeError(f"x is {x.dtype}: float16, bfloat16, float32 or float64")
        if topk_idx.dim() != 2 or topk_idx.shape[0] != x.shape[0]:
            raise ValueError(
                f"topk_idx has shape {tuple(topk_idx.shape)}, not ({x.shape[0]} tokens, k)"
            )
        if topk_weights is not None:
            self._check(topk_weights, "topk_weights")
            if tuple(topk_weights.shape) != tuple(topk_idx.shape):
                raise ValueError(
                    f"topk_weights has shape {tuple(topk_weights.shape)}, not topk_idx's "
                    f"{tuple(topk_idx.shape)}"
                )

    def combine(self, y, handle: MoeDispatchHandle, async_finish=False):
        """Brings the experts' rows ``y`` (``recv_x``'s rows, the gates applied by the
        caller) back: returns ``tokens x hidden``, each token the sum of its rows, added
        inside each node first and then over the nodes in ascending order (an order
        fixed by the routing and the topology). Collective. With ``async_finish=True``
        returns ``(out, event)``: ``out`` is ready once ``event.current_stream_wait()``
        has returned (:class:`EventOverlap`)."""
        self._check(y, "y")
        if not isinstance(handle, MoeDispatchHandle):
            raise TypeError("handle must be the one dispatch returned")
        if y.dtype not in _FLOATS:
            raise TypeError(f"y is {y.dtype}: float16, bfloat16, float32 or float64")
        works = [] if async_finish else None
        out = _Combine.apply(y, handle.handle, works)
        return (out, EventOverlap(works)) if async_finish else out

"""The ``"halo"`` torch.distributed backend: a Python ``ProcessGroup`` over libhalo.

Registered by ``import halo.torch``; see that module for how to use it and
docs/TORCH.md for what each operation supports. This module needs torch.

Why a Python ``ProcessGroup`` (torch's ``test_c10d_pypg.py`` way) and not a C++
``c10d::Backend`` (oneCCL's way): libhalo already has a C ABI and Python bindings, so a
Python process group is one file with no C++ toolchain, no build against torch's headers
and no ABI tie to one torch version. The price: torch's watchdog does not watch Python
backends, so HALO's own timeouts end every wait (each operation is bounded by the
communicator's timeout, which is torch's ``timeout``), and a few hundred nanoseconds of
Python per call (measured in docs/BENCHMARKS.md, "PyTorch").

Every operation is started as one of libhalo's non-blocking operations (``haloI*``):
they run on the communicator's worker thread in call order, and the returned work
object waits for them. ``get_future()`` hands the work to one completion thread per
process group (never a thread per call), which completes the future.
"""

from __future__ import annotations

import datetime
import queue
import threading
import weakref

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _CBackend
from torch._C._distributed_c10d import ProcessGroup as _CProcessGroup
from torch._C._distributed_c10d import Work as _CWork

from . import _comm
from ._lib import HaloError

__all__ = ["ProcessGroupHalo", "create_backend", "NAME"]

#: The backend's name in torch.distributed.
NAME = "halo"

#: The store key under which the group's rank 0 publishes HALO's unique id (128 bytes:
#: the bootstrap root's address and the job's random secret, so the secret travels
#: through torch's store and is never derived from public facts).
UNIQUE_ID_KEY = "halo/unique_id"

_RED = dist.ReduceOp.RedOpType
# torch's reduction -> libhalo's (by name, _comm._op).
_OPS = {
    _RED.SUM: "sum",
    _RED.AVG: "avg",
    _RED.PRODUCT: "prod",
    _RED.MIN: "min",
    _RED.MAX: "max",
}
# On bool tensors (moved as uint8): OR and AND are MAX and MIN.
_BOOL_OPS = {
    _RED.SUM: "max",
    _RED.MAX: "max",
    _RED.BOR: "max",
    _RED.MIN: "min",
    _RED.PRODUCT: "min",
    _RED.BAND: "min",
}


class _Shim(_CBackend):
    """The device backend torch's bookkeeping looks up (group name, flight recorder):
    every operation is the process group's own, so this one only names itself."""

    def getBackendName(self):  # noqa: N802 - torch's name
        return NAME

    def name(self):
        return NAME


def _ms(timeout) -> int:
    if timeout is None:
        return 0
    if isinstance(timeout, datetime.timedelta):
        ms = int(timeout.total_seconds() * 1000)
    else:
        ms = int(timeout)
    return max(1, min(ms, 2**31 - 1))


def _error(op: str, e: BaseException) -> BaseException:
    """torch's exception for a failure of ``op``: ``DistBackendError`` with HALO's
    message for what libhalo reported; argument errors stay ``ValueError`` /
    ``TypeError`` (they name the argument)."""
    if isinstance(e, HaloError):
        err = dist.DistBackendError(f"halo {op}: {e}")
        err.__cause__ = e
        return err
    return e


class _Work(_CWork):
    """A started operation of the ``"halo"`` backend (``torch.distributed.Work``).

    ``inner`` is libhalo's request (a :class:`halo.Work`) or None when the operation is
    already done; ``after`` runs once on success (copying staged results out);
    ``result`` is what the future holds (the output tensors).
    """

    def __init__(self, pg, op: str, inner, result, after=None, error=None):
        super().__init__()
        self._pg = pg
        self._op = op
        self._inner = inner
        self._after = after
        self._result = result
        self._lock = threading.Lock()
        self._done = inner is None and error is None and after is None
        self._exc = error
        if error is not None:
            self._done = True
        self._future = None
        self._parts = None  # the works a coalesced call is made of

    def _finish(self) -> None:
        with self._lock:
            if self._done:
                return
            try:
                if self._inner is not None:
                    self._inner.wait()
                if self._after is not None:
                    self._after()
            except BaseException as e:  # noqa: BLE001 - recorded, raised by wait()
                self._exc = _error(self._op, e)
            finally:
                self._done = True
                self._inner = None
                self._after = None

    def wait(self, timeout=None) -> bool:
        # Bounded by the communicator's timeout (torch's, set at init) in libhalo.
        self._finish()
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        inner = self._inner
        try:
            if self._parts is not None:
                done = all(w.is_completed() for w in self._parts)
            else:
                done = inner is None or inner.is_completed()
        except BaseException:  # noqa: BLE001 - the failure is kept for wait()
            done = True
        if done:
            self._finish()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._exc is None

    def exception(self):
        return self._exc

    def source_rank(self) -> int:
        return -1

    def synchronize(self) -> None:
        self.wait()

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        if self._future is None:
            fut = torch.futures.Future()
            self._future = fut
            if self._done:
                self._settle()
            else:
                self._pg._completer().put(self)
        return self._future

    def _settle(self) -> None:
        fut = self._future
        if fut is None:
            return
        if self._exc is not None:
            fut.set_exception(self._exc)
        else:
            fut.set_result(self._result)


def _completer_loop(q: queue.Queue) -> None:
    while True:
        w = q.get()
        if w is None:
            return
        w._finish()
        try:
            w._settle()
        except BaseException:  # noqa: BLE001 - a future set twice by its owner
            pass


class ProcessGroupHalo(_CProcessGroup):
    """A torch.distributed process group over one HALO communicator.

    Made by torch through the registered creator (``init_process_group("halo")``,
    ``new_group(ranks, backend="halo")``), one per group: the group's rank 0 creates
    HALO's unique id and puts it in the store torch hands the group; the others read
    it and join. torch's ``timeout`` is HALO's, for every operation and for joining.
    """

    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        self._timeout = timeout
        ms = _ms(timeout)
        if rank == 0:
            try:
                uid = _comm.get_unique_id()
            except HaloError as e:
                # The others are waiting for the id: tell them why there is none.
                store.set(UNIQUE_ID_KEY, b"error: " + str(e).encode())
                raise _error("init", e) from e
            store.set(UNIQUE_ID_KEY, uid)
        else:
            uid = store.get(UNIQUE_ID_KEY)  # bounded by the store's timeout
            if uid.startswith(b"error: "):
                raise dist.DistBackendError(
                    f"halo init: rank 0 of the group could not start HALO's bootstrap: {uid[7:].decode(errors='replace')}"
                )
        try:
            self._comm = _comm.init_rank(size, uid, rank, timeout_ms=ms or None)
        except HaloError as e:
            raise _error("init", e) from e
        self._queue = None
        self._thread = None
        self._lock = threading.Lock()
        weakref.finalize(self, ProcessGroupHalo._release, self._comm, self.__dict__)

    # -- what torch asks of a process group --------------------------------------

    def getBackendName(self):  # noqa: N802 - torch's name
        return NAME

    def name(self):
        return NAME

    @property
    def communicator(self) -> _comm.Communicator:
        """The HALO communicator behind this group."""
        return self._comm

    def _completer(self) -> queue.Queue:
        with self._lock:
            if self._queue is None:
                self._queue = queue.Queue()
                self._thread = threading.Thread(
                    target=_completer_loop,
                    args=(self._queue,),
                    name=f"halo-torch-completion-r{self.rank()}",
                    daemon=True,
                )
                self._thread.start()
            return self._queue

    @staticmethod
    def _release(comm, state) -> None:
        q = state.get("_queue")
        if q is not None:
            q.put(None)
        try:
            comm.destroy()
        except Exception:  # noqa: BLE001 - at exit
            pass

    def shutdown(self) -> None:
        """Frees the HALO communicator (``destroy_process_group``)."""
        ProcessGroupHalo._release(self._comm, self.__dict__)

    def abort(self) -> None:
        try:
            self._comm.abort()
        except Exception:  # noqa: BLE001
            pass

    # -- helpers ------------------------------------------------------------------

    def _run(self, op: str, call, result, after=None, opts=None) -> _Work:
        """Runs ``call(async_op)`` and wraps it in a work object.

        With ``async_op=True`` in torch's options (DDP's and the functional
        collectives' calls, ``async_op=True`` from the user) the operation is started
        as a libhalo request (``call(True)`` returns a :class:`halo.Work`), completed by
        ``wait()``. A blocking call (``async_op=False``, torch waits at once) runs the
        blocking form in this thread, so it costs no hand-over to the communicator's
        worker; it starts after the requests before it (libhalo keeps call order).
        Argument errors are raised at once, naming the argument; what libhalo
        reports is ``DistBackendError``."""
        blocking = opts is not None and getattr(opts, "asyncOp", True) is False
        try:
            inner = call(not blocking)
            if blocking:
                inner = None
                if after is not None:
                    after()
                    after = None
        except (ValueError, TypeError) as e:
            raise type(e)(f"halo {op}: {e}") from None
        except HaloError as e:
            raise _error(op, e) from e
        return _Work(self, op, inner, result, after)

    @staticmethod
    def _one(tensors, op: str, what: str = "tensors"):
        if len(tensors) != 1:
            raise ValueError(
                f"halo {op}: {what} has {len(tensors)} tensors; the halo backend takes "
                "one tensor per call (torch's multi-tensor form is deprecated)"
            )
        return tensors[0]

    def _root(self, root: int, op: str) -> int:
        root = int(root)
        if not 0 <= root < self.size():
            raise ValueError(f"halo {op}: root rank {root} is out of range for {self.size()} ranks")
        return root

    @staticmethod
    def _reduce_op(opts_op, tensor, op: str):
        """(libhalo op name, the tensor view to reduce) for torch's ``ReduceOp``."""
        kind = getattr(opts_op, "op", opts_op)
        if tensor.dtype == torch.bool:
            name = _BOOL_OPS.get(kind)
            if name is None:
                raise ValueError(f"halo {op}: ReduceOp.{kind.name} is not supported on bool tensors")
            return name, tensor.view(torch.uint8)
        name = _OPS.get(kind)
        if name is None:
            raise ValueError(
                f"halo {op}: ReduceOp.{getattr(kind, 'name', kind)} is not supported "
                "(supported: SUM, AVG, PRODUCT, MIN, MAX; BAND/BOR on bool tensors)"
            )
        if tensor.is_complex():
            if name not in ("sum", "avg"):
                raise ValueError(f"halo {op}: ReduceOp.{kind.name} is not supported on complex tensors")
            return name, torch.view_as_real(tensor)
        return name, tensor

    @staticmethod
    def _host(t, what: str, op: str):
        """``t`` itself on the CPU; collectives other than all-to-all take CPU tensors."""
        if t.device.type != "cpu":
            raise ValueError(
                f"halo {op}: {what} is on {t.device}; the halo backend moves CUDA tensors "
                "in all_to_all_single and all_to_all only (HALO's device path); pass CPU "
                "tensors, or keep this group's other collectives on NCCL/RCCL"
            )
        return t

    def _check_same(self, tensors, like, op: str, what: str) -> None:
        for i, t in enumerate(tensors):
            if t.dtype != like.dtype:
                raise TypeError(f"halo {op}: {what}[{i}] is {t.dtype}, not {like.dtype}")
            if t.numel() != like.numel():
                raise ValueError(
                    f"halo {op}: {what}[{i}] has {t.numel()} elements, not {like.numel()}"
                )

    def _one_per_rank(self, output_tensors, like, op: str, what: str):
        """For a list of one output tensor per rank (``all_gather``, ``gather``): one
        tensor the collective fills, and the step that copies it into the list."""
        outs = self._one(output_tensors, op, "output_tensors")
        if len(outs) != self.size():
            raise ValueError(f"halo {op}: {what} has {len(outs)} tensors; the group has {self.size()} ranks")
        self._check_same(outs, like, op, what)
        for i, o in enumerate(outs):
            self._host(o, f"{what}[{i}]", op)
        staged = torch.empty((self.size(),) + tuple(like.shape), dtype=like.dtype)

        def after():
            for i, o in enumerate(outs):
                o.copy_(staged[i])

        return staged, after

    # -- collectives --------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        op = "allreduce"
        t = self._host(self._one(tensors, op), "tensor", op)
        red = getattr(opts, "reduceOp", dist.ReduceOp.SUM) if opts is not None else dist.ReduceOp.SUM
        name, view = self._reduce_op(red, t, op)
        return self._run(op, lambda a: self._comm.all_reduce(view, name, async_op=a), tensors, opts=opts)

    def allreduce_coalesced(self, tensors, opts=None):
        works = [self.allreduce([t], opts) for t in tensors]
        return self._chain("allreduce_coalesced", works, tensors)

    def _chain(self, op: str, works, result):
        """One work for several (the coalesced forms): done when all are."""

        def after():
            for w in works:
                w.wait()

        work = _Work(self, op, None, result, after)
        work._parts = works
        return work

    def broadcast(self, tensors, opts=None):
        op = "broadcast"
        t = self._host(self._one(tensors, op), "tensor", op)
        root = self._root(opts.rootRank if opts is not None else 0, op)
        view = t.view(torch.uint8) if t.dtype == torch.bool else t
        return self._run(op, lambda a: self._comm.broadcast(view, root, async_op=a), tensors, opts=opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        op = "allgather"
        inp = self._host(self._one(input_tensors, op, "input_tensors"), "input", op)
        staged, after = self._one_per_rank(output_tensors, inp, op, "output_tensor_list")
        return self._run(
            op, lambda a: self._comm.all_gather(staged, inp.contiguous(), async_op=a), output_tensors, after, opts=opts)

    def _allgather_base(self, output, input, opts=None):
        op = "all_gather_into_tensor"
        self._host(output, "output_tensor", op)
        self._host(input, "input_tensor", op)
        if output.numel() != input.numel() * self.size():
            raise ValueError(
                f"halo {op}: output_tensor has {output.numel()} elements; it needs "
                f"{self.size()} x {input.numel()} (group size x input_tensor)"
            )
        if output.dtype != input.dtype:
            raise TypeError(f"halo {op}: output_tensor is {output.dtype} but input_tensor is {input.dtype}")
        return self._run(op, lambda a: self._comm.all_gather(output, input, async_op=a), [output], opts=opts)

    # torch >= 2.15's front end calls these names on the group (Python attribute look-up
    # finds them here); older torch calls the underscore forms.
    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def gather_single(self, output, input, opts=None):
        """``gather`` into one tensor at the root (``torch.distributed.gather_single``)."""
        op = "gather_single"
        self._host(input, "tensor", op)
        root = self._root(opts.rootRank if opts is not None else 0, op)
        if self.rank() != root:
            return self._run(op, lambda a: self._comm.gather(None, input, root, async_op=a), [], opts=opts)
        self._host(output, "output", op)
        if output.numel() != input.numel() * self.size():
            raise ValueError(
                f"halo {op}: output has {output.numel()} elements; it needs {self.size()} x {input.numel()}"
            )
        return self._run(op, lambda a: self._comm.gather(output, input, root, async_op=a), [output], opts=opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._chain("allgather_into_tensor_coalesced", works, outputs)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = "reduce_scatter"
        out = self._host(self._one(output_tensors, op, "output_tensors"), "output", op)
        ins = self._one(input_tensors, op, "input_tensors")
        if len(ins) != self.size():
            raise ValueError(
                f"halo {op}: input_list has {len(ins)} tensors; the group has {self.size()} ranks"
            )
        self._check_same(ins, out, op, "input_list")
        staged = torch.stack([self._host(x, f"input_list[{i}]", op) for i, x in enumerate(ins)])
        red = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name, oview = self._reduce_op(red, out, op)
        _, sview = self._reduce_op(red, staged, op)
        return self._run(
            op, lambda a: self._comm.reduce_scatter(oview, sview, name, async_op=a), output_tensors, opts=opts)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = "reduce_scatter_tensor"
        self._host(output, "output", op)
        self._host(input, "input", op)
        if input.numel() != output.numel() * self.size():
            raise ValueError(
                f"halo {op}: input has {input.numel()} elements; it needs {self.size()} x "
                f"{output.numel()} (group size x output)"
            )
        if output.dtype != input.dtype:
            raise TypeError(f"halo {op}: output is {output.dtype} but input is {input.dtype}")
        red = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name, oview = self._reduce_op(red, output, op)
        _, iview = self._reduce_op(red, input, op)
        return self._run(
            op, lambda a: self._comm.reduce_scatter(oview, iview, name, async_op=a), [output], opts=opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._chain("reduce_scatter_tensor_coalesced", works, outputs)

    def reduce(self, tensors, opts=None):
        # All-reduce into a copy; the root takes the result (other ranks' tensors are
        # left as they were, which torch allows).
        op = "reduce"
        t = self._host(self._one(tensors, op), "tensor", op)
        root = self._root(opts.rootRank if opts is not None else 0, op)
        red = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        tmp = t.clone()
        name, view = self._reduce_op(red, tmp, op)

        def after():
            if self.rank() == root:
                t.copy_(tmp)

        return self._run(op, lambda a: self._comm.all_reduce(view, name, async_op=a), tensors, after, opts=opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        op = "all_to_all_single"
        osz = list(output_split_sizes) or None
        isz = list(input_split_sizes) or None
        if output.device != input.device:
            raise ValueError(f"halo {op}: output is on {output.device} but input on {input.device}")
        return self._run(
            op,
            lambda a: self._comm.all_to_all_single(output, input, osz, isz, async_op=a),
            [output], opts=opts)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        op = "all_to_all"
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(
                f"halo {op}: output_tensor_list has {len(output_tensors)} and input_tensor_list "
                f"{len(input_tensors)} tensors; the group has {n} ranks"
            )
        return self._run(
            op, lambda a: self._comm.all_to_all(output_tensors, input_tensors, async_op=a), output_tensors, opts=opts)

    def barrier(self, opts=None):
        return self._run("barrier", lambda a: self._comm.barrier(async_op=a), [], opts=opts)

    def gather(self, output_tensors, input_tensors, opts=None):
        op = "gather"
        inp = self._host(self._one(input_tensors, op, "input_tensors"), "tensor", op)
        root = self._root(opts.rootRank if opts is not None else 0, op)
        if self.rank() != root:
            if output_tensors and any(len(x) for x in output_tensors):
                raise ValueError(f"halo {op}: gather_list must be empty on non-root ranks")
            return self._run(op, lambda a: self._comm.gather(None, inp.contiguous(), root, async_op=a), [], opts=opts)
        staged, after = self._one_per_rank(output_tensors, inp, op, "gather_list")
        return self._run(
            op, lambda a: self._comm.gather(staged, inp.contiguous(), root, async_op=a), output_tensors, after, opts=opts)

    def scatter(self, output_tensors, input_tensors, opts=None):
        op = "scatter"
        out = self._host(self._one(output_tensors, op, "output_tensors"), "tensor", op)
        root = self._root(opts.rootRank if opts is not None else 0, op)
        if self.rank() != root:
            if input_tensors and any(len(x) for x in input_tensors):
                raise ValueError(f"halo {op}: scatter_list must be empty on non-root ranks")
            return self._run(op, lambda a: self._comm.scatter(out, None, root, async_op=a), output_tensors, opts=opts)
        ins = self._one(input_tensors, op, "input_tensors")
        if len(ins) != self.size():
            raise ValueError(f"halo {op}: scatter_list has {len(ins)} tensors; the group has {self.size()} ranks")
        self._check_same(ins, out, op, "scatter_list")
        staged = torch.stack([self._host(x, f"scatter_list[{i}]", op) for i, x in enumerate(ins)])
        return self._run(op, lambda a: self._comm.scatter(out, staged, root, async_op=a), output_tensors, opts=opts)

    def send(self, tensors, dst, tag=0):
        op = "send"
        t = self._host(self._one(tensors, op), "tensor", op)
        peer = self._root(dst, op)
        return self._run(op, lambda a: self._comm.isend(t, peer, tag=int(tag)), tensors)

    def recv(self, tensors, src, tag=0):
        op = "recv"
        t = self._host(self._one(tensors, op), "tensor", op)
        peer = self._root(src, op)
        return self._run(op, lambda a: self._comm.irecv(t, peer, tag=int(tag)), tensors)

    def recv_anysource(self, tensors, tag=0):
        raise ValueError(
            "halo recv: a receive from any source (src=None) is not supported by the halo "
            "backend; name the source rank"
        )


def create_backend(store, rank, size, timeout):
    """torch's creator for ``"halo"`` (``Backend.register_backend``)."""
    pg = ProcessGroupHalo(store, rank, size, timeout)
    pg._set_default_backend(_CProcessGroup.BackendType.CUSTOM)
    for device in ("cpu", "cuda"):
        pg._register_backend(torch.device(device), _CProcessGroup.BackendType.CUSTOM, _Shim(rank, size))
    return pg

"""The communicator: a rank's handle on a group of ranks, over libhalo's C API.

Over 800 lines: one class and its argument helpers, one method per C call (blocking
and ``async_op``), each checking its buffers the same way before the call; splitting
the class would split the API a user reads in one place.
"""

from __future__ import annotations

import ctypes
import json
import operator

from . import _lib
from ._buffers import as_buffer
from ._lib import ReduceOp, check, library

__all__ = ["Communicator", "init", "init_rank", "get_unique_id"]


def _splits(sizes, rows: int, n: int, what: str) -> list:
    """Validated rows per rank along dim 0 of ``what`` (torch's rules)."""
    if sizes is None:
        if rows % n:
            raise ValueError(
                f"{what} has {rows} rows along dim 0, which do not split evenly across "
                f"{n} ranks; pass {what}_split_sizes"
            )
        return [rows // n] * n
    if hasattr(sizes, "tolist"):  # a torch.Tensor or numpy array of sizes
        sizes = sizes.tolist()
    try:
        sizes = list(sizes)
    except TypeError:
        raise TypeError(f"{what}_split_sizes must be a sequence of ints, not {type(sizes).__name__}") from None
    if len(sizes) != n:
        raise ValueError(f"{what}_split_sizes has {len(sizes)} entries; the communicator has {n} ranks")
    out = []
    for q, s in enumerate(sizes):
        try:
            s = operator.index(s)
        except TypeError:
            raise TypeError(
                f"{what}_split_sizes[{q}] is {s!r}, not an integer"
            ) from None
        if s < 0:
            raise ValueError(f"{what}_split_sizes[{q}] is {s}; sizes must be >= 0")
        out.append(s)
    if sum(out) != rows:
        raise ValueError(
            f"{what}_split_sizes sum to {sum(out)}, but {what} has {rows} rows along dim 0"
        )
    return out


def _size_array(values):
    return (ctypes.c_size_t * len(values))(*values)


def _prefix(counts):
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out, total


def _op(op) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            pass
    raise ValueError(
        f"op {op!r} is not a reduction HALO supports: use 'sum', 'prod', 'max', 'min', "
        "'avg' or a halo.ReduceOp"
    )


def _int_arg(value, what: str) -> int:
    """An integer argument (an int or anything with ``__index__``), else TypeError."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


def _rank_arg(value, what: str, n: int) -> int:
    """A rank argument in 0 .. n-1, else TypeError / ValueError naming it."""
    v = _int_arg(value, what)
    if not 0 <= v < n:
        raise ValueError(f"{what} {v} is out of range for {n} ranks (0 .. {n - 1})")
    return v


def _tag_arg(value) -> int:
    """A user tag in 0 .. MAX_TAG, else TypeError / ValueError."""
    v = _int_arg(value, "tag")
    if not 0 <= v <= _lib.MAX_TAG:
        raise ValueError(f"tag {v} is out of range (0 .. {_lib.MAX_TAG})")
    return v


def _pair(output, input, what_out="output", what_in="input"):
    """The buffers of an (output, input) pair of one data type."""
    out = as_buffer(output, what_out, writable=True)
    inp = as_buffer(input, what_in)
    if inp.dtype_name != out.dtype_name:
        raise TypeError(f"{what_in} is {inp.dtype_name} but {what_out} is {out.dtype_name}")
    return out, inp


def _same_dtype(bufs, what: str) -> None:
    first = bufs[0]
    for b in bufs[1:]:
        if b.dtype_name != first.dtype_name:
            raise TypeError(f"{what} mixes data types: {first.dtype_name} and {b.dtype_name}")


def _consecutive(bufs):
    """The first pointer when the buffers lie back to back in memory (as the pieces
    of one array split along dim 0 do), else None."""
    base, at = None, None
    for b in bufs:
        if b.nbytes == 0:
            continue
        if base is None:
            base, at = b.ptr, b.ptr
        if b.ptr != at:
            return None
        at += b.nbytes
    return base if base is not None else 0


class Communicator:
    """One rank's handle on a group of ranks (a ``haloComm_t``).

    Made by :func:`init` (under ``halo launch``, torchrun, mpirun or srun),
    :func:`init_rank` or :meth:`split`. Collectives block until this rank's part is
    done, and every rank calls them in the same order. A communicator is used by one
    thread at a time (a second thread gets ``HaloError`` with ``INVALID_USAGE``).
    Freed by :meth:`destroy` or by leaving a ``with`` block.

    Errors: arguments that are wrong on this rank raise ``TypeError`` or
    ``ValueError`` before anything is sent (like torch.distributed, the other ranks are
    not told); what libhalo reports raises :class:`HaloError` (e.g. ranks that disagree
    on a count: ``Result.INVALID_USAGE`` on every rank, nothing moved).
    """

    def __init__(self, handle: ctypes.c_void_p):
        self._handle = handle
        lib = library()
        v = ctypes.c_int(0)
        check(lib.haloCommCount(handle, ctypes.byref(v)), handle)
        self._size = v.value
        check(lib.haloCommUserRank(handle, ctypes.byref(v)), handle)
        self._rank = v.value
        self._topology = None

    # -- properties ---------------------------------------------------------------

    def _h(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise ValueError("this communicator was destroyed")
        return self._handle

    @property
    def rank(self) -> int:
        """This rank's index, 0 .. size-1."""
        return self._rank

    @property
    def size(self) -> int:
        """The number of ranks."""
        return self._size

    @property
    def topology(self) -> dict:
        """The communicator's machine model, parsed from ``haloTopologyJson`` (the
        ``halo topo --json`` format)."""
        if self._topology is None:
            h = self._h()
            lib = library()
            needed = ctypes.c_size_t(0)
            check(lib.haloTopologyJson(h, None, 0, ctypes.byref(needed)), h)
            buf = ctypes.create_string_buffer(needed.value)
            check(lib.haloTopologyJson(h, buf, needed.value, ctypes.byref(needed)), h)
            self._topology = json.loads(buf.value.decode("utf-8"))
        return self._topology

    def __repr__(self) -> str:
        state = "" if self._handle is not None else ", destroyed"
        return f"<halo.Communicator rank={self._rank} size={self._size}{state}>"

    # -- collectives --------------------------------------------------------------

    def _start(self, fn, *args, keep=()):
        """Starts a non-blocking call (``haloI*``) and returns its :class:`Work`."""
        h = self._h()
        req = ctypes.c_void_p()
        check(fn(*args, h, ctypes.byref(req)), h)
        return Work(req, h, keep)

    def _call(self, name, args, keep, result, async_op, stream=None):
        """Calls ``halo<name>(*args, comm, stream)`` and returns ``result``, or with
        ``async_op`` starts ``haloI<name>(*args, comm, &request)`` and returns its
        :class:`Work`, which keeps ``keep`` alive until it completes."""
        lib = library()
        if async_op:
            return self._start(getattr(lib, "haloI" + name), *args, keep=keep)
        h = self._h()
        check(getattr(lib, "halo" + name)(*args, h, stream), h)
        return result

    def send(self, array, dst, tag=0):
        """Sends ``array`` (contiguous) to rank ``dst`` (``haloSendTagged``,
        ``torch.distributed.send``), blocking until libhalo is done with it. Messages
        between two ranks with the same ``tag`` (``0 .. halo.MAX_TAG``) match in call
        order; other tags are independent. Returns ``None``."""
        h = self._h()
        dst = _rank_arg(dst, "dst", self._size)
        tag = _tag_arg(tag)
        b = as_buffer(array, "array")
        check(library().haloSendTagged(b.ptr, b.numel, b.dtype, dst, tag, h, None), h)

    def recv(self, array, src, tag=0):
        """Receives ``array.size`` elements from rank ``src`` with ``tag`` into
        ``array`` (``haloRecvTagged``, ``torch.distributed.recv``); returns ``array``.
        The sender's size must match (else ``HaloError`` ``INVALID_USAGE``)."""
        h = self._h()
        src = _rank_arg(src, "src", self._size)
        tag = _tag_arg(tag)
        b = as_buffer(array, "array", writable=True)
        check(library().haloRecvTagged(b.ptr, b.numel, b.dtype, src, tag, h, None), h)
        return array

    def isend(self, array, dst, tag=0):
        """Starts sending ``array`` (contiguous) to rank ``dst`` with ``tag``
        (``haloISendTagged``, ``torch.distributed.isend``); returns a :class:`Work`.
        ``array`` must not be written until the work completes (the work object keeps
        it alive)."""
        dst = _rank_arg(dst, "dst", self._size)
        tag = _tag_arg(tag)
        b = as_buffer(array, "array")
        return self._start(
            library().haloISendTagged, b.ptr, b.numel, b.dtype, dst, tag, keep=(array,)
        )

    def irecv(self, array, src, tag=0):
        """Starts receiving ``array.size`` elements from rank ``src`` with ``tag`` into
        ``array`` (``haloIRecvTagged``, ``torch.distributed.irecv``); returns a
        :class:`Work`."""
        src = _rank_arg(src, "src", self._size)
        tag = _tag_arg(tag)
        b = as_buffer(array, "array", writable=True)
        return self._start(
            library().haloIRecvTagged, b.ptr, b.numel, b.dtype, src, tag, keep=(array,)
        )

    def all_to_all_single(
        self, output, input, output_split_sizes=None, input_split_sizes=None, async_op=False
    ):
        """All-to-all of one array (``torch.distributed.all_to_all_single``).

        ``input`` is split along dim 0 into ``input_split_sizes[q]`` rows for rank
        ``q`` (``None``: ``input.shape[0] / size`` rows each); the rows from rank ``q``
        land, in rank order, in ``output``, ``output_split_sizes[q]`` of them
        (``None``: an even split). A row is everything behind one index of dim 0, so
        ``input`` and ``output`` need the same data type and the same number of
        elements per row; sizes may be zero. ``output`` and ``input`` are contiguous
        CPU numpy arrays or torch tensors and must not overlap. Returns ``output``, or
        with ``async_op=True`` a :class:`Work` at once (``haloIAllToAll(v)``): the
        exchange runs in the background, in call order with the communicator's other
        calls, and ``output`` holds the result once ``wait()`` returned.

        Raises ``ValueError`` / ``TypeError`` for arguments that are wrong on this rank
        (split sizes that do not sum to dim 0, a wrong number of sizes, negative
        sizes, uneven dim 0 without sizes, mismatched data types or rows, memory HALO
        cannot use), before anything is sent; :class:`HaloError` when libhalo rejects
        the call (ranks that disagree on a count: ``INVALID_USAGE`` on every rank,
        ``output`` untouched) or the exchange fails.
        """
        h = self._h()
        n = self._size
        out = as_buffer(output, "output", writable=True, device_ok=True)
        inp = as_buffer(input, "input", device_ok=True)
        # Device buffers carry their stream (the device path); libhalo tells device from
        # host memory itself and rejects one of each.
        stream = out.stream if out.stream is not None else inp.stream
        if inp.dtype_name != out.dtype_name:
            raise TypeError(f"input is {inp.dtype_name} but output is {out.dtype_name}")
        if not inp.shape or not out.shape:
            raise ValueError("input and output need at least one dimension (rows along dim 0)")
        if inp.row_elements != out.row_elements:
            raise ValueError(
                f"input rows hold {inp.row_elements} elements (shape {inp.shape}) but "
                f"output rows hold {out.row_elements} (shape {out.shape})"
            )
        send = _splits(input_split_sizes, inp.shape[0], n, "input")
        recv = _splits(output_split_sizes, out.shape[0], n, "output")
        row = inp.row_elements
        lib = library()
        if (
            input_split_sizes is None
            and output_split_sizes is None
            and send[0] == recv[0]
        ):
            # torch's even split: every rank sends and receives the same count.
            if async_op:
                return self._start(
                    lib.haloIAllToAll, inp.ptr, out.ptr, send[0] * row, inp.dtype,
                    keep=(output, input),
                )
            check(
                lib.haloAllToAll(inp.ptr, out.ptr, send[0] * row, inp.dtype, h, stream),
                h,
            )
            return output
        sc = [s * row for s in send]
        rc = [r * row for r in recv]
        sd, _ = _prefix(sc)
        rd, _ = _prefix(rc)
        if async_op:
            # The count arrays are copied by haloIAllToAllv: only the data stays borrowed.
            return self._start(
                lib.haloIAllToAllv,
                inp.ptr,
                _size_array(sc),
                _size_array(sd),
                out.ptr,
                _size_array(rc),
                _size_array(rd),
                inp.dtype,
                keep=(output, input),
            )
        check(
            lib.haloAllToAllv(
                inp.ptr,
                _size_array(sc),
                _size_array(sd),
                out.ptr,
                _size_array(rc),
                _size_array(rd),
                inp.dtype,
                h,
                stream,
            ),
            h,
        )
        return output

    def all_to_all(self, output_list, input_list, async_op=False):
        """All-to-all of lists (``torch.distributed.all_to_all``): ``input_list[q]``
        goes to rank ``q``, and what rank ``q`` sends lands in ``output_list[q]``.

        Both lists hold one array per rank, of one data type; sizes may differ and be
        zero, and ``output_list[q]`` has as many elements as rank ``q``'s
        ``input_list[me]``. Arrays that lie back to back in memory (the pieces of one
        array split along dim 0) are used in place; otherwise they are staged through
        one contiguous buffer (one copy each way). Returns ``output_list``, or with
        ``async_op=True`` a :class:`Work` (``haloIAllToAllv``; staged results are copied
        into ``output_list`` by its ``wait()``). Errors as :meth:`all_to_all_single`.
        """
        h = self._h()
        n = self._size
        ins = list(input_list)
        outs = list(output_list)
        if len(ins) != n or len(outs) != n:
            raise ValueError(
                f"input_list has {len(ins)} and output_list {len(outs)} entries; the "
                f"communicator has {n} ranks"
            )
        ib = [as_buffer(x, f"input_list[{q}]", device_ok=True) for q, x in enumerate(ins)]
        ob = [as_buffer(x, f"output_list[{q}]", writable=True, device_ok=True) for q, x in enumerate(outs)]
        _same_dtype(ib + ob, "input_list and output_list")
        streams = {b.stream for b in ib + ob}
        stream = next((x for x in streams if x is not None), None)
        dtype, itemsize = ib[0].dtype, ib[0].itemsize
        sc = [b.numel for b in ib]
        rc = [b.numel for b in ob]
        sd, stotal = _prefix(sc)
        rd, rtotal = _prefix(rc)

        send_ptr = _consecutive(ib)
        if stream is not None and (send_ptr is None or _consecutive(ob) is None):
            raise ValueError(
                "device arrays in all_to_all must be the consecutive pieces of one array "
                "each way (HALO does not stage device memory); use all_to_all_single"
            )
        staged_send = None
        if send_ptr is None:
            staged_send = (ctypes.c_ubyte * (stotal * itemsize))()
            send_ptr = ctypes.addressof(staged_send)
            for b, d in zip(ib, sd):
                ctypes.memmove(send_ptr + d * itemsize, b.ptr, b.nbytes)
        recv_ptr = _consecutive(ob)
        staged_recv = None
        if recv_ptr is None:
            staged_recv = (ctypes.c_ubyte * (rtotal * itemsize))()
            recv_ptr = ctypes.addressof(staged_recv)
        args = (
            send_ptr or None,
            _size_array(sc),
            _size_array(sd),
            recv_ptr or None,
            _size_array(rc),
            _size_array(rd),
            dtype,
        )

        def copy_out():
            if staged_recv is not None:
                for b, d in zip(ob, rd):
                    ctypes.memmove(b.ptr, recv_ptr + d * itemsize, b.nbytes)

        if async_op:
            if stream is not None:
                raise ValueError("all_to_all of device arrays with async_op=True is not supported")
            work = self._start(
                library().haloIAllToAllv,
                *args,
                keep=(output_list, input_list, staged_send, staged_recv, args),
            )
            work._after = copy_out
            return work
        check(library().haloAllToAllv(*args, h, stream), h)
        copy_out()
        return output_list

    def all_reduce(self, array, op="sum", async_op=False):
        """All-reduce in place (``torch.distributed.all_reduce``): every element becomes
        the ``op`` ('sum', 'prod', 'max', 'min', 'avg', or a :class:`ReduceOp`) of that
        element over all ranks; every rank gets the same bits. Every data type
        (int8 and uint8, float16 and bfloat16 included; 'avg' truncates integers).
        Returns ``array``, or with ``async_op=True`` a :class:`Work`
        (``haloIAllReduce``)."""
        self._h()  # a destroyed communicator: ValueError before anything else
        op = _op(op)
        b = as_buffer(array, "array", writable=True)
        return self._call("AllReduce", (b.ptr, b.ptr, b.numel, b.dtype, op), (array,), array, async_op)

    def all_gather(self, output, input, async_op=False):
        """All-gather (``torch.distributed.all_gather_into_tensor``): ``output`` (any
        shape, ``size * input.size`` elements of ``input``'s data type) gets rank
        ``r``'s ``input`` at element offset ``r * input.size``. Returns ``output``, or
        with ``async_op=True`` a :class:`Work` (``haloIAllGather``)."""
        self._h()  # a destroyed communicator: ValueError before anything else
        out, inp = _pair(output, input)
        if out.numel != self._size * inp.numel:
            raise ValueError(
                f"output has {out.numel} elements; all_gather needs size x input = "
                f"{self._size} x {inp.numel}"
            )
        args = (inp.ptr, out.ptr, inp.numel, inp.dtype)
        return self._call("AllGather", args, (output, input), output, async_op)

    def reduce_scatter(self, output, input, op="sum", async_op=False):
        """Reduce-scatter (``torch.distributed.reduce_scatter_tensor``): ``input``
        holds ``size * output.size`` elements; this rank's ``output`` becomes block
        ``rank`` of ``input`` (elements ``rank * output.size ..``) combined with ``op``
        (as :meth:`all_reduce`) over all ranks. Returns ``output``, or with
        ``async_op=True`` a :class:`Work` (``haloIReduceScatter``)."""
        self._h()  # a destroyed communicator: ValueError before anything else
        op = _op(op)
        out, inp = _pair(output, input)
        if inp.numel != self._size * out.numel:
            raise ValueError(
                f"input has {inp.numel} elements; reduce_scatter needs size x output = "
                f"{self._size} x {out.numel}"
            )
        args = (inp.ptr, out.ptr, out.numel, out.dtype, op)
        return self._call("ReduceScatter", args, (output, input), output, async_op)

    def broadcast(self, array, root, async_op=False):
        """Broadcast in place (``torch.distributed.broadcast``): ``array`` of rank
        ``root`` is copied into ``array`` of every rank. Returns ``array``, or with
        ``async_op=True`` a :class:`Work` (``haloIBroadcast``)."""
        self._h()  # a destroyed communicator: ValueError before anything else
        root = _rank_arg(root, "root", self._size)
        b = as_buffer(array, "array", writable=True)
        return self._call("Broadcast", (b.ptr, b.ptr, b.numel, b.dtype, root), (array,), array, async_op)

    def gather(self, output, input, root, async_op=False):
        """Gather to ``root`` (``torch.distributed.gather`` into one array): at the
        root, ``output`` (any shape, ``size * input.size`` elements of ``input``'s
        data type) gets rank ``r``'s ``input`` at element offset ``r * input.size``;
        elsewhere ``output`` is not used and may be ``None``. Returns ``output``, or
        with ``async_op=True`` a :class:`Work` (``haloIGather``)."""
        self._h()  # a destroyed communicator: ValueError before anything else
        root = _rank_arg(root, "root", self._size)
        inp = as_buffer(input, "input")
        out_ptr = None
        if self._rank == root:
            if output is None:
                raise ValueError("output is None at the root of gather")
            out, inp = _pair(output, input)
            if out.numel != self._size * inp.numel:
                raise ValueError(
                    f"output has {out.numel} elements; gather needs size x input = "
                    f"{self._size} x {inp.numel} at the root"
                )
            out_ptr = out.ptr
        args = (inp.ptr, out_ptr, inp.numel, inp.dtype, root)
        return self._call("Gather", args, (output, input), output, async_op)

    def scatter(self, output, input, root, async_op=False):
        """Scatter from ``root`` (``torch.distributed.scatter`` from one array): at the
        root ``input`` holds ``size * output.size`` elements of ``output``'s data type,
        and block ``r`` (elements ``r * output.size ..``) lands in ``output`` of rank
        ``r``; elsewhere ``input`` is not used and may be ``None``. Returns ``output``,
        or with ``async_op=True`` a :class:`Work` (``haloIScatter``)."""
        self._h()  # a destroyed communicator: ValueError before anything else
        root = _rank_arg(root, "root", self._size)
        out = as_buffer(output, "output", writable=True)
        in_ptr = None
        if self._rank == root:
            if input is None:
                raise ValueError("input is None at the root of scatter")
            out, inp = _pair(output, input)
            if inp.numel != self._size * out.numel:
                raise ValueError(
                    f"input has {inp.numel} elements; scatter needs size x output = "
                    f"{self._size} x {out.numel} at the root"
                )
            in_ptr = inp.ptr
        args = (in_ptr, out.ptr, out.numel, out.dtype, root)
        return self._call("Scatter", args, (output, input), output, async_op)

    def barrier(self, async_op=False):
        """Waits until every rank has called ``barrier``; with ``async_op=True``
        returns a :class:`Work` at once (``haloIBarrier``)."""
        lib = library()
        if async_op:
            return self._start(lib.haloIBarrier)
        h = self._h()
        check(lib.haloBarrier(h), h)

    # -- communicators ------------------------------------------------------------

    def split(self, color, key=None):
        """Splits the communicator (``haloCommSplit``, ``MPI_Comm_split``): collective
        over this communicator. Ranks that pass the same ``color`` form a new
        communicator ordered by ``key`` (default: this rank), then by rank; a rank
        that passes ``None`` or a negative color joins none and gets ``None``."""
        h = self._h()

        def integer(name, value):
            try:
                return operator.index(value)
            except TypeError:
                raise TypeError(
                    f"split: {name} must be an int or None, not {type(value).__name__}"
                ) from None

        color = None if color is None else integer("color", color)
        color = _lib.SPLIT_NOCOLOR if color is None or color < 0 else color
        key = self._rank if key is None else integer("key", key)
        new = ctypes.c_void_p()
        check(library().haloCommSplit(h, color, key, ctypes.byref(new), None), h)
        return Communicator(new) if new.value else None

    def moe_route(self, topk_idx, expert_rank, mode="auto"):
        """Exchanges a MoE routing (``haloMoeHandleCreate``; DeepEP's
        ``get_dispatch_layout`` and the metadata of its ``dispatch``): this rank's
        tokens each go to the experts in their row of ``topk_idx`` (a contiguous int64
        array, ``tokens x k``: distinct ids ``0 .. len(expert_rank) - 1`` per token),
        expert ``e`` living on rank ``expert_rank[e]`` (the same table on every rank).
        ``mode``: ``"auto"``, ``"dedup"`` (one copy of a token per destination node),
        ``"direct"`` (one per expert), or a :class:`MoeMode`. Collective. Returns a
        :class:`MoeHandle` for the data calls.

        Raises ``TypeError`` / ``ValueError`` for arguments Python can see are wrong
        (the other ranks then raise :class:`HaloError` ``INVALID_USAGE`` naming this
        rank, not a timeout); :class:`HaloError` for what libhalo rejects (an id out
        of range: ``INVALID_ARGUMENT`` here, ``INVALID_USAGE`` on the others).
        """
        h = self._h()
        lib = library()
        problem = None
        try:
            mode = _moe_mode(mode)
            table = [operator.index(q) for q in expert_rank]
            if not table:
                raise ValueError("expert_rank is empty: at least one expert")
            idx = as_buffer(topk_idx, "topk_idx")
            if idx.dtype != _lib.DataType.INT64:
                raise TypeError(f"topk_idx is {idx.dtype_name}, not int64 (torch.long)")
            if len(idx.shape) != 2 or idx.shape[1] < 1:
                raise ValueError(f"topk_idx must be tokens x k with k >= 1, not shape {idx.shape}")
        except (TypeError, ValueError) as e:
            problem = e
        handle = ctypes.c_uint64(0)
        if problem is not None:
            # Take part with an argument libhalo refuses collectively (topK 0): the
            # other ranks fail naming this one instead of waiting for it.
            one = (ctypes.c_int32 * 1)(0)
            lib.haloMoeHandleCreate(None, 0, 0, one, 1, 0, h, None, ctypes.byref(handle))
            raise problem
        ranks = (ctypes.c_int32 * len(table))(*table)
        check(
            lib.haloMoeHandleCreate(
                idx.ptr, idx.shape[0], idx.shape[1], ranks, len(table), int(mode), h, None,
                ctypes.byref(handle),
            ),
            h,
        )
        return MoeHandle(self, handle.value, keep=topk_idx)

    def destroy(self) -> None:
        """Frees the communicator (local: the other ranks are not waited for). Later
        calls on it raise ``ValueError``; calling ``destroy`` again does nothing."""
        h, self._handle = self._handle, None
        if h is not None:
            check(library().haloCommDestroy(h), None)

    def abort(self) -> None:
        """Aborts the communicator (``haloCommAbort``): a collective blocked in another
        thread returns ``HaloError`` with ``ABORTED``; the other ranks' collectives
        fail too. The communicator is freed."""
        h, self._handle = self._handle, None
        if h is not None:
            check(library().haloCommAbort(h), None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False

    def __del__(self):
        try:
            if getattr(self, "_handle", None) is not None:
                self.destroy()
        except Exception:
            pass


def _moe_mode(mode) -> _lib.MoeMode:
    if isinstance(mode, _lib.MoeMode):
        return mode
    names = {"auto": _lib.MoeMode.AUTO, "dedup": _lib.MoeMode.DEDUP, "direct": _lib.MoeMode.DIRECT}
    if isinstance(mode, str) and mode in names:
        return names[mode]
    raise ValueError(f"mode {mode!r} is not 'auto', 'dedup', 'direct' or a halo.MoeMode")


class MoeHandle:
    """A MoE routing exchanged by :meth:`Communicator.moe_route` (``haloMoeHandle_t``):
    the rows each rank's experts receive, from where, and how they go back. Use it for
    one layer's forward and backward, as often as needed; freed when collected (or by
    :meth:`free`).

    The received rows are ordered by local expert (ascending id), then source rank,
    then token index at the source: already grouped for the experts (no permutation).
    ``num_recv_rows``, ``num_local_experts``, ``num_tokens``, ``top_k`` and
    :meth:`layout` are local (no communication).
    """

    def __init__(self, comm: Communicator, handle: int, keep=None):
        self._comm = comm
        self._handle = handle
        rows, nl, t, k = ctypes.c_size_t(), ctypes.c_int(), ctypes.c_size_t(), ctypes.c_int()
        h = comm._h()
        check(
            library().haloMoeHandleGetInfo(
                handle, h, ctypes.byref(rows), ctypes.byref(nl), ctypes.byref(t), ctypes.byref(k)
            ),
            h,
        )
        self.num_recv_rows = rows.value
        self.num_local_experts = nl.value
        self.num_tokens = t.value
        self.top_k = k.value
        del keep

    def __repr__(self) -> str:
        return (
            f"<halo.MoeHandle {self._handle} tokens={self.num_tokens} k={self.top_k} "
            f"recv_rows={self.num_recv_rows} local_experts={self.num_local_experts}>"
        )

    def _id(self) -> int:
        if self._handle is None:
            raise ValueError("the MoE handle was freed")
        return self._handle

    def layout(self) -> dict:
        """This rank's side of the routing, as lists: ``local_experts`` (ascending),
        ``tokens_per_expert`` (rows per local expert), and per received row
        ``row_expert``, ``row_src_rank``, ``row_src_token``."""
        r, e = self.num_recv_rows, self.num_local_experts
        arrays = {
            "local_experts": (ctypes.c_int32 * e)(),
            "tokens_per_expert": (ctypes.c_int64 * e)(),
            "row_expert": (ctypes.c_int32 * r)(),
            "row_src_rank": (ctypes.c_int32 * r)(),
            "row_src_token": (ctypes.c_int64 * r)(),
        }
        h = self._comm._h()
        check(library().haloMoeHandleGetLayout(self._id(), h, *arrays.values()), h)
        return {name: list(a) for name, a in arrays.items()}

    def _data(self, name, inp, out, in_rows, out_rows, rows_of, what_in, what_out, async_op=False):
        """One data call: ``inp`` (``in_rows`` x hidden) to ``out`` (``out_rows`` x
        hidden) with ``rows_of`` true, else one element per row (the pairs). With
        ``async_op``, ``haloIMoe<name>``: returns a :class:`Work`."""
        h = self._comm._h()
        lib = library()
        fn = getattr(lib, ("haloIMoe" if async_op else "haloMoe") + name)
        req = ctypes.c_void_p()
        last = ctypes.byref(req) if async_op else None
        try:
            i = as_buffer(inp, what_in)
            o = as_buffer(out, what_out, writable=True)
            if i.dtype_name != o.dtype_name:
                raise TypeError(f"{what_in} is {i.dtype_name} but {what_out} is {o.dtype_name}")
            hidden = i.row_elements if rows_of else 1
            for b, rows, what in ((i, in_rows, what_in), (o, out_rows, what_out)):
                want = (rows, hidden) if rows_of else (rows,)
                if rows_of and (not b.shape or b.shape[0] != rows or b.row_elements != hidden):
                    raise ValueError(f"{what} has shape {b.shape}, not {rows} rows of {hidden} elements")
                if not rows_of and b.numel != rows:
                    raise ValueError(f"{what} has {b.numel} elements, not {want[0]}")
        except (TypeError, ValueError):
            # Take part with a data type libhalo refuses collectively: the other ranks
            # fail naming this one instead of waiting for it.
            args = (None, None, 0, -1) if rows_of else (None, None, -1)
            fn(*args, self._id(), h, last)
            raise
        args = (i.ptr, o.ptr, hidden, i.dtype) if rows_of else (i.ptr, o.ptr, i.dtype)
        check(fn(*args, self._id(), h, last), h)
        if async_op:
            # The request keeps the routing (the handle may be freed meanwhile); the
            # work keeps the arrays.
            return Work(req, h, (inp, out))
        return out

    def dispatch(self, x, out, async_op=False):
        """``x`` (``num_tokens`` rows) to ``out`` (``num_recv_rows`` rows of the same
        width and type): each token to each of its experts (``haloMoeDispatch``).
        Collective; returns ``out``, or with ``async_op=True`` a :class:`Work`
        (``haloIMoeDispatch``; ``out`` is filled once it has completed)."""
        return self._data(
            "Dispatch", x, out, self.num_tokens, self.num_recv_rows, True, "x", "out", async_op
        )

    def combine(self, y, out, async_op=False):
        """``y`` (``num_recv_rows`` rows, float types) back to ``out`` (``num_tokens``
        rows): each token gets the sum of its rows (``haloMoeCombine``, reduced inside
        each node first). Collective; returns ``out``, or with ``async_op=True`` a
        :class:`Work` (``haloIMoeCombine``)."""
        return self._data(
            "Combine", y, out, self.num_recv_rows, self.num_tokens, True, "y", "out", async_op
        )

    def dispatch_pairs(self, per_slot, out, async_op=False):
        """One value per (token, slot) (``num_tokens x top_k``) to one per received
        row (``haloMoeDispatchPairs``: each row's gate weight). Collective; with
        ``async_op=True`` a :class:`Work` (``haloIMoeDispatchPairs``)."""
        return self._data(
            "DispatchPairs", per_slot, out, self.num_tokens * self.top_k, self.num_recv_rows, False,
            "per_slot", "out", async_op,
        )

    def combine_pairs(self, per_row, out, async_op=False):
        """The reverse of :meth:`dispatch_pairs` (``haloMoeCombinePairs``; with
        ``async_op=True`` ``haloIMoeCombinePairs``). Collective."""
        return self._data(
            "CombinePairs", per_row, out, self.num_recv_rows, self.num_tokens * self.top_k, False,
            "per_row", "out", async_op,
        )

    def free(self) -> None:
        """Frees the handle (local); later calls raise ``ValueError``."""
        handle, self._handle = self._handle, None
        if handle is not None:
            check(library().haloMoeHandleFree(handle), None)

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass


class Work:
    """A started non-blocking operation (``torch.distributed.Work``'s shape): returned
    by ``isend``, ``irecv`` and the collectives with ``async_op=True``.

    It keeps its arrays alive until it completes; they must not be touched (written,
    or read for a receive) until then. Operations of a communicator run in the order
    they were called, blocking ones after the non-blocking ones before them. A work
    object dropped without ``wait`` is waited for when it is collected.
    """

    def __init__(self, request, comm, keep):
        self._req = request
        self._comm = comm
        self._keep = keep
        # Runs once, after the operation succeeded (copies staged results out).
        self._after = None

    def wait(self, timeout=None) -> bool:
        """Blocks until the operation has completed (each operation is bounded by the
        communicator's timeout); raises :class:`HaloError` if it failed. Returns
        ``True``. A second ``wait`` returns at once."""
        req, self._req = self._req, None
        if req is None:
            return True
        try:
            check(library().haloWait(req), self._comm)
            after, self._after = self._after, None
            if after is not None:
                after()
        finally:
            self._keep = None
            self._after = None
        return True

    def is_completed(self) -> bool:
        """Whether the operation has completed, without blocking (``haloTest``);
        raises :class:`HaloError` if it completed with a failure."""
        if self._req is None:
            return True
        done = ctypes.c_int(0)
        code = library().haloTest(self._req, ctypes.byref(done))
        if done.value or code != 0:
            self._req = None
            after, self._after = self._after, None
            try:
                if code == 0 and after is not None:
                    after()
            finally:
                self._keep = None
        check(code, self._comm)
        return bool(done.value)

    def __del__(self):
        try:
            if getattr(self, "_req", None) is not None:
                library().haloWait(self._req)
        except Exception:
            pass


def init() -> Communicator:
    """This rank's communicator from the launcher's environment
    (``haloCommInitFromEnv``): ``RANK``/``WORLD_SIZE`` (``halo launch``, torchrun),
    Open MPI's, PMI's or Slurm's variables, and the rendezvous in
    ``HALO_BOOTSTRAP_ADDR`` (else ``MASTER_ADDR``/``MASTER_PORT + 1``). Every rank
    calls it; it returns once all have joined. The job's secret is ``HALO_SECRET``
    (``halo launch`` sets one), else the per-user key file (``HALO_SECRET_FILE``, else
    ``~/.config/halo/secret``, mode 0600, made by ``halo secret init``); without either a
    job of more than one rank refuses to start (``HALO_SECRET=insecure-derived`` opts
    out, with a warning). ``HaloError`` with ``INVALID_ARGUMENT`` when a variable is
    missing or malformed, or no secret is available."""
    handle = ctypes.c_void_p()
    check(library().haloCommInitFromEnv(ctypes.byref(handle)), None)
    return Communicator(handle)


def get_unique_id() -> bytes:
    """A new job's id (``haloGetUniqueId``, 128 bytes): make it on one rank and pass it
    to every rank for :func:`init_rank`. It holds a secret: keep it private."""
    uid = _lib.UniqueId()
    check(library().haloGetUniqueId(ctypes.byref(uid)), None)
    return bytes(ctypes.string_at(ctypes.addressof(uid), _lib.UNIQUE_ID_BYTES))


def init_rank(nranks: int, unique_id: bytes, rank: int, timeout_ms: int | None = None) -> Communicator:
    """Rank ``rank`` of ``nranks`` joins the job of ``unique_id``
    (``haloCommInitRank``); every rank calls it. ``timeout_ms``: how long one
    collective, and joining, may take (``haloCommInitRankConfig``'s ``timeoutMs`` and
    ``bootstrapTimeoutMs``; default: ``HALO_TIMEOUT_MS`` or 60 s, and 120 s to join)."""
    unique_id = bytes(unique_id)
    if len(unique_id) != _lib.UNIQUE_ID_BYTES:
        raise ValueError(f"a unique id has {_lib.UNIQUE_ID_BYTES} bytes, not {len(unique_id)}")
    uid = _lib.UniqueId()
    ctypes.memmove(ctypes.addressof(uid), unique_id, _lib.UNIQUE_ID_BYTES)
    handle = ctypes.c_void_p()
    if timeout_ms is None:
        check(library().haloCommInitRank(ctypes.byref(handle), int(nranks), uid, int(rank)), None)
    else:
        ms = operator.index(timeout_ms)
        if not 0 < ms < 2**31:
            raise ValueError(f"timeout_ms is {ms}; it must be in 1..{2**31 - 1}")
        config = _lib.Config.initial()
        config.timeoutMs = ms
        config.bootstrapTimeoutMs = ms
        check(
            library().haloCommInitRankConfig(
                ctypes.byref(handle), int(nranks), uid, int(rank), ctypes.byref(config)
            ),
            None,
        )
    return Communicator(handle)


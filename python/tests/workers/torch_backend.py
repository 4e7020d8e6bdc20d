"""One rank of test_torch.py's backend job (under torchrun): every operation of the
``"halo"`` torch.distributed backend, byte-exact against references every rank can
compute (integer-valued data, so any reduction order gives the same bits), bad input
raising torch exceptions that name the argument, groups, async work, and unmodified
DistributedDataParallel over "halo" against the same model over gloo.

argv[1]: what to run: "ops" (collectives and errors) or "ddp".
"""

import sys

import torch
import torch.distributed as dist

import halo
import halo.torch

INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.int8, torch.uint8]


def fail(what):
    raise AssertionError(f"rank {dist.get_rank()}: {what}")


def same_bytes(what, got, expected):
    if got.shape != expected.shape or got.dtype != expected.dtype:
        fail(f"{what}: got {got.dtype}{tuple(got.shape)}, expected {expected.dtype}{tuple(expected.shape)}")
    size = got.element_size()
    g = got.contiguous().view(INT_OF_SIZE.get(size, torch.uint8))
    e = expected.contiguous().view(INT_OF_SIZE.get(size, torch.uint8))
    if not torch.equal(g, e):
        bad = (g != e).nonzero()
        fail(f"{what}: {len(bad)} elements differ, first at {bad[0].tolist()}: got {got.flatten()[:8]}, expected {expected.flatten()[:8]}")


def raises(what, types, fn, *needles):
    try:
        fn()
    except types as e:
        msg = str(e)
        for n in needles:
            if n not in msg:
                fail(f"{what}: the message does not name {n!r}: {msg}")
        return e
    fail(f"{what}: no {types} raised")


def vals(rank, numel, dtype, salt=0):
    """Small integers (exact in every dtype, bf16 and f16 included)."""
    x = (torch.arange(numel, dtype=torch.int64) * 7 + rank * 3 + salt) % 11
    if dtype.is_floating_point:
        x = x - 5
    return x.to(dtype)


def check_ops():
    me, n = dist.get_rank(), dist.get_world_size()
    assert halo.torch.is_halo_group(), dist.group.WORLD
    assert dist.get_backend() == "halo", dist.get_backend()
    comm = halo.torch.communicator()
    assert (comm.rank, comm.size) == (me, n)

    # all_to_all_single: even, uneven with zeros, every dtype.
    split = lambda q, d: (q * 3 + d * 5) % 4  # noqa: E731 (zeros included)
    send = [split(me, d) for d in range(n)]
    recv = [split(q, me) for q in range(n)]
    for dtype in DTYPES + [torch.bool]:
        rows = lambda q: vals(q, sum(split(q, d) for d in range(n)) * 3, dtype if dtype != torch.bool else torch.uint8).reshape(-1, 3)  # noqa: E731
        inp = rows(me)
        if dtype == torch.bool:
            inp = (inp % 2).bool()
        out = torch.empty((sum(recv), 3), dtype=dtype)
        dist.all_to_all_single(out, inp, recv, send)
        parts = []
        for q in range(n):
            r = rows(q)
            if dtype == torch.bool:
                r = (r % 2).bool()
            at = sum(split(q, d) for d in range(me))
            parts.append(r[at : at + split(q, me)])
        same_bytes(f"all_to_all_single {dtype}", out, torch.cat(parts))
    inp = torch.arange(n * 2, dtype=torch.float32) + 100 * me
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    same_bytes("all_to_all_single even", out, torch.cat([torch.arange(2 * me, 2 * me + 2) + 100.0 * q for q in range(n)]))
    empty = torch.empty(0)
    dist.all_to_all_single(empty, torch.empty(0), [0] * n, [0] * n)

    # all_to_all of lists, uneven sizes.
    ins = [torch.full((q + 1 + me,), float(me)) for q in range(n)]
    outs = [torch.empty(me + 1 + q) for q in range(n)]
    dist.all_to_all(outs, ins)
    for q, o in enumerate(outs):
        same_bytes(f"all_to_all from {q}", o, torch.full((me + 1 + q,), float(q)))

    # all_reduce: every op and dtype; bool OR / AND.
    for dtype in DTYPES:
        for op, ref in [
            (dist.ReduceOp.SUM, lambda xs: sum(xs[1:], xs[0].clone())),
            (dist.ReduceOp.MAX, lambda xs: torch.stack(xs).max(0).values),
            (dist.ReduceOp.MIN, lambda xs: torch.stack(xs).min(0).values),
        ]:
            t = vals(me, 13, dtype)
            dist.all_reduce(t, op=op)
            same_bytes(f"all_reduce {op} {dtype}", t, ref([vals(q, 13, dtype) for q in range(n)]))
        t = (vals(me, 5, torch.int64) % 3).to(dtype)
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
        want = torch.ones(5, dtype=torch.int64)
        for q in range(n):
            want = want * (vals(q, 5, torch.int64) % 3)
        same_bytes(f"all_reduce PRODUCT {dtype}", t, want.to(dtype))
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        t = torch.full((6,), float(4 * (me + 1)), dtype=dtype)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        same_bytes(f"all_reduce AVG {dtype}", t, torch.full((6,), 2.0 * (n + 1), dtype=dtype))
    b = torch.tensor([me == 0, True, False, me % 2 == 0])
    dist.all_reduce(b, op=dist.ReduceOp.BOR)
    same_bytes("all_reduce BOR bool", b, torch.tensor([True, True, False, True]))
    b = torch.tensor([me == 0, True, False, me % 2 == 0])
    dist.all_reduce(b, op=dist.ReduceOp.BAND)
    same_bytes("all_reduce BAND bool", b, torch.tensor([n == 1, True, False, n == 1]))
    z = torch.tensor([complex(me, 1)], dtype=torch.complex64)
    dist.all_reduce(z)
    same_bytes("all_reduce complex", z, torch.tensor([complex(n * (n - 1) / 2, n)], dtype=torch.complex64))

    # reduce to a root.
    for root in range(n):
        t = vals(me, 4, torch.float32)
        dist.reduce(t, dst=root)
        if me == root:
            same_bytes(f"reduce to {root}", t, sum(vals(q, 4, torch.float32) for q in range(n)))

    # all_gather (list) and all_gather_into_tensor.
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
        t = vals(me, 7, dtype)
        lst = [torch.empty(7, dtype=dtype) for _ in range(n)]
        dist.all_gather(lst, t)
        for q in range(n):
            same_bytes(f"all_gather {dtype} [{q}]", lst[q], vals(q, 7, dtype))
        out = torch.empty(n * 7, dtype=dtype)
        dist.all_gather_into_tensor(out, t)
        same_bytes(f"all_gather_into_tensor {dtype}", out, torch.cat([vals(q, 7, dtype) for q in range(n)]))

    # reduce_scatter (list) and reduce_scatter_tensor.
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        blocks = lambda q: [vals(q, 5, dtype, salt=10 * b) for b in range(n)]  # noqa: E731
        out = torch.empty(5, dtype=dtype)
        dist.reduce_scatter(out, blocks(me))
        same_bytes(f"reduce_scatter {dtype}", out, sum(blocks(q)[me] for q in range(n)))
        out = torch.empty(5, dtype=dtype)
        dist.reduce_scatter_tensor(out, torch.cat(blocks(me)))
        same_bytes(f"reduce_scatter_tensor {dtype}", out, sum(blocks(q)[me] for q in range(n)))
        out = torch.empty(5, dtype=dtype)
        dist.reduce_scatter_tensor(out, torch.cat(blocks(me)), op=dist.ReduceOp.MAX)
        same_bytes(f"reduce_scatter_tensor MAX {dtype}", out, torch.stack([blocks(q)[me] for q in range(n)]).max(0).values)

    # broadcast from every root, small and large.
    for root in range(n):
        for numel in (1, 1000, 300_000):
            t = vals(me, numel, torch.float32)
            dist.broadcast(t, src=root)
            same_bytes(f"broadcast {numel} from {root}", t, vals(root, numel, torch.float32))

    # gather, scatter.
    root = n - 1
    t = vals(me, 3, torch.int64)
    lst = [torch.empty(3, dtype=torch.int64) for _ in range(n)] if me == root else None
    dist.gather(t, lst, dst=root)
    if me == root:
        for q in range(n):
            same_bytes(f"gather [{q}]", lst[q], vals(q, 3, torch.int64))
    out = torch.empty(4)
    dist.scatter(out, [vals(q, 4, torch.float32, salt=1) for q in range(n)] if me == 0 else None, src=0)
    same_bytes("scatter", out, vals(me, 4, torch.float32, salt=1))

    # send / recv with tags, around a ring; tags are independent queues.
    if n > 1:
        right, left = (me + 1) % n, (me - 1) % n
        a, b = torch.full((3,), float(me)), torch.full((2,), float(-me))
        works = [dist.isend(a, right, tag=7), dist.isend(b, right, tag=3)]
        got_b, got_a = torch.empty(2), torch.empty(3)
        dist.recv(got_b, left, tag=3)
        dist.recv(got_a, left, tag=7)
        for w in works:
            w.wait()
        same_bytes("recv tag 7", got_a, torch.full((3,), float(left)))
        same_bytes("recv tag 3", got_b, torch.full((2,), float(-left)))

    # Coalesced: several tensors in one call, blocking and async (a future).
    a, b = torch.full((5,), float(me)), torch.full((3,), float(2 * me))
    dist.all_reduce_coalesced([a, b])
    same_bytes("all_reduce_coalesced [0]", a, torch.full((5,), float(sum(range(n)))))
    same_bytes("all_reduce_coalesced [1]", b, torch.full((3,), float(2 * sum(range(n)))))
    a, b = torch.ones(4), torch.ones(2)
    fut = dist.all_reduce_coalesced([a, b], op=dist.ReduceOp.MAX, async_op=True)
    fut.wait()
    same_bytes("all_reduce_coalesced async", torch.cat([a, b]), torch.ones(6))

    dist.barrier()

    # Async work objects: wait, is_completed, get_future, then().
    t = torch.ones(1000)
    w = dist.all_reduce(t, async_op=True)
    assert w.wait() is True and w.is_completed() and w.is_success() and w.exception() is None
    same_bytes("async all_reduce", t, torch.full((1000,), float(n)))
    t = torch.ones(8)
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    same_bytes("get_future().then", doubled, torch.full((8,), 2.0 * n))
    works = [dist.all_reduce(torch.full((4,), float(i)), async_op=True) for i in range(10)]
    for w in works:
        w.wait()

    # Autograd through torch's functional collectives: loss = sum(y^2) / 2, so
    # grad y = y, and the backward (the reverse all-to-all) gives grad x = x.
    import torch.distributed._functional_collectives as fc

    x = vals(me, sum(send) * 4, torch.float32).reshape(-1, 4).requires_grad_()
    y = fc.all_to_all_single_autograd(x, recv, send, dist.group.WORLD)
    y = fc.wait_tensor(y) if hasattr(fc, "wait_tensor") else y
    parts = []
    for q in range(n):
        at = sum(split(q, d) for d in range(me))
        parts.append(vals(q, sum(split(q, d) for d in range(n)) * 4, torch.float32).reshape(-1, 4)[at : at + split(q, me)])
    same_bytes("functional all_to_all_single_autograd", y.detach(), torch.cat(parts))
    (y * y).sum().div(2).backward()
    same_bytes("functional all_to_all_single_autograd backward", x.grad, x.detach())
    r = fc.all_reduce(torch.full((3,), float(me)), "sum", dist.group.WORLD)
    same_bytes("functional all_reduce", fc.wait_tensor(r), torch.full((3,), float(sum(range(n)))))

    # Groups: pairs, nested (a sub-group of the pair), a group of all but rank 0;
    # destroy_process_group of one group frees it.
    pairs = [dist.new_group(list(range(s, min(s + 2, n))), backend="halo") for s in range(0, n, 2)]
    mine = pairs[me // 2]
    assert halo.torch.is_halo_group(mine)
    t = torch.full((2,), float(me))
    dist.all_reduce(t, group=mine)
    members = list(range(me - me % 2, min(me - me % 2 + 2, n)))
    same_bytes("pair all_reduce", t, torch.full((2,), float(sum(members))))
    rest = dist.new_group(list(range(1, n)), backend="halo")
    rest_comm = None
    if me >= 1:
        t = torch.full((2,), float(me))
        dist.all_reduce(t, group=rest)
        same_bytes("rest all_reduce", t, torch.full((2,), float(sum(range(1, n)))))
        rest_comm = halo.torch.communicator(rest)
        assert rest_comm.size == n - 1 and rest_comm.rank == me - 1
    # Every rank calls new_group, members or not (torch's rule).
    inner = dist.new_group([1], backend="halo")
    if me == 1:
        t = torch.ones(1)
        dist.all_reduce(t, group=inner)
        same_bytes("single-rank group", t, torch.ones(1))
    dist.destroy_process_group(rest)
    if rest_comm is not None:
        # destroy_process_group freed the group's HALO communicator.
        assert "destroyed" in repr(rest_comm), repr(rest_comm)

    check_errors(me, n)
    print(f"rank {me}: torch backend ops ok", flush=True)


def check_errors(me, n):
    # Bad input on this rank: a torch exception naming the argument, before anything
    # is sent (the other ranks are not told: every rank makes the same mistake here).
    nc = torch.arange(16.0).reshape(4, 4).t()
    raises("non-contiguous all_reduce", ValueError, lambda: dist.all_reduce(nc), "contiguous")
    raises(
        "all_to_all_single dtypes",
        (TypeError, ValueError, RuntimeError),
        lambda: dist.all_to_all_single(torch.empty(n, dtype=torch.int32), torch.ones(n)),
        "float32",
    )
    raises(
        "splits that do not sum",
        (ValueError, RuntimeError),
        lambda: dist.all_to_all_single(torch.empty(n), torch.ones(n), [1] * n, [2] * n),
        "split",
    )
    raises("BXOR", ValueError, lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BXOR), "BXOR")
    raises(
        "a meta tensor",
        (ValueError, RuntimeError),
        lambda: dist.all_reduce(torch.empty(2, device="meta")),
        "meta",
    )
    raises(
        "all_gather_into_tensor size",
        (ValueError, RuntimeError),
        lambda: dist.all_gather_into_tensor(torch.empty(n * 2 + 1), torch.ones(2)),
        "output",
    )
    raises("recv from any source", (ValueError, RuntimeError), lambda: dist.recv(torch.empty(1)), "source")
    # Ranks that disagree: splits (rank 0 sends one row more to rank 1 than rank 1
    # expects): DistBackendError on every rank, and the group still works after.
    if n > 1:
        send = [1] * n
        recv = [1] * n
        if me == 0:
            send[1] = 2
        inp = torch.ones(sum(send))
        out = torch.empty(sum(recv))
        raises(
            "disagreeing splits",
            dist.DistBackendError,
            lambda: dist.all_to_all_single(out, inp, recv, send),
            "halo all_to_all_single",
        )
        t = torch.ones(3)
        dist.all_reduce(t)
        same_bytes("all_reduce after a failed call", t, torch.full((3,), float(n)))
        # Data types that differ between ranks (same element count, same bytes): every
        # rank raises; rank 0, which exchanges with the others, names both types. On a
        # group of its own, as the failed call leaves that communicator unusable.
        g2 = dist.new_group(list(range(n)), backend="halo")
        e = raises(
            "disagreeing all_reduce dtypes",
            dist.DistBackendError,
            lambda: dist.all_reduce(torch.ones(8, dtype=torch.float32 if me == 0 else torch.int32), group=g2),
            "halo allreduce",
        )
        if me == 0 and not ("float32" in str(e) and "int32" in str(e)):
            fail(f"the dtype mismatch does not name both types: {e}")
        # Counts that differ between ranks in an all-reduce: every rank raises. HALO
        # cannot tell such a call from a corrupted stream, so the communicator is
        # then unusable (as NCCL's after an error) and says so: this comes last.
        raises(
            "disagreeing all_reduce counts",
            dist.DistBackendError,
            lambda: dist.all_reduce(torch.ones(4 if me == 0 else 5)),
            "halo allreduce",
        )
        raises("a call after that", dist.DistBackendError, lambda: dist.barrier(), "no longer be used")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def check_ddp():
    """Unmodified DDP over "halo" (the world group) and over gloo (a gloo group of the
    same ranks), the same model, data and optimizer, 20 steps: the parameters agree
    within 1e-6 relative (not bitwise: gloo's ring all-reduce and HALO's recursive
    doubling / Rabenseifner add the four gradients in different orders)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    me, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    base = Net()
    models = {}
    for name, group in (("halo", None), ("gloo", gloo)):
        m = Net()
        m.load_state_dict(base.state_dict())
        # Small buckets, so several all-reduces are in flight per step.
        models[name] = DDP(m, process_group=group, bucket_cap_mb=0.001)
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05) for k, m in models.items()}
    g = torch.Generator().manual_seed(1 + me)
    for step in range(20):
        x = torch.randn(8, 16, generator=g)
        y = torch.randn(8, 4, generator=g)
        for k in ("halo", "gloo"):
            opts[k].zero_grad()
            loss = torch.nn.functional.mse_loss(models[k](x), y)
            loss.backward()
            opts[k].step()
    worst = 0.0
    for (name, p), q in zip(models["halo"].module.named_parameters(), models["gloo"].module.parameters()):
        rel = ((p - q).abs().max() / q.abs().max().clamp_min(1e-12)).item()
        worst = max(worst, rel)
        if rel > 1e-6:
            fail(f"DDP parameter {name}: halo and gloo differ by {rel:.3g} relative")
    # Every rank holds the same parameters (DDP's contract).
    flat = torch.cat([p.detach().flatten() for p in models["halo"].module.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(everyone, flat, group=gloo)
    for q in range(n):
        same_bytes(f"DDP parameters of rank {q}", everyone[q], flat)
    print(f"rank {me}: ddp ok (worst relative difference {worst:.3g})", flush=True)


def main():
    dist.init_process_group("halo")
    what = sys.argv[1] if len(sys.argv) > 1 else "ops"
    if what == "ops":
        check_ops()
    elif what == "ddp":
        check_ddp()
    else:
        raise SystemExit(f"unknown check {what}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One rank of test_torch.py's job (needs torch): halo.torch against
torch.distributed (gloo) on the same ranks, byte-exact, with the dtypes MoE training
uses, Megatron's _AllToAll autograd function, and torch process groups."""

import torch
import torch.distributed as dist

import halo
import halo.torch

INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(shape, dtype, seed):
    """Random bit patterns of dtype (bool: 0/1)."""
    size = torch.empty((), dtype=dtype).element_size()
    int_t = INT_OF_SIZE[size]
    info = torch.iinfo(int_t)
    g = torch.Generator().manual_seed(seed)
    ints = torch.randint(info.min, info.max, shape, dtype=int_t, generator=g)
    if dtype is torch.bool:
        return (ints & 1).bool()
    return ints.view(dtype)


def same_bytes(what, got, expected):
    size = got.element_size()
    g, e = got.contiguous().view(INT_OF_SIZE[size]), expected.contiguous().view(INT_OF_SIZE[size])
    if got.shape != expected.shape or not torch.equal(g, e):
        raise AssertionError(f"rank {dist.get_rank()}: {what}: wrong bytes")


class _AllToAll(torch.autograd.Function):
    """Megatron-LM's _AllToAll (megatron/core/tensor_parallel/mappings.py) after the
    two-line switch of halo/torch.py's documentation."""

    @staticmethod
    def forward(ctx, group, input, output_split_sizes, input_split_sizes):
        ctx.group = group
        ctx.output_split_sizes = output_split_sizes
        ctx.input_split_sizes = input_split_sizes
        input = input.contiguous()
        if output_split_sizes is None:
            output = torch.empty_like(input)
        else:
            output = input.new_empty(size=[sum(output_split_sizes)] + list(input.size()[1:]), dtype=input.dtype)
        halo.torch.all_to_all_single(
            output,
            input,
            output_split_sizes=output_split_sizes,
            input_split_sizes=input_split_sizes,
            group=group,
        )
        return output

    @staticmethod
    def backward(ctx, *grad_output):
        return (
            None,
            _AllToAll.apply(ctx.group, *grad_output, ctx.input_split_sizes, ctx.output_split_sizes),
            None,
            None,
        )


def main():
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from halo launch
    comm = halo.torch.init()
    me, n = dist.get_rank(), dist.get_world_size()
    assert (comm.rank, comm.size) == (me, n)

    split = lambda q, d: (q * 3 + d * 5) % 4  # noqa: E731  (zeros included)
    send = [split(me, d) for d in range(n)]
    recv = [split(q, me) for q in range(n)]
    for i, dtype in enumerate([torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.bool, torch.uint8]):
        inp = bits((sum(send), 3), dtype, 100 * me + i)
        out = torch.empty((sum(recv), 3), dtype=dtype)
        assert halo.torch.all_to_all_single(out, inp, recv, send) is None
        want = torch.cat(
            [
                bits((sum(split(q, d) for d in range(n)), 3), dtype, 100 * q + i)[
                    sum(split(q, d) for d in range(me)) : sum(split(q, d) for d in range(me + 1))
                ]
                for q in range(n)
            ]
        )
        same_bytes(f"all_to_all_single {dtype}", out, want)
        if dtype in (torch.float32, torch.int64):
            ref = torch.empty_like(out)
            dist.all_to_all_single(ref, inp, recv, send)  # gloo: torch's own semantics
            same_bytes(f"halo.torch vs torch.distributed {dtype}", out, ref)

    # Even split, no sizes, async_op.
    inp = torch.arange(n * 2, dtype=torch.float32) + 100 * me
    out = torch.empty_like(inp)
    work = halo.torch.all_to_all_single(out, inp, async_op=True)
    assert work.wait() and work.is_completed()
    assert work.get_future().wait() == [out]
    ref = torch.empty_like(inp)
    dist.all_to_all_single(ref, inp)
    same_bytes("even split", out, ref)

    # Megatron's autograd function: loss = sum(y^2) / 2, so grad y = y and grad x = x.
    x = bits((sum(send), 4), torch.int16, 7 * me).float().requires_grad_()
    y = _AllToAll.apply(dist.group.WORLD, x, recv, send)
    (y * y).sum().div(2).backward()
    same_bytes("_AllToAll backward", x.grad, x.detach())

    # Torch process groups: pairs (0, 1), (2, 3), ...: a HALO communicator per group.
    groups = [dist.new_group(list(range(s, min(s + 2, n)))) for s in range(0, n, 2)]
    mine = groups[me // 2]
    size = dist.get_world_size(mine)
    inp = torch.full((size, 2), float(me))
    out = torch.empty_like(inp)
    halo.torch.all_to_all_single(out, inp, group=mine)
    ref = torch.empty_like(inp)
    dist.all_to_all_single(ref, inp, group=mine)
    same_bytes("group all_to_all_single", out, ref)
    assert halo.torch.communicator(mine).size == size
    assert halo.torch.communicator(mine) is halo.torch.communicator(mine)

    t = torch.full((3,), float(me + 1), dtype=torch.bfloat16)
    halo.torch.all_reduce(t, op=dist.ReduceOp.MAX)
    same_bytes("all_reduce max", t, torch.full((3,), float(n), dtype=torch.bfloat16))
    halo.torch.barrier()
    dist.destroy_process_group()
    print("torch ok", flush=True)


if __name__ == "__main__":
    main()

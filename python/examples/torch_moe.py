"""A Megatron-style MoE layer in plain PyTorch whose expert-parallel all-to-alls run on
HALO, the rest of the job on gloo: the one-line switch is the ``backend="halo"`` of the
expert-parallel group.

    torchrun --nproc-per-node 4 python/examples/torch_moe.py      # or: halo launch -n 4 -- python3 ...
    torchrun --nproc-per-node 4 python/examples/torch_moe.py --dispatcher [--topk 4]

The layer does what Megatron-LM's ``MoEAlltoAllTokenDispatcher`` does: route each token
to its top-k experts, permute the tokens by expert, exchange the per-expert counts,
``torch.distributed.all_to_all_single`` with output and input split sizes on the EP
group (inside an autograd function, so the backward is the reverse all-to-all), sort
by local expert, run the local experts, and undo it all. It then checks itself: the
outputs and every gradient (tokens, router, experts) against the same layer computed
in one process, and prints ``ok``.

``--dispatcher`` switches the layer to :class:`halo.torch.MoeDispatcher` (DeepEP's
dispatch / combine over the same ``"halo"`` group): no permutation, no count exchange,
the gates applied at the experts, and tokens de-duplicated per destination node in the
forward and the backward. The same self-check holds.
"""

import argparse
import os

import torch
import torch.distributed as dist

import halo.torch  # noqa: F401  registers the "halo" backend

HIDDEN, FFN, EXPERTS, TOPK, TOKENS = 16, 32, 8, 2, 24
DTYPE = torch.float64  # the self-check compares with a tolerance of 1e-12


class AllToAll(torch.autograd.Function):
    """Megatron's ``_AllToAll`` (megatron/core/tensor_parallel/mappings.py)."""

    @staticmethod
    def forward(ctx, group, input, output_split_sizes, input_split_sizes):
        ctx.group = group
        ctx.output_split_sizes = output_split_sizes
        ctx.input_split_sizes = input_split_sizes
        input = input.contiguous()
        output = input.new_empty((sum(output_split_sizes),) + tuple(input.shape[1:]))
        dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=group)
        return output

    @staticmethod
    def backward(ctx, grad):
        return None, AllToAll.apply(ctx.group, grad, ctx.input_split_sizes, ctx.output_split_sizes), None, None


def make_weights():
    g = torch.Generator().manual_seed(1234)
    router = torch.randn(HIDDEN, EXPERTS, generator=g, dtype=DTYPE)
    w1 = torch.randn(EXPERTS, HIDDEN, FFN, generator=g, dtype=DTYPE) / HIDDEN**0.5
    w2 = torch.randn(EXPERTS, FFN, HIDDEN, generator=g, dtype=DTYPE) / FFN**0.5
    return router, w1, w2


def tokens_of(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(TOKENS, HIDDEN, generator=g, dtype=DTYPE)


def route(x, router, topk=TOPK):
    probs = torch.softmax(x @ router, dim=-1)
    weights, experts = probs.topk(topk, dim=-1)
    return weights, experts


def expert(x, w1, w2):
    return torch.nn.functional.gelu(x @ w1) @ w2


def moe_layer(x, weights, experts, w1_local, w2_local, ep_group):
    """The distributed layer (Megatron's all-to-all dispatcher): this rank's tokens
    ``x``, their routing (``weights``, ``experts``: tokens x k), its local experts'
    weights."""
    ep = dist.get_world_size(ep_group)
    local = EXPERTS // ep
    topk = experts.shape[1]
    # Permute: one row per (token, choice), sorted by expert.
    flat = experts.flatten()
    order = flat.argsort(stable=True)
    permuted = x.repeat_interleave(topk, dim=0)[order]
    per_expert = torch.bincount(flat, minlength=EXPERTS)
    # Exchange the counts (Megatron: all_to_all_single of tokens_per_expert).
    counts_in = per_expert.reshape(ep, local)
    counts_out = torch.empty_like(counts_in)
    dist.all_to_all_single(counts_out, counts_in, group=ep_group)
    input_splits = counts_in.sum(1).tolist()
    output_splits = counts_out.sum(1).tolist()
    received = AllToAll.apply(ep_group, permuted, output_splits, input_splits)
    # Sort by local expert: the rows come source-major, expert-minor.
    chunks = received.split(counts_out.flatten().tolist())
    by_expert = [torch.cat([chunks[s * local + e] for s in range(ep)]) for e in range(local)]
    outs = [expert(rows, w1_local[e], w2_local[e]) for e, rows in enumerate(by_expert)]
    # Back to source-major order, then the reverse all-to-all.
    pieces = [o.split(counts_out[:, e].tolist()) for e, o in enumerate(outs)]
    back = torch.cat([pieces[e][s] for s in range(ep) for e in range(local)])
    returned = AllToAll.apply(ep_group, back, input_splits, output_splits)
    # Unpermute and combine with the routing weights.
    unpermuted = torch.empty_like(returned).index_copy(0, order, returned)
    return (unpermuted.reshape(-1, topk, x.shape[1]) * weights.unsqueeze(-1)).sum(1)


def moe_layer_dispatcher(x, weights, experts, w1_local, w2_local, dispatcher):
    """The same layer on :class:`halo.torch.MoeDispatcher`: the rows arrive grouped by
    local expert, each with its gate; the experts' rows, weighted, are summed back."""
    recv_x, _, recv_weights, tokens_per_expert, handle = dispatcher.dispatch(x, experts, weights)
    outs = [expert(rows, w1_local[e], w2_local[e]) for e, rows in enumerate(recv_x.split(tokens_per_expert))]
    y = torch.cat(outs) if outs else recv_x
    return dispatcher.combine(y * recv_weights.unsqueeze(-1), handle)


def reference(world, topk=TOPK):
    """The whole layer in one process, on every rank's tokens."""
    router, w1, w2 = (t.clone().requires_grad_() for t in make_weights())
    xs = [tokens_of(r).requires_grad_() for r in range(world)]
    ys = []
    for x in xs:
        weights, experts = route(x, router, topk)
        y = torch.zeros_like(x)
        for k in range(topk):
            for e in range(EXPERTS):
                rows = experts[:, k] == e
                if rows.any():
                    y = y.index_add(0, rows.nonzero().flatten(), expert(x[rows], w1[e], w2[e]) * weights[rows, k : k + 1])
        ys.append(y)
    loss = sum((y * y).sum() for y in ys) / 2
    loss.backward()
    return ys, [x.grad for x in xs], router.grad, w1.grad, w2.grad


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dispatcher", action="store_true", help="use halo.torch.MoeDispatcher")
    p.add_argument("--topk", type=int, default=TOPK, help=f"experts per token (default {TOPK})")
    args = p.parse_args()
    dist.init_process_group("gloo")  # the world: gloo (RANK, WORLD_SIZE, MASTER_* from the launcher)
    me, world = dist.get_rank(), dist.get_world_size()
    assert EXPERTS % world == 0, f"{EXPERTS} experts do not split over {world} ranks"
    ep_group = dist.new_group(list(range(world)), backend="halo")  # the switch
    local = EXPERTS // world

    router, w1, w2 = make_weights()
    router = router.requires_grad_()
    w1_local = w1[me * local : (me + 1) * local].clone().requires_grad_()
    w2_local = w2[me * local : (me + 1) * local].clone().requires_grad_()
    x = tokens_of(me).requires_grad_()
    weights, experts = route(x, router, args.topk)
    if args.dispatcher:
        dispatcher = halo.torch.MoeDispatcher(ep_group, EXPERTS, HIDDEN)
        y = moe_layer_dispatcher(x, weights, experts, w1_local, w2_local, dispatcher)
    else:
        y = moe_layer(x, weights, experts, w1_local, w2_local, ep_group)
    ((y * y).sum() / 2).backward()
    # The router is replicated: its gradient is summed over the ranks (on gloo).
    dist.all_reduce(router.grad)

    ys, xgrads, rgrad, w1grad, w2grad = reference(world, args.topk)
    checks = [
        ("output", y, ys[me]),
        ("grad of the tokens", x.grad, xgrads[me]),
        ("grad of the router", router.grad, rgrad),
        ("grad of the local experts' w1", w1_local.grad, w1grad[me * local : (me + 1) * local]),
        ("grad of the local experts' w2", w2_local.grad, w2grad[me * local : (me + 1) * local]),
    ]
    for what, got, want in checks:
        err = (got - want).abs().max().item()
        if err > 1e-12 * max(1.0, want.abs().max().item()):
            raise SystemExit(f"rank {me}: {what} differs from the single-process reference by {err:.3g}")
    dist.destroy_process_group()
    how = "MoeDispatcher" if args.dispatcher else "all-to-all"
    print(f"rank {me}: MoE layer over halo ({how}, k={args.topk}, EP {world}) matches the single-process reference: ok", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

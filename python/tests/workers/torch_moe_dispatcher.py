"""One rank of test_torch.py's MoE dispatcher job (under torchrun): the Megatron-style
MoE layer of python/examples/torch_moe.py on ``halo.torch.MoeDispatcher`` against the
same layer on ``dist.all_to_all_single`` over the same "halo" group — outputs and
every gradient (tokens, router, experts) — for k = 1, 2, 8, uneven routings, empty
experts, every token to one expert, a rank without tokens, a shuffled expert table
(migration), in float64 and float32, every mode; ``async_finish`` bit for bit the
blocking calls; then bad input raising on every rank.

Summation orders differ (the dispatcher adds each token's rows per node in slot order,
then the nodes ascending; the all-to-all version sums the k weighted rows with
``torch.sum``), so results agree to rounding: 1e-12 relative in float64, 1e-6 in
float32, not bit for bit.
"""

import importlib.util
import os
import sys

import torch
import torch.distributed as dist

import halo
import halo.torch

spec = importlib.util.spec_from_file_location(
    "torch_moe", os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch_moe.py")
)
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)


def fail(what):
    raise AssertionError(f"rank {dist.get_rank()}: {what}")


def routing(kind, x, router, k, seed):
    """(weights, experts) for this rank's tokens: the router's probabilities gathered
    at the chosen experts, so that the router's gradient flows in every kind."""
    probs = torch.softmax(x @ router, dim=-1)
    t = x.shape[0]
    g = torch.Generator().manual_seed(seed)
    if kind == "topk":
        weights, experts = probs.topk(k, dim=-1)
        return weights, experts
    if kind == "uneven":  # low ids far more popular
        bias = torch.tensor([2.0**-e for e in range(ex.EXPERTS)])
        experts = torch.stack([torch.multinomial(bias, k, generator=g) for _ in range(t)]) if t else torch.empty(0, k, dtype=torch.long)
    elif kind == "empty":  # odd experts never chosen
        even = torch.arange(0, ex.EXPERTS, 2)
        experts = torch.stack([even[torch.randperm(len(even), generator=g)[:k]] for _ in range(t)]) if t else torch.empty(0, k, dtype=torch.long)
    elif kind == "one":  # every token to expert 0
        experts = torch.zeros(t, 1, dtype=torch.long)
    else:
        raise ValueError(kind)
    return probs.gather(1, experts), experts


def layer_grads(layer, x0, router0, w1l, w2l, kind, k, seed):
    x = x0.clone().requires_grad_()
    router = router0.clone().requires_grad_()
    w1 = w1l.clone().requires_grad_()
    w2 = w2l.clone().requires_grad_()
    weights, experts = routing(kind, x, router, k, seed)
    y = layer(x, weights, experts, w1, w2)
    ((y * y).sum() / 2).backward()
    return [("output", y.detach()), ("grad of x", x.grad), ("grad of the router", router.grad),
            ("grad of w1", w1.grad), ("grad of w2", w2.grad)]


def compare(case, a2a, disp, tol):
    for (what, want), (_, got) in zip(a2a, disp):
        if got is None or want is None:
            if got is not want:
                fail(f"{case}: {what}: one version has no gradient")
            continue
        err = (got - want).abs().max().item() if want.numel() else 0.0
        scale = max(1.0, want.abs().max().item() if want.numel() else 0.0)
        if not err <= tol * scale:
            fail(f"{case}: {what} differs from the all-to-all version by {err:.3g} (scale {scale:.3g})")


def cases():
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        for kind, k in (("topk", 1), ("topk", 2), ("topk", 8), ("uneven", 2), ("uneven", 4), ("empty", 2), ("one", 1)):
            for mode in ("auto", "dedup", "direct"):
                yield dtype, tol, kind, k, mode


def main():
    dist.init_process_group("halo")
    me, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    router, w1, w2 = ex.make_weights()
    # A shuffled expert table (as after migration): the all-to-all layer assumes
    # contiguous blocks, so it gets the experts' weights in the table's order.
    perm = torch.randperm(ex.EXPERTS, generator=torch.Generator().manual_seed(7))
    local = ex.EXPERTS // world
    table = [0] * ex.EXPERTS
    for slot, e in enumerate(perm.tolist()):
        table[e] = slot // local
    mine = [e for e in range(ex.EXPERTS) if table[e] == me]
    n_cases = 0
    for dtype, tol, kind, k, mode in cases():
        t = 0 if me == 1 else 5 + 3 * me  # rank 1 has no tokens
        x0 = torch.randn(t, ex.HIDDEN, generator=torch.Generator().manual_seed(40 + me), dtype=dtype)
        r0 = router.to(dtype)
        for shuffled in (False, True):
            if shuffled:
                ids = mine
                dispatcher = halo.torch.MoeDispatcher(group, ex.EXPERTS, ex.HIDDEN, expert_rank=table, mode=mode)
                # The all-to-all layer's blocks are contiguous: renumber the experts so
                # that expert e of the table is block slot perm^-1(e).
                relabel = torch.empty(ex.EXPERTS, dtype=torch.long)
                relabel[perm] = torch.arange(ex.EXPERTS)
                w1l, w2l = w1[ids].to(dtype), w2[ids].to(dtype)
                w1b = w1[perm[me * local:(me + 1) * local]].to(dtype)
                w2b = w2[perm[me * local:(me + 1) * local]].to(dtype)
            else:
                relabel = None
                dispatcher = halo.torch.MoeDispatcher(group, ex.EXPERTS, ex.HIDDEN, mode=mode)
                w1l = w1b = w1[me * local:(me + 1) * local].to(dtype)
                w2l = w2b = w2[me * local:(me + 1) * local].to(dtype)

            def a2a(x, weights, experts, a, b):
                e = experts if relabel is None else relabel[experts]
                return ex.moe_layer(x, weights, e, a, b, group)

            def disp(x, weights, experts, a, b):
                return ex.moe_layer_dispatcher(x, weights, experts, a, b, dispatcher)

            seed = 1000 * n_cases + me
            want = layer_grads(a2a, x0, r0, w1b, w2b, kind, k, seed)
            if shuffled:
                # The dispatcher's local experts are in ascending id order; the
                # all-to-all layer's in block order: compare the experts' grads by id.
                order = [perm[me * local:(me + 1) * local].tolist().index(e) for e in ids]
                want = want[:3] + [(w, g[order]) for w, g in want[3:]]
            got = layer_grads(disp, x0, r0, w1l, w2l, kind, k, seed)
            compare(f"{dtype} {kind} k={k} mode={mode} shuffled={shuffled}", want, got, tol)
            n_cases += 1

    # The layout the dispatcher reports, against the routing every rank can compute.
    dispatcher = halo.torch.MoeDispatcher(group, ex.EXPERTS, ex.HIDDEN, expert_rank=table)
    ids_of = [torch.tensor([[(r + j) % ex.EXPERTS, (r + j + 4) % ex.EXPERTS] for j in range(r + 2)]) for r in range(world)]
    x = torch.arange((me + 2) * ex.HIDDEN, dtype=torch.float64).reshape(me + 2, ex.HIDDEN) + 1000 * me
    recv_x, recv_idx, recv_w, per_expert, handle = dispatcher.dispatch(x, ids_of[me])
    rows = [(e, s, j) for e in mine for s in range(world) for j in range(s + 2) if e in ids_of[s][j].tolist()]
    if per_expert != [sum(1 for r in rows if r[0] == e) for e in mine] or recv_w is not None:
        fail(f"tokens_per_expert {per_expert}")
    if recv_idx.tolist() != [r[0] for r in rows]:
        fail(f"recv_topk_idx {recv_idx.tolist()}")
    want = torch.stack([torch.arange(ex.HIDDEN, dtype=torch.float64) + j * ex.HIDDEN + 1000 * s for _, s, j in rows]) if rows else torch.empty(0, ex.HIDDEN, dtype=torch.float64)
    if not torch.equal(recv_x, want):
        fail("recv_x differs from the rows of the routing")
    if handle.row_src_rank.tolist() != [s for _, s, _ in rows] or handle.row_src_token.tolist() != [j for _, _, j in rows]:
        fail("row sources")
    # combine of the received rows: each token times the number of its experts (2).
    out = dispatcher.combine(recv_x, handle)
    if not torch.equal(out, 2 * x):
        fail("combine of the dispatched rows is not 2 x")

    # async_finish (DeepEP's): two dispatches in flight, then the combine; rows, gates
    # and gradients bit for bit those of the blocking calls.
    w0 = torch.rand(x.shape[0], 2, dtype=torch.float64, generator=torch.Generator().manual_seed(me))
    grads = []
    for async_finish in (True, False):
        xa, wa = x.clone().requires_grad_(), w0.clone().requires_grad_()
        if async_finish:
            first = dispatcher.dispatch(xa, ids_of[me], wa, async_finish=True)
            second = dispatcher.dispatch(2 * x, ids_of[me], async_finish=True)
            if len(first) != 6 or not isinstance(first[5], halo.torch.EventOverlap):
                fail(f"dispatch(async_finish=True) returned {len(first)} elements")
            with second[5]:
                first[5].current_stream_wait()
            if not torch.equal(second[0], 2 * first[0]):
                fail("the second dispatch in flight differs")
            recv, _, rw, _, h = first[:5]
            out, event = dispatcher.combine(recv * rw.unsqueeze(-1), h, async_finish=True)
            event.current_stream_wait()
            if not event.is_completed():
                fail("an event waited for is not completed")
        else:
            recv, _, rw, _, h = dispatcher.dispatch(xa, ids_of[me], wa)
            out = dispatcher.combine(recv * rw.unsqueeze(-1), h)
        (out * out).sum().backward()
        grads.append([recv.detach(), rw.detach(), out.detach(), xa.grad, wa.grad])
    for what, a, b in zip(("recv_x", "recv_topk_weights", "combine", "grad of x", "grad of the gates"), *grads):
        if not torch.equal(a, b):
            fail(f"async_finish: {what} differs from the blocking call's")
    # A combine with the wrong rows on rank 3, async: ValueError there at once, the
    # others' event raising INVALID_USAGE naming rank 3.
    recv_x, _, _, _, handle = dispatcher.dispatch(x, ids_of[me])
    try:
        _, event = dispatcher.combine(recv_x[1:] if me == 3 else recv_x, handle, async_finish=True)
        event.current_stream_wait()
        fail("an async combine with a wrong row count was accepted")
    except ValueError as e:
        if me != 3:
            fail(f"async wrong rows: {e}")
    except halo.HaloError as e:
        if me == 3 or e.code != halo.Result.INVALID_USAGE or "rank 3" not in str(e):
            fail(f"async wrong rows elsewhere: {e.code!r} {e}")

    # Bad input: an expert id out of range on rank 2 -> HaloError INVALID_ARGUMENT
    # there, INVALID_USAGE naming rank 2 elsewhere; a wrong shape on rank 0 ->
    # ValueError there, INVALID_USAGE elsewhere. No rank waits for a timeout.
    bad = ids_of[me].clone()
    if me == 2:
        bad[0, 1] = ex.EXPERTS
    try:
        dispatcher.dispatch(x, bad)
        fail("an expert id out of range was accepted")
    except halo.HaloError as e:
        want_code = halo.Result.INVALID_ARGUMENT if me == 2 else halo.Result.INVALID_USAGE
        if e.code != want_code or (me == 2 and "topkIdx of token 0 slot 1 is 8" not in str(e)):
            fail(f"out-of-range id: {e.code!r} {e}")
    try:
        dispatcher.dispatch(x[:, :3] if me == 0 else x, ids_of[me])
        fail("a wrong shape was accepted")
    except ValueError as e:
        if me != 0 or "not (tokens, hidden" not in str(e):
            fail(f"wrong shape: {e}")
    except halo.HaloError as e:
        if me == 0 or e.code != halo.Result.INVALID_USAGE or "rank 0" not in str(e):
            fail(f"wrong shape elsewhere: {e.code!r} {e}")
    # A combine with rows of the wrong count on rank 3: ValueError there, INVALID_USAGE elsewhere.
    recv_x, _, _, _, handle = dispatcher.dispatch(x, ids_of[me])
    try:
        dispatcher.combine(recv_x[1:] if me == 3 else recv_x, handle)
        fail("a combine with a wrong row count was accepted")
    except ValueError as e:
        if me != 3:
            fail(f"wrong rows: {e}")
    except halo.HaloError as e:
        if me == 3 or e.code != halo.Result.INVALID_USAGE or "rank 3" not in str(e):
            fail(f"wrong rows elsewhere: {e.code!r} {e}")
    try:
        dispatcher.dispatch(x.to(torch.device("meta")), ids_of[me]) if me == 1 else dispatcher.dispatch(x, ids_of[me])
    except ValueError as e:
        if me != 1 or "CPU tensors" not in str(e):
            fail(f"device tensor: {e}")
    except halo.HaloError as e:
        if me == 1 or e.code != halo.Result.INVALID_USAGE:
            fail(f"device tensor elsewhere: {e}")
    # Still in step: one more round trip.
    recv_x, _, _, _, handle = dispatcher.dispatch(x, ids_of[me])
    if not torch.equal(dispatcher.combine(recv_x, handle), 2 * x):
        fail("the dispatcher after the errors")
    dist.destroy_process_group()
    print(f"rank {me}: moe dispatcher ok ({n_cases} cases)", flush=True)


if __name__ == "__main__":
    main()

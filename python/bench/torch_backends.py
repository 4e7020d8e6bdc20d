"""torch.distributed over "halo" against the same calls over gloo, in one run.

    torchrun --nproc-per-node 4 python/bench/torch_backends.py [--rounds 3] [--max-bytes 16M]
        [--ops all_to_all_single,all_reduce,...] [--json out.json] [--plot out.svg]

The world group is gloo; a second group of the same ranks is "halo". For every
operation and size (bytes per peer for the all-to-all, per rank otherwise) the two
backends alternate within each round (the order rotated per round), each timed over
``iters`` calls between barriers of its own group; the figure is the median over the
rounds of each round's mean, on rank 0, and the ratio is gloo's time over halo's
(> 1: halo is faster). Then the step time of unmodified DDP on the DDP test's model and of the
Megatron-style MoE layer of python/examples/torch_moe.py, the same way.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import halo.torch  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 4 if s < 65536 else 2


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def iters_for(nbytes):
    if nbytes <= 16 << 10:
        return 100
    if nbytes <= 256 << 10:
        return 30
    return 8


def make_op(name, nbytes, n, group):
    """A zero-argument callable running ``name`` once on ``group``."""
    elems = max(1, nbytes // 4)
    if name == "all_to_all_single":
        inp = torch.ones(elems * n)
        out = torch.empty(elems * n)
        return lambda: dist.all_to_all_single(out, inp, group=group)
    if name == "all_reduce":
        t = torch.ones(elems)
        return lambda: dist.all_reduce(t, group=group)
    if name == "all_gather_into_tensor":
        inp = torch.ones(elems)
        out = torch.empty(elems * n)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if name == "reduce_scatter_tensor":
        inp = torch.ones(elems * n)
        out = torch.empty(elems)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if name == "broadcast":
        t = torch.ones(elems)
        return lambda: dist.broadcast(t, src=0, group=group)
    raise SystemExit(f"unknown op {name}")


def timed(fn, iters, group):
    for _ in range(max(2, iters // 10)):
        fn()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dist.barrier(group=group)
    return (time.perf_counter() - t0) / iters


def compare(make, iters, rounds, groups):
    """{backend: median of per-round means (s)}, the backends interleaved."""
    names = list(groups)
    fns = {b: make(groups[b]) for b in names}
    per = {b: [] for b in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for b in order:
            per[b].append(timed(fns[b], iters, groups[b]))
    return {b: statistics.median(v) for b, v in per.items()}


def ddp_step(group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    # The model of the DDP test (python/tests/workers/torch_backend.py), default buckets.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 4)

    def step():
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()

    return step


def moe_step(group):
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import torch_moe as m

    me = dist.get_rank(group)
    local = m.EXPERTS // dist.get_world_size(group)
    router, w1, w2 = m.make_weights()
    router = router.requires_grad_()
    w1l = w1[me * local : (me + 1) * local].clone().requires_grad_()
    w2l = w2[me * local : (me + 1) * local].clone().requires_grad_()
    x = m.tokens_of(me).requires_grad_()

    def step():
        y = m.moe_layer(x, router, w1l, w2l, group)
        ((y * y).sum() / 2).backward()

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-bytes", default="64")
    ap.add_argument("--max-bytes", default="16M")
    ap.add_argument("--ops", default="all_to_all_single,all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast")
    ap.add_argument("--steps", type=int, default=20, help="DDP and MoE steps per round (0: none)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    n, me = dist.get_world_size(), dist.get_rank()
    groups = {"gloo": dist.group.WORLD, "halo": dist.new_group(list(range(n)), backend="halo")}
    rows = []
    lo, hi = parse_size(args.min_bytes), parse_size(args.max_bytes)
    for op in args.ops.split(","):
        if me == 0:
            print(f"\n# {op}, {n} processes, float32 (bytes {'per peer' if op == 'all_to_all_single' else 'per rank'})")
            print(f"{'bytes':>10} {'gloo us':>12} {'halo us':>12} {'gloo/halo':>10}", flush=True)
        for s in sizes(lo, hi):
            t = compare(lambda g, op=op, s=s: make_op(op, s, n, g), iters_for(s * (n if op == "all_to_all_single" else 1)), args.rounds, groups)
            rows.append({"op": op, "bytes": s, "gloo_us": t["gloo"] * 1e6, "halo_us": t["halo"] * 1e6})
            if me == 0:
                print(f"{s:>10} {t['gloo'] * 1e6:>12.1f} {t['halo'] * 1e6:>12.1f} {t['gloo'] / t['halo']:>10.2f}", flush=True)
    if args.steps:
        for name, make in (("ddp_step", ddp_step), ("moe_layer_step", moe_step)):
            t = compare(lambda g, make=make: make(g), args.steps, args.rounds, groups)
            rows.append({"op": name, "bytes": 0, "gloo_us": t["gloo"] * 1e6, "halo_us": t["halo"] * 1e6})
            if me == 0:
                print(f"\n# {name}: gloo {t['gloo'] * 1e3:.2f} ms, halo {t['halo'] * 1e3:.2f} ms, gloo/halo {t['gloo'] / t['halo']:.2f}", flush=True)
    if me == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"processes": n, "rounds": args.rounds, "torch": torch.__version__, "rows": rows}, f, indent=1)
        if args.plot:
            plot(rows, args.plot, n)
    dist.destroy_process_group()


def plot(rows, path, n):
    """Time per call of both backends for every operation (matplotlib, if installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"no plot: matplotlib is not installed (pip install matplotlib) for {path}", file=sys.stderr)
        return
    ops = [op for op in dict.fromkeys(r["op"] for r in rows) if not op.endswith("_step")]
    fig, axes = plt.subplots(1, len(ops), figsize=(4 * len(ops), 3.6), squeeze=False)
    for ax, op in zip(axes[0], ops):
        rs = [r for r in rows if r["op"] == op]
        for b, style in (("gloo", "o-"), ("halo", "s-")):
            ax.loglog([r["bytes"] for r in rs], [r[f"{b}_us"] for r in rs], style, label=b, base=2)
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("bytes" + (" per peer" if op == "all_to_all_single" else ""))
        ax.set_ylabel("us per call")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"torch.distributed over halo and gloo, {n} processes, one host (CPU, float32)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()

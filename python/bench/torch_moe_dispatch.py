"""The torch MoE layer on ``halo.torch.MoeDispatcher`` against the same layer on
``dist.all_to_all_single`` over the same "halo" group, in one run (issue 29).

    halo launch -n 8 --hosts 4 -- python3 python/bench/torch_moe_dispatch.py   # root: emulated hosts
    torchrun --nproc-per-node 4 python/bench/torch_moe_dispatch.py [--topk 8] [--tokens 256]

A step is the forward and backward of one MoE layer (python/examples/torch_moe.py's
``moe_layer`` / ``moe_layer_dispatcher``) on this rank's tokens, ``--experts`` experts
(default 16) in contiguous blocks, ``--hidden`` 1024, float32. Routing is node-limited
(DeepSeek's): each token picks ``--nodes-per-token`` nodes (default 2) and its k
experts among theirs, which is where de-duplication pays. The experts are cheap
(one scale per expert and element): the step is the exchange, as it is when the network
is the bottleneck. Variants alternate within each round (order rotated), each timed
over ``--iters`` steps between barriers; the figure is the median over rounds on
rank 0; ratios are the all-to-all layer's time over each variant's (> 1: faster).

On emulated hosts (``halo launch --hosts``) the bytes that left the hosts during each
variant's steps are counted too: the transmit counter of each host's ``eth0``
(``/proc/net/dev`` of its network namespace, read by ``LOCAL_RANK`` 0 after the closing
barrier), summed over the hosts, per step. It is set against the rows the routing
predicts: four row exchanges per step (the forward's dispatch and combine, the backward's
dispatch of the output gradient and combine of the input gradient), each one row of
``hidden`` floats per (token, expert on another host) pair for the all-to-all layer and
``direct``, per (token, other host) pair for ``dedup``. The rest (the pairs' weights,
counts, barriers, TCP/IP framing and acknowledgements) is what the ratio shows above 1.
"""

import argparse
import importlib.util
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

import halo.torch

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("torch_moe", os.path.join(HERE, "..", "examples", "torch_moe.py"))
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)


def node_limited(t, k, experts, ranks, per_node, nodes_per_token, gen):
    """tokens x k distinct experts, all on at most ``nodes_per_token`` nodes."""
    per_rank = experts // ranks
    nodes = ranks // per_node
    per_node_experts = per_node * per_rank
    out = torch.empty(t, k, dtype=torch.long)
    for i in range(t):
        chosen = torch.randperm(nodes, generator=gen)[:nodes_per_token]
        pool = torch.cat([torch.arange(n * per_node_experts, (n + 1) * per_node_experts) for n in chosen.tolist()])
        out[i] = pool[torch.randperm(len(pool), generator=gen)[:k]]
    return out


def host_tx_bytes():
    """Bytes sent by this network namespace's ``eth0`` (``None`` when there is none)."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "eth0":
                    return int(rest.split()[8])
    except OSError:
        pass
    return None


def predicted_rows(experts, expert_rank, ranks_per_node, me):
    """(rows per (token, expert on another node), rows per (token, other node)) of this rank."""
    node = [expert_rank[e] // ranks_per_node for e in range(len(expert_rank))]
    mine = me // ranks_per_node
    pairs = unique = 0
    for row in experts.tolist():
        nodes = [node[e] for e in row if node[e] != mine]
        pairs += len(nodes)
        unique += len(set(nodes))
    return pairs, unique


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--nodes-per-token", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=3)
    a = p.parse_args()
    dist.init_process_group("halo")
    me, n = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    local = a.experts // n
    ex.EXPERTS = a.experts
    gen = torch.Generator().manual_seed(11 + me)
    x0 = torch.randn(a.tokens, a.hidden, generator=gen)
    experts = node_limited(a.tokens, a.topk, a.experts, n, a.ranks_per_node, a.nodes_per_token, gen)
    logits = torch.randn(a.tokens, a.experts, generator=gen)
    scales = (1.0 + 0.01 * torch.arange(local * a.hidden, dtype=torch.float32)).reshape(local, a.hidden)
    ex.expert = lambda rows, s, _unused: rows * s  # one scale per expert and element
    dispatchers = {m: halo.torch.MoeDispatcher(group, a.experts, a.hidden, mode=m) for m in ("auto", "dedup", "direct")}

    def step(variant):
        x = x0.clone().requires_grad_()
        lg = logits.clone().requires_grad_()
        s = scales.clone().requires_grad_()
        weights = torch.softmax(lg, dim=-1).gather(1, experts)
        if variant == "all_to_all_single":
            y = ex.moe_layer(x, weights, experts, s, s, group)
        else:
            y = ex.moe_layer_dispatcher(x, weights, experts, s, s, dispatchers[variant.split(":")[1]])
        y.sum().backward()

    variants = ["all_to_all_single", "dispatcher:auto", "dispatcher:dedup", "dispatcher:direct"]
    for v in variants:  # warm up
        step(v)
    times = {v: [] for v in variants}
    local_rank = int(os.environ.get("LOCAL_RANK", me % a.ranks_per_node))
    # Count only where each host is its own network namespace: several hostnames, as many
    # as the nodes (one host's eth0 would show no traffic between its ranks).
    names = [None] * n
    dist.all_gather_object(names, socket.gethostname(), group=group)
    counting = host_tx_bytes() is not None and len(set(names)) == n // a.ranks_per_node > 1
    sent = {v: 0 for v in variants}
    for r in range(a.rounds):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for v in order:
            dist.barrier(group)
            tx0 = host_tx_bytes() if counting else None
            t0 = time.perf_counter()
            for _ in range(a.iters):
                step(v)
            dist.barrier(group)
            times[v].append((time.perf_counter() - t0) / a.iters)
            if counting and local_rank == 0:
                sent[v] += host_tx_bytes() - tx0
    steps = a.rounds * a.iters
    if counting:
        pairs, unique = predicted_rows(experts, [e // local for e in range(a.experts)], a.ranks_per_node, me)
        t = torch.tensor([float(sent[v]) for v in variants] + [float(pairs), float(unique)], dtype=torch.float64)
        dist.all_reduce(t, group=group)
        measured = {v: t[i].item() / steps for i, v in enumerate(variants)}
        pairs, unique = t[len(variants)].item(), t[len(variants) + 1].item()
        # auto goes direct only when no rank saves a row (MoeDispatch::Auto)
        rows = {"all_to_all_single": pairs, "dispatcher:dedup": unique, "dispatcher:direct": pairs,
                "dispatcher:auto": unique if unique < pairs else pairs}
        predicted = {v: 4 * rows[v] * a.hidden * 4 for v in variants}
    if me == 0:
        base = statistics.median(times["all_to_all_single"])
        print(f"torch MoE layer fwd+bwd: {n} ranks, {a.ranks_per_node} per node, E={a.experts}, k={a.topk}, "
              f"hidden={a.hidden}, tokens/rank={a.tokens}, nodes/token<={a.nodes_per_token}, "
              f"{a.rounds} rounds x {a.iters} steps, median")
        head = f"{'variant':<20} {'ms/step':>9} {'min':>9} {'max':>9} {'a2a/variant':>12}"
        if counting:
            head += f" {'MB/step hosts':>14} {'predicted':>10} {'ratio':>7}"
        print(head)
        for v in variants:
            m = statistics.median(times[v])
            line = f"{v:<20} {m * 1e3:9.2f} {min(times[v]) * 1e3:9.2f} {max(times[v]) * 1e3:9.2f} {base / m:12.3f}"
            if counting:
                line += f" {measured[v] / 1e6:14.3f} {predicted[v] / 1e6:10.3f} {measured[v] / predicted[v]:7.4f}"
            print(line)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Mixture-of-Experts token dispatch and combine over HALO, with numpy.

The steps of Megatron-LM's all-to-all token dispatcher, on the CPU:

1. route: each rank's router sends every token to its top-k experts, drawn from a
   Zipf-skewed popularity, so some ranks receive many more tokens than others
   (and, with a strong skew, none from some ranks);
2. permute: the (token, expert) rows are sorted by expert, so rows for the same rank
   are contiguous: ``input_split_sizes`` is the row count per rank;
3. counts: an even all-to-all of the per-expert counts tells each rank how many rows
   come from each rank (``output_split_sizes``) and for which of its experts;
4. dispatch: ``all_to_all_single`` with uneven splits (zeros included);
5. experts: expert ``e`` multiplies its rows by ``e + 1`` (a stand-in for the FFN);
6. combine: ``all_to_all_single`` back, with the two split lists swapped;
7. unpermute: each token becomes the router-weighted sum of its experts' outputs.

Every rank checks its result against the same computation done locally.

    cargo build -p halo -p halo-ffi      # target/debug/halo and target/debug/libhalo.so
    target/debug/halo launch -n 4 -- python3 python/examples/moe_dispatch.py
"""

import argparse
import sys
from pathlib import Path

import numpy as np

try:
    import halo
except ImportError:  # run from a checkout without `pip install ./python`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import halo


def route(rng, tokens, experts, topk, skew):
    """Top-k experts per token and their weights (Gumbel top-k over Zipf popularity)."""
    popularity = 1.0 / np.arange(1, experts + 1) ** skew
    scores = np.log(popularity)[None, :] + rng.gumbel(size=(tokens, experts))
    chosen = np.argsort(-scores, axis=1)[:, :topk]
    logits = np.take_along_axis(scores, chosen, axis=1)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    return chosen, weights.astype(np.float32)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=64, help="tokens per rank")
    p.add_argument("--hidden", type=int, default=16, help="features per token")
    p.add_argument("--experts-per-rank", type=int, default=2)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--skew", type=float, default=1.2, help="Zipf exponent of expert popularity")
    args = p.parse_args()

    with halo.init() as comm:
        me, n = comm.rank, comm.size
        per_rank = args.experts_per_rank
        experts = n * per_rank
        rng = np.random.default_rng(1234 + me)
        x = rng.standard_normal((args.tokens, args.hidden)).astype(np.float32)

        # 1-2. Route and permute: rows sorted by expert (so by destination rank).
        chosen, weights = route(rng, args.tokens, experts, min(args.topk, experts), args.skew)
        expert_of_row = chosen.reshape(-1)
        token_of_row = np.repeat(np.arange(args.tokens), chosen.shape[1])
        order = np.argsort(expert_of_row, kind="stable")
        permuted = x[token_of_row[order]]
        per_expert = np.bincount(expert_of_row, minlength=experts)  # rows per expert
        input_splits = per_expert.reshape(n, per_rank).sum(axis=1).tolist()

        # 3. Counts: recv_counts[q, j] = rows rank q sends to my local expert j.
        recv_counts = np.empty((n, per_rank), dtype=np.int64)
        comm.all_to_all_single(recv_counts, per_expert.reshape(n, per_rank).astype(np.int64))
        output_splits = recv_counts.sum(axis=1).tolist()

        # 4. Dispatch.
        received = np.empty((sum(output_splits), args.hidden), dtype=np.float32)
        comm.all_to_all_single(received, permuted, output_splits, input_splits)

        # 5. Experts: from each rank, the rows come grouped by my local expert.
        local_expert = np.concatenate([np.repeat(np.arange(per_rank), recv_counts[q]) for q in range(n)])
        expert_out = received * (me * per_rank + local_expert + 1).astype(np.float32)[:, None]

        # 6. Combine: the same rows go back, split sizes swapped.
        returned = np.empty_like(permuted)
        comm.all_to_all_single(returned, expert_out, input_splits, output_splits)

        # 7. Unpermute: weighted sum over each token's experts.
        y = np.zeros_like(x)
        np.add.at(y, token_of_row[order], returned * weights.reshape(-1)[order][:, None])

        expected = x * (weights * (chosen + 1)).sum(axis=1, dtype=np.float32)[:, None]
        if not np.allclose(y, expected, rtol=1e-5, atol=1e-5):
            bad = int(np.argmax(np.abs(y - expected).max(axis=1)))
            print(f"rank {me}: token {bad} is wrong after combine", file=sys.stderr)
            return 1

        if me == 0:
            print(f"{n} ranks, {experts} experts, top-{chosen.shape[1]}, topology: {comm.topology['name']}")
        comm.barrier()
        print(
            f"rank {me}: sent {input_splits} rows, received {output_splits} rows "
            f"({received.shape[0]} for {per_rank} local experts); combine correct"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

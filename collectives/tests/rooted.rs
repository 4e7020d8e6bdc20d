//! Broadcast, gather and scatter builders, proven symbolically for 1..=9 ranks (and a
//! few larger), every root, zero and non-zero sizes: every byte from the root (or to
//! it) lands exactly once at its place, no deadlock, no read before write. Broken
//! variants are caught.

use halo_collectives::*;
use halo_topology::Topology;

fn flat(n: usize) -> Topology {
    Topology::preset(&format!("flat:{n}")).unwrap()
}

fn sizes() -> Vec<usize> {
    (1..=9).chain([12, 16, 17]).collect()
}

#[test]
fn broadcast_builders_verify() {
    for n in sizes() {
        let topo = flat(n);
        for alg in BroadcastAlgorithm::ALL {
            for root in 0..n {
                for len in [0usize, 1, 5, BROADCAST_CHUNK, 2 * BROADCAST_CHUNK + 3] {
                    let s: Vec<_> = (0..n)
                        .map(|r| build_broadcast(alg, r, n, root, len).unwrap())
                        .collect();
                    let report = verify_broadcast(&s, &topo, root, len)
                        .unwrap_or_else(|e| panic!("{alg} n={n} root={root} len={len}: {e}"));
                    let chunks = match alg {
                        BroadcastAlgorithm::Binomial => 1,
                        BroadcastAlgorithm::Chain => len.div_ceil(BROADCAST_CHUNK),
                    };
                    let want = if len == 0 { 0 } else { (n - 1) * chunks };
                    assert_eq!(report.messages, want, "{alg} n={n} len={len}");
                    assert_eq!(report.message_bytes, ((n - 1) * len) as u64);
                    let ring = if len == 0 || n == 1 { 0 } else { n };
                    assert_eq!(report.agreement_messages, ring, "{alg} n={n} len={len}");
                }
            }
        }
        assert!(build_broadcast(BroadcastAlgorithm::Binomial, 0, n, n, 8).is_err());
    }
}

#[test]
fn gather_and_scatter_verify() {
    for n in sizes() {
        let topo = flat(n);
        for root in 0..n {
            for block in [0usize, 1, 7, 64] {
                let g: Vec<_> = (0..n)
                    .map(|r| build_gather(r, n, root, block).unwrap())
                    .collect();
                let report = verify_gather(&g, &topo, root, block)
                    .unwrap_or_else(|e| panic!("gather n={n} root={root} block={block}: {e}"));
                assert_eq!(report.message_bytes, ((n - 1) * block) as u64);
                let ring = if block == 0 || n == 1 { 0 } else { n };
                assert_eq!(report.agreement_messages, ring);
                let s: Vec<_> = (0..n)
                    .map(|r| build_scatter(r, n, root, block).unwrap())
                    .collect();
                let report = verify_scatter(&s, &topo, root, block)
                    .unwrap_or_else(|e| panic!("scatter n={n} root={root} block={block}: {e}"));
                assert_eq!(report.message_bytes, ((n - 1) * block) as u64);
            }
        }
        assert!(build_gather(0, n, n + 1, 8).is_err());
        assert!(build_scatter(n, n, 0, 8).is_err());
    }
}

#[test]
fn broken_rooted_schedules_are_caught() {
    let n = 5;
    let topo = flat(n);
    // A broadcast verified against another root.
    let s: Vec<_> = (0..n)
        .map(|r| build_broadcast(BroadcastAlgorithm::Binomial, r, n, 0, 8).unwrap())
        .collect();
    assert!(verify_broadcast(&s, &topo, 1, 8).is_err());
    // A gather whose root forgets its own block.
    let mut g: Vec<_> = (0..n).map(|r| build_gather(r, n, 2, 8).unwrap()).collect();
    let mut b = ScheduleBuilder::new(2, n, "gather without copy");
    let (out, back) = (b.scratch(1), b.scratch(1));
    b.send(3, ROOT_AGREEMENT_TAG, out, &[]);
    b.recv(1, ROOT_AGREEMENT_TAG, back, &[]);
    for q in (0..n).filter(|&q| q != 2) {
        b.recv(q, 0, Region::new(Buf::Recv, q * 8, 8), &[]);
    }
    g[2] = b.finish();
    let e = verify_gather(&g, &topo, 2, 8).unwrap_err();
    assert!(e.message.contains("from rank 2"), "{e}");
    // A rank that reads the byte an agreement message brought (it carries no data).
    let mut g: Vec<_> = (0..n).map(|r| build_gather(r, n, 2, 8).unwrap()).collect();
    let mut b = ScheduleBuilder::new(2, n, "gather that reads agreement");
    let (out, back) = (b.scratch(1), b.scratch(1));
    b.send(3, ROOT_AGREEMENT_TAG, out, &[]);
    let got = b.recv(1, ROOT_AGREEMENT_TAG, back, &[]);
    for q in (0..n).filter(|&q| q != 2) {
        b.recv(q, 0, Region::new(Buf::Recv, q * 8, 8), &[]);
    }
    b.copy(
        Region::new(Buf::Send, 0, 8),
        Region::new(Buf::Recv, 16, 8),
        &[],
    );
    let into = b.scratch(1);
    b.copy(back, into, &[got]);
    g[2] = b.finish();
    let e = verify_gather(&g, &topo, 2, 8).unwrap_err();
    assert!(e.message.contains("before they are written"), "{e}");
    // A scatter verified as a gather.
    let s: Vec<_> = (0..n).map(|r| build_scatter(r, n, 0, 8).unwrap()).collect();
    assert!(verify_gather(&s, &topo, 0, 8).is_err());
}

#[test]
fn the_simulator_runs_them_and_the_chain_wins_for_large_buffers() {
    let n = 8;
    let topo = Topology::preset("nodes:2x4").unwrap();
    let time = |alg, len| {
        let s: Vec<_> = (0..n)
            .map(|r| build_broadcast(alg, r, n, 0, len).unwrap())
            .collect();
        simulate(&topo, &s, &SimOptions::default()).unwrap().time
    };
    let big = 16 * BROADCAST_CHUNK;
    assert!(time(BroadcastAlgorithm::Chain, big) < time(BroadcastAlgorithm::Binomial, big));
    assert!(time(BroadcastAlgorithm::Binomial, 64) < time(BroadcastAlgorithm::Chain, 64));
    let g: Vec<_> = (0..n)
        .map(|r| build_gather(r, n, 3, 4096).unwrap())
        .collect();
    assert!(simulate(&topo, &g, &SimOptions::default()).unwrap().time > 0.0);
}

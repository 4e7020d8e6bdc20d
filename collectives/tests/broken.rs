//! Hand-broken schedules: each is rejected with the right message.

mod common;
use common::*;
use halo_collectives::*;
use halo_topology::Topology;

fn halo_schedules() -> (Topology, Vec<Schedule>) {
    let topo = Topology::preset("nodes:2x2").unwrap();
    let opts = AlgoOptions {
        chunk_bytes: 4,
        halo_levels: None,
        max_chunks: 4096,
        ..AlgoOptions::default()
    };
    let s = build_uniform(Algorithm::Halo, &topo, 8, &opts).unwrap();
    verify_all_to_all(&s, &topo, &UniformSizes(8)).expect("unbroken schedules verify");
    (topo, s)
}

fn check(topo: &Topology, s: &[Schedule]) -> VerifyError {
    verify_all_to_all(s, topo, &UniformSizes(8)).expect_err("broken schedule must be rejected")
}

fn find(s: &Schedule, pred: impl Fn(&Step) -> bool) -> usize {
    s.steps().iter().position(pred).expect("step present")
}

#[test]
fn dropped_recv_is_an_unmatched_send() {
    let (topo, mut s) = halo_schedules();
    let i = find(&s[1], |st| matches!(st, Step::Recv { .. }));
    let Step::Recv { peer, .. } = s[1].steps()[i] else {
        unreachable!()
    };
    // Replace the receive by a no-op copy of nothing so ids stay valid: drop it by
    // turning it into a self copy would be a different bug; remove it and shift deps.
    s[1] = s[1].edited(|steps, deps| {
        steps.remove(i);
        deps.remove(i);
        for d in deps.iter_mut() {
            d.retain(|&x| x as usize != i);
            for x in d.iter_mut() {
                if *x as usize > i {
                    *x -= 1;
                }
            }
        }
    });
    let e = check(&topo, &s);
    assert_eq!(e.rank, peer as usize, "{e}");
    assert!(
        e.message.contains("rank 1 posts no matching receive"),
        "{e}"
    );
}

#[test]
fn dropped_copy_leaves_a_block_missing() {
    let (topo, mut s) = halo_schedules();
    let i = find(
        &s[2],
        |st| matches!(st, Step::Copy { src, .. } if src.buf == Buf::Send),
    );
    s[2] = s[2].edited(|steps, _| {
        // Turn the self copy into a copy of zero... no: point it at nothing by making it a
        // copy into scratch, so the receive buffer misses the block.
        let Step::Copy { src, .. } = steps[i] else {
            unreachable!()
        };
        steps[i] = Step::Copy {
            src,
            dst: Region::new(Buf::Scratch, 0, src.len),
        };
    });
    let e = check(&topo, &s);
    // Either the scratch write collides with a received chunk or the block is missing.
    assert_eq!(e.rank, 2, "{e}");
    assert!(
        e.message.contains("only 0 of 8 bytes from rank 2") || e.message.contains("a second time"),
        "{e}"
    );
}

#[test]
fn wrong_offset_lands_in_the_wrong_place() {
    let (topo, mut s) = halo_schedules();
    // A direct receive into recv: shift it by one block.
    let i = find(
        &s[0],
        |st| matches!(st, Step::Recv { region, .. } if region.buf == Buf::Recv && region.offset == 8),
    );
    s[0] = s[0].edited(|steps, _| {
        if let Step::Recv { region, .. } = &mut steps[i] {
            region.offset = 16;
        }
    });
    let e = check(&topo, &s);
    assert_eq!(e.rank, 0, "{e}");
    assert!(
        e.message.contains("landed at recv[16]") || e.message.contains("a second time"),
        "{e}"
    );
}

#[test]
fn missing_dependency_reads_unordered_scratch() {
    let (topo, mut s) = halo_schedules();
    // A forward out of scratch must depend on the receive that filled it.
    let i = find(
        &s[0],
        |st| matches!(st, Step::Send { region, .. } if region.buf == Buf::Scratch),
    );
    s[0] = s[0].edited(|_, deps| deps[i].clear());
    let e = check(&topo, &s);
    assert_eq!((e.rank, e.step), (0, Some(i as u32)), "{e}");
    assert!(
        e.message.contains("without depending on it")
            || e.message.contains("before they are written"),
        "{e}"
    );
}

#[test]
fn crossed_tags_are_rejected() {
    let topo = Topology::preset("flat:3").unwrap();
    let mut s = build_uniform(Algorithm::Flat, &topo, 8, &AlgoOptions::default()).unwrap();
    // Rank 0 receives from 1 with a tag nobody sends.
    let i = find(&s[0], |st| matches!(st, Step::Recv { peer: 1, .. }));
    s[0] = s[0].edited(|steps, _| {
        if let Step::Recv { tag, .. } = &mut steps[i] {
            *tag = 7;
        }
    });
    let e = check(&topo, &s);
    assert!(
        e.message.contains("no matching receive") || e.message.contains("sends nothing"),
        "{e}"
    );

    // Two sends from rank 0 to rank 1 with one tag.
    let mut s = build_uniform(Algorithm::Flat, &topo, 8, &AlgoOptions::default()).unwrap();
    s[0] = s[0].edited(|steps, deps| {
        let send = *steps
            .iter()
            .find(|st| matches!(st, Step::Send { peer: 1, .. }))
            .unwrap();
        steps.push(send);
        deps.push(vec![]);
    });
    let e = check(&topo, &s);
    assert_eq!(e.rank, 0);
    assert!(e.message.contains("crossed tags"), "{e}");
}

#[test]
fn size_mismatch_is_named() {
    let topo = Topology::preset("flat:2").unwrap();
    let mut s = build_uniform(Algorithm::Flat, &topo, 8, &AlgoOptions::default()).unwrap();
    let i = find(&s[1], |st| matches!(st, Step::Send { .. }));
    s[1] = s[1].edited(|steps, _| {
        if let Step::Send { region, .. } = &mut steps[i] {
            region.len = 4;
        }
    });
    let e = check(&topo, &s);
    assert!(
        e.message.contains("sends 4 bytes to rank 0") && e.message.contains("receives 8 bytes"),
        "{e}"
    );
}

#[test]
fn cycle_is_a_deadlock() {
    // Both ranks receive before they send (a receive the send depends on): rendezvous deadlock.
    let topo = Topology::preset("flat:2").unwrap();
    let mut s = build_uniform(Algorithm::Flat, &topo, 8, &AlgoOptions::default()).unwrap();
    for sched in s.iter_mut() {
        let recv = find(sched, |st| matches!(st, Step::Recv { .. })) as u32;
        let send = find(sched, |st| matches!(st, Step::Send { .. }));
        *sched = sched.edited(|_, deps| deps[send].push(recv));
    }
    let e = check(&topo, &s);
    assert!(e.message.contains("deadlock"), "{e}");
}

#[test]
fn writing_twice_and_out_of_bounds() {
    let topo = Topology::preset("flat:2").unwrap();
    let mut s = build_uniform(Algorithm::Flat, &topo, 8, &AlgoOptions::default()).unwrap();
    s[0] = s[0].edited(|steps, deps| {
        steps.push(Step::Copy {
            src: Region::new(Buf::Send, 0, 8),
            dst: Region::new(Buf::Recv, 0, 8),
        });
        deps.push(vec![]);
    });
    let e = check(&topo, &s);
    assert!(e.message.contains("a second time"), "{e}");

    let mut s = build_uniform(Algorithm::Flat, &topo, 8, &AlgoOptions::default()).unwrap();
    s[1] = s[1].edited(|steps, deps| {
        steps.push(Step::Copy {
            src: Region::new(Buf::Send, 12, 8),
            dst: Region::new(Buf::Scratch, 0, 8),
        });
        deps.push(vec![]);
    });
    let e = check(&topo, &s);
    assert!(e.message.contains("outside the send buffer"), "{e}");
}

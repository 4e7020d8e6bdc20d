//! The measured automatic choice for all-to-all-v as processes: every rank runs
//! all-to-all-vs with counts that change every call (zeros included) but keep their
//! total, so the mean block and its size class stay, in automatic mode until the
//! trials of the class are over (`halo::tune`), checks every byte of every call, and
//! then checks with an all-reduce (minimum and maximum of the chosen algorithm's
//! index) that all ranks chose the same. The data pass is measured by the mean of what
//! it moves, beyond the first `Communicator::eager_v()` bytes of every block that go
//! with the counts; where every block fits (the smallest scale on a few ranks) no call
//! has a data pass, and `eager` is printed instead of a choice after as many calls as
//! the largest class's trials take.
//!
//! ```sh
//! cargo build --example auto_select_v -p halo && cargo build -p halo-cli
//! target/debug/halo launch -n 4 -- target/debug/examples/auto_select_v
//! ```

use halo::select::size_class;
use halo::tune::{MAX_CANDIDATES, trial_calls};
use halo::{Algorithm, Communicator, Partition, ReduceOp};

fn byte(src: usize, dst: usize, i: usize, call: usize) -> u8 {
    (src * 31 + dst * 7 + i + call * 13) as u8
}

/// Bytes rank `s` sends rank `d` in call `call`: a fixed multiset of counts (every
/// 11th zero) rotated by the call.
fn count(n: usize, s: usize, d: usize, call: usize, scale: usize) -> usize {
    let k = (s * n + d + call * 7) % (n * n);
    (k * 37 % 11) * scale
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut comm = Communicator::init_from_env()?;
    let (me, n) = (comm.rank(), comm.size());
    // Fixed at the default, so that what the data pass moves is known before a call
    // (by default the eager bytes are learned from call to call), and every remainder
    // in the data pass (by default those up to 512 KiB go right behind the counts).
    comm.set_eager_v(Some(1024));
    comm.set_speculate_v(Some(0));
    let eager = comm.eager_v();
    for scale in [1usize, 600, 8000] {
        let full = (0..n * n).map(|k| (k * 37 % 11) * scale).sum::<usize>() / (n * n);
        // The mean block of the data pass: the remainders beyond the eager bytes.
        let mean = (0..n * n)
            .map(|k| ((k * 37 % 11) * scale).saturating_sub(eager))
            .sum::<usize>()
            / (n * n);
        let all_eager = 10 * scale <= eager;
        // The most trial calls of the class.
        let most = trial_calls(size_class(mean), MAX_CANDIDATES);
        let mut call = 0;
        while if all_eager {
            call < most
        } else {
            comm.tuned_v(mean).is_none()
        } {
            if call > most {
                return Err(
                    format!("rank {me}: no choice for mean {mean} B after {call} calls").into(),
                );
            }
            let sc: Vec<usize> = (0..n).map(|d| count(n, me, d, call, scale)).collect();
            let rc: Vec<usize> = (0..n).map(|s| count(n, s, me, call, scale)).collect();
            let send: Vec<u8> = (0..n)
                .flat_map(|d| (0..sc[d]).map(move |i| byte(me, d, i, call)))
                .collect();
            let mut recv = vec![0u8; rc.iter().sum()];
            comm.all_to_all_v(
                &send,
                &Partition::packed(&sc),
                &mut recv,
                &Partition::packed(&rc),
            )?;
            let expect: Vec<u8> = (0..n)
                .flat_map(|s| (0..rc[s]).map(move |i| byte(s, me, i, call)))
                .collect();
            if recv != expect {
                return Err(format!("rank {me}: wrong bytes at mean {full} B, call {call}").into());
            }
            if all_eager && comm.last_algorithm() != Some(Algorithm::Flat) {
                return Err(format!("rank {me}: a data pass at mean {full} B, call {call}").into());
            }
            call += 1;
        }
        if all_eager {
            // The index after every algorithm's: "eager" must be every rank's too.
            let index = [Algorithm::ALL.len() as u32];
            let (mut lo, mut hi) = ([0u32], [0u32]);
            comm.all_reduce(&index, &mut lo, ReduceOp::Min)?;
            comm.all_reduce(&index, &mut hi, ReduceOp::Max)?;
            if lo != hi || comm.tuned_v(full).is_some() {
                return Err(format!("rank {me}: ranks differ at mean {full} B").into());
            }
            println!(
                "rank {me}/{n}: all_to_all_v mean {full} B -> eager after {call} calls, all ranks agree [every block within the {eager} bytes carried with the counts: one pass, nothing measured]"
            );
            continue;
        }
        let tuned = comm.tuned_v(mean).expect("decided");
        let index = Algorithm::ALL
            .iter()
            .position(|a| *a == tuned.algorithm)
            .expect("a known algorithm") as u32;
        let (mut lo, mut hi) = ([0u32], [0u32]);
        comm.all_reduce(&[index], &mut lo, ReduceOp::Min)?;
        comm.all_reduce(&[index], &mut hi, ReduceOp::Max)?;
        if lo != hi {
            return Err(format!("rank {me}: ranks chose differently at mean {full} B").into());
        }
        let times: Vec<String> = tuned
            .times
            .iter()
            .map(|(a, ns)| format!("{a} {:.1} us", *ns as f64 / 1e3))
            .collect();
        println!(
            "rank {me}/{n}: all_to_all_v mean {full} B -> {} after {call} calls, all ranks agree [{}] (the data pass's mean: {mean} B beyond {eager} eager bytes)",
            tuned.algorithm,
            times.join(", ")
        );
    }
    Ok(())
}

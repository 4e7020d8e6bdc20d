//! The measured automatic choice for all-to-all-v as processes: every rank runs
//! all-to-all-vs with counts that change every call (zeros included) but keep their
//! total, so the mean block and its size class stay, in automatic mode until the
//! trials of the class are over (`halo::tune`), checks every byte of every call, and
//! then checks with an all-reduce (minimum and maximum of the chosen algorithm's
//! index) that all ranks chose the same.
//!
//! ```sh
//! cargo build --example auto_select_v -p halo && cargo build -p halo-cli
//! target/debug/halo launch -n 4 -- target/debug/examples/auto_select_v
//! ```

use halo::tune::{MAX_CANDIDATES, TRIALS};
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
    for scale in [1usize, 600, 8000] {
        let mean = (0..n * n).map(|k| (k * 37 % 11) * scale).sum::<usize>() / (n * n);
        let mut call = 0;
        while comm.tuned_v(mean).is_none() {
            if call > TRIALS * MAX_CANDIDATES {
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
                return Err(format!("rank {me}: wrong bytes at mean {mean} B, call {call}").into());
            }
            call += 1;
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
            return Err(format!("rank {me}: ranks chose differently at mean {mean} B").into());
        }
        let times: Vec<String> = tuned
            .times
            .iter()
            .map(|(a, ns)| format!("{a} {:.1} us", *ns as f64 / 1e3))
            .collect();
        println!(
            "rank {me}/{n}: all_to_all_v mean {mean} B -> {} after {call} calls, all ranks agree [{}]",
            tuned.algorithm,
            times.join(", ")
        );
    }
    Ok(())
}

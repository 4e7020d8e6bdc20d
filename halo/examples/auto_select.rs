//! The measured automatic choice as processes: every rank runs uniform all-to-alls of a
//! few sizes in automatic mode until the trials of each size class are over
//! (`halo::tune`), checks every byte of every call, and then checks with an all-reduce
//! (minimum and maximum of the chosen algorithm's index) that all ranks chose the same.
//!
//! ```sh
//! cargo build --example auto_select -p halo && cargo build -p halo-cli
//! target/debug/halo launch -n 4 -- target/debug/examples/auto_select
//! ```

use halo::select::size_class;
use halo::tune::{MAX_CANDIDATES, trial_calls};
use halo::{Algorithm, Communicator, ReduceOp};

fn byte(src: usize, dst: usize, i: usize, call: usize) -> u8 {
    (src * 31 + dst * 7 + i + call * 13) as u8
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut comm = Communicator::init_from_env()?;
    let (me, n) = (comm.rank(), comm.size());
    for block in [16usize, 4096, 64 << 10] {
        let mut call = 0;
        while comm.tuned(block).is_none() {
            if call > trial_calls(size_class(block), MAX_CANDIDATES) {
                return Err(
                    format!("rank {me}: no choice for {block} B after {call} calls").into(),
                );
            }
            let send: Vec<u8> = (0..n * block)
                .map(|k| byte(me, k / block, k % block, call))
                .collect();
            let mut recv = vec![0u8; n * block];
            comm.all_to_all(&send, &mut recv)?;
            for (k, &b) in recv.iter().enumerate() {
                if b != byte(k / block, me, k % block, call) {
                    return Err(format!("rank {me}: wrong byte {k} at {block} B").into());
                }
            }
            call += 1;
        }
        let tuned = comm.tuned(block).expect("decided");
        let index = Algorithm::ALL
            .iter()
            .position(|a| *a == tuned.algorithm)
            .expect("a known algorithm") as u32;
        let (mut lo, mut hi) = ([0u32], [0u32]);
        comm.all_reduce(&[index], &mut lo, ReduceOp::Min)?;
        comm.all_reduce(&[index], &mut hi, ReduceOp::Max)?;
        if lo != hi {
            return Err(format!("rank {me}: ranks chose differently at {block} B").into());
        }
        let times: Vec<String> = tuned
            .times
            .iter()
            .map(|(a, ns)| format!("{a} {:.1} us", *ns as f64 / 1e3))
            .collect();
        println!(
            "rank {me}/{n}: {block} B per peer -> {} after {call} calls, all ranks agree [{}]",
            tuned.algorithm,
            times.join(", ")
        );
    }
    Ok(())
}

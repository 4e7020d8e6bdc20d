//! Running the data: the all-to-all-v of rows with per-peer row counts (the metadata
//! stages, the per-pair channel) and the MoE schedules over byte buffers, through the
//! engine every collective uses.

use crate::comm::{Communicator, Partition, exec_options};
use crate::error::Result;
use halo_collectives::{Buffers, MoePlan, Schedule};

fn displs(counts: &[usize], unit: usize) -> Vec<usize> {
    let mut at = 0;
    counts
        .iter()
        .map(|c| {
            let d = at;
            at += c * unit;
            d
        })
        .collect()
}

fn scaled(counts: &[usize], unit: usize) -> Vec<usize> {
    counts.iter().map(|c| c * unit).collect()
}

/// All-to-all-v of rows of `d` elements with per-peer row counts.
pub(super) fn rows_a2av<E: bytemuck::Pod>(
    comm: &mut Communicator,
    send: &[E],
    send_rows: &[usize],
    recv_rows: &[usize],
    d: usize,
) -> Result<Vec<E>> {
    let total: usize = recv_rows.iter().sum();
    let mut recv = vec![E::zeroed(); total * d];
    let (sc, sd) = (scaled(send_rows, d), displs(send_rows, d));
    let (rc, rd) = (scaled(recv_rows, d), displs(recv_rows, d));
    comm.all_to_all_v(
        send,
        &Partition::new(&sc, &sd),
        &mut recv,
        &Partition::new(&rc, &rd),
    )?;
    Ok(recv)
}

/// Runs one MoE schedule of this rank over byte buffers, through the engine every
/// collective uses, with the next tag base of the communicator.
pub(super) fn run_schedule(
    comm: &mut Communicator,
    schedule: &Schedule,
    send: &[u8],
    recv: &mut [u8],
) -> Result<()> {
    let base = comm.core.next_tag_base();
    comm.core.check_aborted()?;
    let mut scratch = vec![0u8; schedule.scratch_len()];
    let core = &mut comm.core;
    let opts = exec_options(core.timeout, &core.abort);
    core.backend.run(
        schedule,
        base,
        Buffers {
            send,
            recv,
            scratch: &mut scratch,
            call: halo_collectives::Call::new(halo_collectives::CallKind::AllToAllV),
        },
        &opts,
    )?;
    Ok(())
}

/// The plan with rows of `row` bytes.
pub(super) fn with_row(plan: &MoePlan, row: usize) -> MoePlan {
    let mut p = plan.clone();
    p.row = row;
    p
}

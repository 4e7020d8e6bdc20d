//! Bootstrap through MPI: the payload exchange as one `MPI_Allgather` of lengths and
//! one `MPI_Allgatherv` of bytes, over a communicator the application initialised.

use crate::error::{Error, Result};
use mpi::datatype::PartitionMut;
use mpi::traits::{Communicator, CommunicatorCollectives};

/// Every rank's payload, in rank order, gathered over `world` (all its ranks call it).
pub fn exchange_mpi<C: Communicator>(world: &C, payload: &[u8]) -> Result<Vec<Vec<u8>>> {
    let n = usize::try_from(world.size()).map_err(|_| Error::internal("negative MPI size"))?;
    let len = i32::try_from(payload.len()).map_err(|_| {
        Error::invalid_argument(format!(
            "bootstrap payload of {} bytes is too large for MPI",
            payload.len()
        ))
    })?;
    let mut lens = vec![0i32; n];
    world.all_gather_into(&len, &mut lens[..]);
    let mut displs = Vec::with_capacity(n);
    let mut at = 0i32;
    for &l in &lens {
        displs.push(at);
        at = at
            .checked_add(l)
            .ok_or_else(|| Error::invalid_argument("bootstrap payloads exceed 2 GiB in total"))?;
    }
    let mut all = vec![0u8; at as usize];
    {
        let mut part = PartitionMut::new(&mut all[..], &lens[..], &displs[..]);
        world.all_gather_varcount_into(payload, &mut part);
    }
    Ok(lens
        .iter()
        .zip(&displs)
        .map(|(&l, &d)| all[d as usize..(d + l) as usize].to_vec())
        .collect())
}

//! The MPI baseline of `halo bench --algo mpi` (cargo feature `mpi`): the same
//! benchmark loops over `MPI_Alltoall`, `MPI_Alltoallv`, `MPI_Send`/`MPI_Recv` and
//! `MPI_Isend` windows, through the `mpi` crate, on the processes HALO runs on.

use super::Implementation;
use halo::{Error, Result};
use mpi::datatype::{Partition, PartitionMut};
use mpi::traits::{Communicator, CommunicatorCollectives, Destination, Source};

/// MPI's collectives over a communicator (usually `MPI_COMM_WORLD`). MPI's default
/// error handler aborts the job on an error, so its calls return `Ok`; the launcher's
/// `--timeout` bounds a hang.
#[derive(Debug)]
pub struct MpiImplementation<'a, C: Communicator> {
    world: &'a C,
}

impl<'a, C: Communicator> MpiImplementation<'a, C> {
    /// An engine over `world`.
    pub fn new(world: &'a C) -> Self {
        MpiImplementation { world }
    }
}

fn counts_i32(v: &[usize], what: &str) -> Result<Vec<i32>> {
    v.iter()
        .map(|&c| {
            i32::try_from(c).map_err(|_| {
                Error::invalid_argument(format!("{what} {c} does not fit MPI's int counts"))
            })
        })
        .collect()
}

fn peer_i32(p: usize) -> Result<i32> {
    i32::try_from(p).map_err(|_| Error::invalid_argument(format!("rank {p} does not fit MPI")))
}

impl<C: Communicator> Implementation for MpiImplementation<'_, C> {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }
    fn size(&self) -> usize {
        self.world.size() as usize
    }
    fn barrier(&mut self) -> Result<()> {
        self.world.barrier();
        Ok(())
    }
    fn all_to_all(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        if send.len() != recv.len() || !send.len().is_multiple_of(self.size().max(1)) {
            return Err(Error::invalid_argument(
                "MPI all-to-all: buffers must hold equal blocks per rank",
            ));
        }
        counts_i32(&[send.len() / self.size().max(1)], "block of")?;
        if send.is_empty() {
            // An empty slice's pointer is 0x1, which is Open MPI's MPI_IN_PLACE: pass
            // one byte instead, which still makes a count of 0 per rank.
            let (s, mut r) = ([0u8; 1], [0u8; 1]);
            self.world.all_to_all_into(&s[..], &mut r[..]);
        } else {
            self.world.all_to_all_into(send, recv);
        }
        Ok(())
    }
    fn all_to_all_v(
        &mut self,
        send: &[u8],
        send_part: &halo::Partition<'_>,
        recv: &mut [u8],
        recv_part: &halo::Partition<'_>,
    ) -> Result<()> {
        let (send_counts, send_displs) = (send_part.counts(), send_part.displs());
        let (recv_counts, recv_displs) = (recv_part.counts(), recv_part.displs());
        let sc = counts_i32(send_counts, "count")?;
        let sd = counts_i32(send_displs, "displacement")?;
        let rc = counts_i32(recv_counts, "count")?;
        let rd = counts_i32(recv_displs, "displacement")?;
        let fits = |buf: usize, c: &[usize], d: &[usize]| {
            c.iter()
                .zip(d)
                .all(|(&c, &d)| d.checked_add(c).is_some_and(|e| e <= buf))
        };
        if !fits(send.len(), send_counts, send_displs)
            || !fits(recv.len(), recv_counts, recv_displs)
        {
            return Err(Error::invalid_argument(
                "MPI all-to-all-v: a block is out of its buffer",
            ));
        }
        // An empty slice's pointer is 0x1, which is Open MPI's MPI_IN_PLACE (rejected as
        // a receive buffer, misread as a send buffer): an empty side passes one byte,
        // with its counts (all 0) and displacements (all 0) unchanged.
        let (s1, mut r1) = ([0u8; 1], [0u8; 1]);
        let send = if send.is_empty() { &s1[..] } else { send };
        let recv = if recv.is_empty() { &mut r1[..] } else { recv };
        let s = Partition::new(send, sc, sd);
        let mut r = PartitionMut::new(recv, rc, rd);
        self.world.all_to_all_varcount_into(&s, &mut r);
        Ok(())
    }
    fn send(&mut self, buf: &[u8], peer: usize) -> Result<()> {
        self.world.process_at_rank(peer_i32(peer)?).send(buf);
        Ok(())
    }
    fn recv(&mut self, buf: &mut [u8], peer: usize) -> Result<()> {
        let status = self
            .world
            .process_at_rank(peer_i32(peer)?)
            .receive_into(buf);
        let got = status.count(u8::equivalent_datatype()) as usize;
        if got != buf.len() {
            return Err(Error::internal(format!(
                "MPI receive from rank {peer}: {got} bytes, {} expected",
                buf.len()
            )));
        }
        Ok(())
    }
    /// OSU's window: `window` `MPI_Isend`s in flight, then `MPI_Waitall`.
    fn send_window(&mut self, buf: &[u8], peer: usize, window: usize) -> Result<()> {
        let p = self.world.process_at_rank(peer_i32(peer)?);
        mpi::request::multiple_scope(window, |scope, coll| {
            for _ in 0..window {
                coll.add(p.immediate_send(scope, buf));
            }
            let mut statuses = Vec::with_capacity(window);
            coll.wait_all(&mut statuses);
        });
        Ok(())
    }
}

use mpi::datatype::Equivalence as _;

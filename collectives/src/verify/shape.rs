//! Pass 1: the inputs fit together — one schedule and one layout per rank of the
//! topology, each schedule built for its own rank.

use super::{Expectation, err};
use crate::error::VerifyError;
use crate::schedule::Schedule;
use halo_topology::Topology;

/// Checks the counts of schedules and layouts against the topology, and that
/// schedule `r` is rank `r`'s of the same size.
pub(super) fn check(
    schedules: &[Schedule],
    topology: &Topology,
    expect: &Expectation,
) -> Result<(), VerifyError> {
    let n = topology.size();
    if schedules.len() != n || expect.n != n {
        return Err(err(
            0,
            None,
            None,
            format!(
                "{} schedules and {} layouts for a topology of {n} ranks",
                schedules.len(),
                expect.n
            ),
        ));
    }
    for (r, s) in schedules.iter().enumerate() {
        if s.rank() != r || s.size() != n {
            return Err(err(
                r,
                None,
                None,
                format!(
                    "schedule says rank {} of {}, expected rank {r} of {n}",
                    s.rank(),
                    s.size()
                ),
            ));
        }
    }
    Ok(())
}

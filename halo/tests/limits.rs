//! World sizes above `halo::MAX_RANKS` are refused up front (issue 11, defect 5): an
//! `InvalidArgument` naming the figure, at once, instead of an abort on allocating for
//! billions of ranks (docs/RELIABILITY.md, "Limits").

use halo::{Communicator, Error, MAX_RANKS, UniqueId};
use std::time::{Duration, Instant};

#[test]
fn world_sizes_above_max_ranks_are_refused_before_anything_is_allocated() {
    assert_eq!(MAX_RANKS, 1 << 20);
    let id = UniqueId::new().unwrap();
    let started = Instant::now();
    for n in [MAX_RANKS + 1, 1 << 32, usize::MAX] {
        let e = Communicator::init_rank(&id, n, 0).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{n}: {e}");
        assert!(
            e.to_string()
                .contains(&format!("nranks is {n}: at most 1048576 ranks")),
            "{e}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

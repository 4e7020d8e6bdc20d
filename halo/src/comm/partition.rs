//! [`Partition`]: how a buffer is cut into one block per rank for
//! [`Communicator::all_to_all_v`](super::Communicator::all_to_all_v).

use std::borrow::Cow;

/// One block per rank of a buffer: `counts[q]` elements starting at element
/// `displs[q]` (MPI's counts and displacements; rsmpi's `Partition`).
///
/// The common case is blocks packed one after the other in rank order:
/// [`Partition::packed`] computes the displacements from the counts. Blocks anywhere
/// else (gaps, another order) take explicit displacements with [`Partition::new`].
/// Counts and displacements are in elements of the buffer's type, and any count may be
/// zero. Whether they fit the buffer and the communicator is checked by the call that
/// uses them, which names the rank of a bad entry.
///
/// ```
/// use halo::Partition;
///
/// let p = Partition::packed(&[2, 0, 3]);
/// assert_eq!(p.counts(), &[2, 0, 3]);
/// assert_eq!(p.displs(), &[0, 2, 2]);
/// assert_eq!(p.total(), Some(5));
///
/// let gapped = Partition::new(&[1, 1], &[4, 0]);
/// assert_eq!(gapped.extent(), Some(5));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition<'a> {
    counts: Cow<'a, [usize]>,
    displs: Cow<'a, [usize]>,
}

impl<'a> Partition<'a> {
    /// Blocks with explicit displacements: rank `q`'s block is
    /// `counts[q]` elements at `displs[q]`.
    pub fn new(counts: &'a [usize], displs: &'a [usize]) -> Self {
        Partition {
            counts: Cow::Borrowed(counts),
            displs: Cow::Borrowed(displs),
        }
    }

    /// Blocks packed in rank order: rank `q`'s block starts where rank `q - 1`'s ends.
    /// (Displacements that would overflow `usize` saturate; the call that uses the
    /// partition then reports the block as out of its buffer.)
    pub fn packed(counts: &'a [usize]) -> Self {
        let mut at = 0usize;
        let displs = counts
            .iter()
            .map(|&c| {
                let d = at;
                at = at.saturating_add(c);
                d
            })
            .collect();
        Partition {
            counts: Cow::Borrowed(counts),
            displs: Cow::Owned(displs),
        }
    }

    /// The same blocks of `n` elements for each of `ranks` ranks, packed.
    pub fn uniform(n: usize, ranks: usize) -> Partition<'static> {
        Partition {
            counts: Cow::Owned(vec![n; ranks]),
            displs: Cow::Owned((0..ranks).map(|q| q.saturating_mul(n)).collect()),
        }
    }

    /// A copy that borrows nothing (for operations that outlive the caller's counts).
    pub(crate) fn to_owned_static(&self) -> Partition<'static> {
        Partition {
            counts: Cow::Owned(self.counts.to_vec()),
            displs: Cow::Owned(self.displs.to_vec()),
        }
    }

    /// Elements per rank.
    pub fn counts(&self) -> &[usize] {
        &self.counts
    }

    /// Where each rank's block starts, in elements.
    pub fn displs(&self) -> &[usize] {
        &self.displs
    }

    /// The sum of the counts (`None` when it overflows).
    pub fn total(&self) -> Option<usize> {
        self.counts
            .iter()
            .try_fold(0usize, |s, &c| s.checked_add(c))
    }

    /// Elements a buffer needs to hold every non-empty block: the largest
    /// `displs[q] + counts[q]` (`None` when it overflows, `Some(0)` when every block
    /// is empty).
    pub fn extent(&self) -> Option<usize> {
        self.counts
            .iter()
            .zip(self.displs.iter())
            .filter(|(c, _)| **c > 0)
            .try_fold(0usize, |m, (&c, &d)| d.checked_add(c).map(|e| m.max(e)))
    }
}

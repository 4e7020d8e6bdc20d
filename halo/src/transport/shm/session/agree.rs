//! Call agreement on a session's side: whether a message may complete a receive of
//! this call (its length and call descriptor), whether a message of this call comes
//! from a rank that made another call (a *stray*, refused whatever its tag), and the
//! messages of this call read during earlier calls.

use super::{CResult, ShmSession};
use crate::transport::shm::segment::{CellHead, KIND_FIRST, KIND_POISON, KIND_RDV};
use crate::transport::{Expected, mismatch, poisoned};
use halo_collectives::{Call, CollectiveError, TAG_BITS};

impl ShmSession<'_> {
    /// The error when a message of `len` bytes carrying the descriptor `call` from
    /// `peer` meets a receive of `want` bytes (`up_to`: at most `want`); `None` when they
    /// agree.
    pub(super) fn refuse(
        &self,
        peer: usize,
        tag: u64,
        (len, call): (usize, u64),
        want: usize,
        up_to: bool,
    ) -> Option<CollectiveError> {
        let (theirs, ours) = (Call::from_raw(call), Call::from_raw(self.call));
        let fits = if up_to { len <= want } else { len == want };
        let differ = !fits || !ours.agrees(theirs);
        differ.then(|| {
            let me = self.t.rank;
            mismatch(
                peer,
                me,
                tag,
                (Some(len), theirs),
                Expected {
                    len: want,
                    call: ours,
                },
                me,
            )
        })
    }

    /// Whether the message starting with `h` belongs to this call (its sequence number
    /// and communicator) but carries another call's descriptor.
    pub(super) fn stray(&self, h: &CellHead) -> bool {
        matches!(h.kind(), KIND_FIRST | KIND_RDV | KIND_POISON)
            && (h.tag ^ self.tag_base) >> TAG_BITS == 0
            && !Call::from_raw(self.call).agrees(Call::from_raw(h.call))
    }

    /// The error of [`Self::stray`]'s message from `p`.
    pub(super) fn stray_error(&self, p: usize, h: &CellHead) -> CollectiveError {
        let me = self.t.rank;
        if h.kind() == KIND_POISON {
            return poisoned(
                p,
                me,
                h.tag,
                Call::from_raw(h.call),
                Call::from_raw(self.call),
            );
        }
        let len = usize::try_from(h.len).unwrap_or(usize::MAX);
        mismatch(
            p,
            me,
            h.tag,
            (Some(len), Call::from_raw(h.call)),
            Expected {
                len,
                call: Call::from_raw(self.call),
            },
            me,
        )
    }

    /// Messages of this call read during an earlier one (into memory of the transport's
    /// own) from a rank that made another call: the first fails this call.
    pub(super) fn scan_unexpected(&mut self) -> CResult<()> {
        self.scanned = true;
        let ours = Call::from_raw(self.call);
        let seq = self.tag_base >> TAG_BITS;
        let Some(i) = self
            .t
            .unexpected
            .iter()
            .position(|u| u.tag >> TAG_BITS == seq && !ours.agrees(Call::from_raw(u.call)))
        else {
            return Ok(());
        };
        let u = self.t.unexpected.remove(i);
        let me = self.t.rank;
        if u.poison {
            return Err(poisoned(u.peer, me, u.tag, Call::from_raw(u.call), ours));
        }
        Err(mismatch(
            u.peer,
            me,
            u.tag,
            (Some(u.data.len()), Call::from_raw(u.call)),
            Expected {
                len: u.data.len(),
                call: ours,
            },
            me,
        ))
    }
}

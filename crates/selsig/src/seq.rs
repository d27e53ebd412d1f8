//! [`Seq`], the sequence number of a work request on one send queue.

use std::fmt;

/// The sequence number of a work request on one send queue; it goes into the `wr_id`, so
/// a completion names the work request it belongs to. The tracker encodes it
/// ([`Posted::wr_id`](crate::Posted::wr_id), [`SendTracker::wr_id`](crate::SendTracker::wr_id): the number itself, or with the tag bit of
/// [`TrackerConfig::wr_id_tag`](crate::TrackerConfig::wr_id_tag) set) and decodes every completion's `wr_id` back
/// ([`SendTracker::send_seq`](crate::SendTracker::send_seq)): that is the encoding's one home.
///
/// Sequence numbers are `u64` and rise by one per work request; they never wrap (at a
/// billion work requests a second that takes centuries). Providers may count in `u16`
/// internally; that is theirs to wrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Seq(pub u64);

impl Seq {
    /// The number itself: the `wr_id` of a work request of a tracker without a
    /// [`wr_id_tag`](crate::TrackerConfig::wr_id_tag). With a tag, post [`Posted::wr_id`](crate::Posted::wr_id) (or
    /// [`SendTracker::wr_id`](crate::SendTracker::wr_id)).
    pub const fn wr_id(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

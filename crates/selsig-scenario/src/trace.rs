//! The canonical trace of a scenario run: JSON lines with no timing and no addresses, the
//! same on every run and on every conforming provider.

use serde::Serialize;

/// One line of the trace. [`Event::line`] gives it as `selsig run` prints it; the trace's
/// format is documented in docs/scenarios.md ("The trace").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// The first line of the trace of a scenario that races the NIC: the steps whose
    /// outcome depends on timing, so that two traces may legitimately differ
    /// ([`Scenario::races`](crate::Scenario::races)). A race-free scenario's trace has none.
    Races {
        /// The steps, each with its class and why.
        races: Vec<crate::Race>,
    },
    /// A step begins.
    Step {
        /// The step's number in the file, from 1.
        n: usize,
        /// What the step does: `post`, `recv`, `poll`, `confirm`, `drain`, `dereg` or
        /// `to_error`.
        kind: &'static str,
    },
    /// A work request was posted on a send queue.
    Post {
        /// The QP (its name in the file).
        qp: String,
        /// Its sequence number on that queue, from 1.
        seq: u64,
        /// The opcode: `rdma_write`, `rdma_write_with_imm`, `rdma_read`, `send` or
        /// `send_with_imm`.
        op: &'static str,
        /// The bytes it moves.
        len: u64,
        /// Whether it was posted signaled.
        signaled: bool,
        /// Why selsig signaled it (policy, requested, deadlock, ...).
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'static str>,
        /// A zero-length marker posted by a confirm or a drain.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        marker: bool,
    },
    /// Work requests the queue refused (it was in the error state or draining).
    Refused {
        /// The QP.
        qp: String,
        /// How many of the step's work requests it refused.
        count: u64,
        /// The queue's reason.
        why: String,
    },
    /// A receive was posted.
    RecvPost {
        /// The endpoint (`a.peer`).
        qp: String,
        /// Its `wr_id`: the receives of an endpoint count from 1.
        wr_id: u64,
        /// The bytes it can take.
        len: u64,
    },
    /// A completion was polled.
    Cqe {
        /// The endpoint it belongs to.
        qp: String,
        /// A send's sequence number, or a receive's `wr_id`.
        wr_id: u64,
        /// The status: `IBV_WC_*` lowercased, without the prefix (`success`,
        /// `rem_access_err`, `wr_flush_err`, ...).
        status: &'static str,
        /// Only in successful completions (an error completion's opcode is meaningless).
        #[serde(skip_serializing_if = "Option::is_none")]
        opcode: Option<&'static str>,
        /// Only where it is defined: receives and READs.
        #[serde(skip_serializing_if = "Option::is_none")]
        byte_len: Option<u32>,
        /// Immediate data of a receive.
        #[serde(skip_serializing_if = "Option::is_none")]
        imm: Option<u32>,
    },
    /// A work request was retired and handed back.
    Retire {
        /// The QP.
        qp: String,
        /// Its sequence number.
        seq: u64,
        /// `completed`, `failed` or `flushed`.
        outcome: &'static str,
        /// The status of a failed one.
        #[serde(skip_serializing_if = "Option::is_none")]
        status: Option<&'static str>,
    },
    /// A confirm found nothing to confirm beyond what is already signaled.
    ConfirmNotNeeded {
        /// The QP.
        qp: String,
    },
    /// An asynchronous event of the device.
    Async {
        /// The event's type (`qp_access_err`, `port_active`, ...).
        #[serde(rename = "type")]
        kind: &'static str,
        /// The endpoint of an event about a QP.
        #[serde(skip_serializing_if = "Option::is_none")]
        qp: Option<String>,
    },
    /// A region was deregistered.
    Dereg {
        /// The region.
        region: String,
    },
    /// A QP was moved to the error state.
    ToError {
        /// The endpoint.
        qp: String,
    },
    /// A region's contents at the end.
    Digest {
        /// The region.
        region: String,
        /// [`fnv1a64`](crate::fnv1a64) of its bytes, as 16 hex digits.
        fnv1a64: String,
    },
}

impl Event {
    /// The trace line (JSON, without the newline).
    pub fn line(&self) -> String {
        // Serializing these plain structs cannot fail.
        serde_json::to_string(self)
            .unwrap_or_else(|e| format!("{{\"event\":\"error\",\"why\":\"{e}\"}}"))
    }
}

//! The canonical trace of a scenario run: JSON lines with no timing and no addresses, the
//! same on every run and on every conforming provider.

use serde::Serialize;

/// One line of the trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A step begins.
    Step { n: usize, kind: &'static str },
    /// A work request was posted on a send queue.
    Post {
        qp: String,
        seq: u64,
        op: &'static str,
        len: u64,
        signaled: bool,
        /// Why selsig signaled it (policy, requested, deadlock, ...).
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'static str>,
        /// A zero-length marker posted by a confirm or a drain.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        marker: bool,
    },
    /// Work requests the queue refused (it was in the error state or draining).
    Refused { qp: String, count: u64, why: String },
    /// A receive was posted.
    RecvPost { qp: String, wr_id: u64, len: u64 },
    /// A completion was polled.
    Cqe {
        qp: String,
        wr_id: u64,
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
        qp: String,
        seq: u64,
        outcome: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        status: Option<&'static str>,
    },
    /// A confirm found nothing to confirm beyond what is already signaled.
    ConfirmNotNeeded { qp: String },
    /// An asynchronous event of the device.
    Async {
        #[serde(rename = "type")]
        kind: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        qp: Option<String>,
    },
    /// A region was deregistered.
    Dereg { region: String },
    /// A QP was moved to the error state.
    ToError { qp: String },
    /// A region's contents at the end.
    Digest { region: String, fnv1a64: String },
}

impl Event {
    /// The trace line.
    pub fn line(&self) -> String {
        // Serializing these plain structs cannot fail.
        serde_json::to_string(self)
            .unwrap_or_else(|e| format!("{{\"event\":\"error\",\"why\":\"{e}\"}}"))
    }
}

//! The checked scenario: names resolved to indices, values in range, what the runner runs.

use std::collections::BTreeMap;

use selsig::{Access, Policy, PostApi, WcStatus};
use selsig_soft::Personality;
use serde::Deserialize;

/// A scenario ready to run: names resolved, values in range. Made by [`load`](crate::load)
/// or [`parse`](crate::parse), run by [`run`](crate::run()).
#[derive(Debug)]
pub struct Scenario {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) personality: Option<Personality>,
    pub(crate) post_api: Option<PostApi>,
    pub(crate) cqs: Vec<Cq>,
    pub(crate) qps: Vec<Qp>,
    pub(crate) regions: Vec<Region>,
    pub(crate) steps: Vec<Action>,
    pub(crate) expect: Expect,
    /// The expectations on rxe, where they differ (see `differs`).
    pub(crate) expect_rxe: Option<Expect>,
    /// Why a provider differs, by provider.
    pub(crate) differs: BTreeMap<String, String>,
}

impl Scenario {
    /// The scenario's name: the file's name without its extension (`seed` for
    /// `scenarios/seed.toml`), `stdin` for standard input, or what [`parse`](crate::parse)
    /// was given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the scenario shows (its `description`).
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The software NIC's personality the file asks for (`[device] personality`), if any:
    /// open [`selsig_soft::SoftDevice`] with it, and run with
    /// [`RunOptions::rxe`](crate::RunOptions::rxe) for [`Personality::Rxe`]. Other providers
    /// have their own.
    pub fn personality(&self) -> Option<Personality> {
        self.personality
    }

    /// How the file asks for batches to be posted (`[device] post_api`), if it does: open
    /// the device with it (`selsig_soft::SoftConfig::post_api`,
    /// `selsig_verbs::VerbsDevice::with_post_api`).
    pub fn post_api(&self) -> Option<PostApi> {
        self.post_api
    }

    /// The name of a QP endpoint (`a`, `a.peer`).
    pub(crate) fn qp_name(&self, r: QpRef) -> String {
        let base = &self.qps[r.index].name;
        if r.peer {
            format!("{base}.peer")
        } else {
            base.clone()
        }
    }
}

/// What a run must show; each field is checked when given.
#[derive(Debug, Default, Clone)]
pub(crate) struct Expect {
    /// Every completion of the run, in trace order.
    pub cqes: Option<Vec<ExpectCqe>>,
    /// Outcomes per QP: ranges of sequence numbers, e.g. `["1-2 completed", "3 failed:rem_access_err"]`.
    pub outcomes: Option<BTreeMap<String, Vec<String>>>,
    /// FNV-1a 64 digests of regions at the end (hex).
    pub digests: Option<BTreeMap<String, String>>,
    /// Asynchronous events, as `type:qp` (e.g. `qp_access_err:a.peer`).
    pub events: Option<Vec<String>>,
}

/// One completion of `expect.cqes`, as written (and as the run checks it).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExpectCqe {
    pub qp: String,
    pub wr_id: u64,
    pub status: String,
    pub opcode: Option<String>,
    pub byte_len: Option<u32>,
    /// Immediate data: only in successful completions of receives.
    pub imm: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct Cq {
    pub name: String,
    pub size: u32,
    /// QPs whose send queue reports to it.
    pub senders: usize,
}

#[derive(Debug)]
pub(crate) struct Qp {
    pub name: String,
    pub depth: u32,
    pub sq_sig_all: bool,
    pub policy: Policy,
    pub send_cq: usize,
    pub peer_cq: usize,
    pub peer_access: Access,
    pub rnr_retry: u8,
    pub retry_cnt: u8,
    pub peer_depth: u32,
    /// `max_send_sge` as declared, if it was.
    pub max_send_sge: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct Region {
    pub name: String,
    pub size: usize,
    pub access: Access,
    pub fill: Fill,
    pub other_pd: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    Zero,
    Pattern,
    Byte(u8),
}

/// An endpoint of a step: a requester QP or its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpRef {
    pub index: usize,
    pub peer: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Write,
    WriteImm,
    Read,
    Send,
    SendImm,
    FetchAdd { add: u64 },
    CmpSwap { compare: u64, swap: u64 },
}

impl Op {
    /// Fetch-and-add or compare-and-swap.
    pub fn is_atomic(self) -> bool {
        matches!(self, Op::FetchAdd { .. } | Op::CmpSwap { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SignalChoice {
    Auto,
    Force,
    Last,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    BadRkey,
    BadLkey,
    OutOfBounds,
    /// An atomic's remote address 4 bytes past where it should be.
    Misaligned,
    /// Inline data of [`INLINE_TOO_LONG`] bytes, more than the QP's `max_inline_data`.
    InlineTooLong,
}

/// The bytes of inline data an `inline_too_long` fault carries: more than any QP of a
/// scenario reads back (its posts carry at most 32 inline bytes, which mlx5 reads back as
/// 60 and rxe as 32).
pub(crate) const INLINE_TOO_LONG: u64 = 64;

#[derive(Debug)]
pub(crate) struct Post {
    pub qp: usize,
    pub op: Op,
    pub local: Option<usize>,
    pub remote: Option<usize>,
    pub size: u64,
    pub count: u64,
    pub local_offset: u64,
    pub remote_offset: u64,
    pub stride: u64,
    pub signal: SignalChoice,
    pub inline: bool,
    pub imm: u32,
    pub fault: Option<(Fault, u64)>,
    /// A scatter/gather list (then `local` is `None` and `size` is the list's), each
    /// entry's offset moving by `stride` with each work request as the remote one does.
    pub list: Vec<Entry>,
    /// The entry of the list a bad_lkey breaks (0-based).
    pub fault_entry: usize,
    /// Posted as one batch.
    pub batch: bool,
}

/// An entry of a post's scatter/gather list.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub region: usize,
    pub offset: u64,
    pub size: u64,
}

#[derive(Debug)]
pub(crate) struct Recv {
    pub qp: QpRef,
    pub region: Option<usize>,
    pub size: u64,
    pub count: u64,
    pub offset: u64,
}

#[derive(Debug)]
pub(crate) enum Action {
    Post(Post),
    Recv(Recv),
    PollIdle,
    PollCqes(u64),
    Confirm(usize),
    Drain(usize),
    Dereg(usize),
    ToError(QpRef),
    DeviceFatal,
}

impl Action {
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Post(_) => "post",
            Action::Recv(_) => "recv",
            Action::PollIdle | Action::PollCqes(_) => "poll",
            Action::Confirm(_) => "confirm",
            Action::Drain(_) => "drain",
            Action::Dereg(_) => "dereg",
            Action::ToError(_) => "to_error",
            Action::DeviceFatal => "device_fatal",
        }
    }
}

/// One item of `expect.outcomes`: `"1-2 completed"`, `"3 failed:rem_access_err"`,
/// `"4-8 flushed"`, `"5-8 device_lost"`. Returns (first, last, outcome, status).
pub(crate) fn parse_outcome_range(
    item: &str,
) -> Result<(u64, u64, String, Option<String>), String> {
    let bad = || {
        format!(
            "{item:?} is not like \"1-2 completed\", \"3 failed:rem_access_err\", \"4-8 flushed\" or \"5-8 device_lost\""
        )
    };
    let (range, what) = item.trim().split_once(' ').ok_or_else(bad)?;
    let (first, last) = match range.split_once('-') {
        Some((a, b)) => (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?),
        None => {
            let n = range.parse().map_err(|_| bad())?;
            (n, n)
        }
    };
    if first == 0 || last < first {
        return Err(bad());
    }
    let (outcome, status) = match what.trim().split_once(':') {
        Some((o, s)) => (o.to_string(), Some(s.to_string())),
        None => (what.trim().to_string(), None),
    };
    match (outcome.as_str(), status.as_deref()) {
        ("completed" | "flushed" | "device_lost", None) => {}
        // A success is a completion, and a flush a work request flushed, never failed.
        ("failed", Some(s @ ("success" | "wr_flush_err"))) => {
            let instead = if s == "success" {
                "completed"
            } else {
                "flushed"
            };
            return Err(format!(
                "{item:?}: a work request whose completion is {s} is {instead}, never failed (write \"{first}{} {instead}\")",
                if last > first {
                    format!("-{last}")
                } else {
                    String::new()
                }
            ));
        }
        ("failed", Some(s)) if WcStatus::ALL.iter().any(|x| x.short_name() == s) => {}
        _ => return Err(bad()),
    }
    Ok((first, last, outcome, status))
}

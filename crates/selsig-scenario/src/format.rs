//! The file's shape: the TOML a scenario file holds, as serde reads it, each entry with its
//! place in the file (`Spanned`) so that the checker's errors name its line. Nothing here
//! is checked beyond its type: `check` makes a `Scenario` of it.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use toml::Spanned;

use crate::model::{Expect, ExpectCqe};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    /// What the scenario shows.
    pub description: Spanned<String>,
    #[serde(default)]
    pub device: DeviceSection,
    #[serde(default)]
    pub cq: Vec<Spanned<CqDecl>>,
    pub qp: Vec<Spanned<QpDecl>>,
    #[serde(default)]
    pub region: Vec<Spanned<RegionDecl>>,
    pub step: Vec<Spanned<Step>>,
    #[serde(default)]
    pub expect: Option<Spanned<ExpectDecl>>,
    /// Where a provider legitimately differs, and why: `differs.rxe = "..."`. Required
    /// for `[expect.rxe]`, and only with it.
    #[serde(default)]
    pub differs: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeviceSection {
    /// The software NIC's personality: mlx5 (default) or rxe.
    pub personality: Option<Spanned<String>>,
    /// How batches are posted: legacy (`ibv_post_send`, default) or extended (`ibv_wr_*`,
    /// all or nothing).
    pub post_api: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CqDecl {
    pub name: String,
    pub size: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QpDecl {
    pub name: String,
    /// `max_send_wr` asked for (use powers of two: mlx5 rounds up with up to 60 bytes of
    /// inline data, rxe does not; docs/scenarios.md gives what mlx5 reads back).
    #[serde(default = "default_depth")]
    pub depth: u32,
    #[serde(default)]
    pub sq_sig_all: bool,
    /// `every:N`, `always`, `never`, or `manual` (signal only what a post asks for, and what
    /// selsig must force). An adaptive policy is refused: its signals depend on time, and a
    /// scenario's trace must not.
    #[serde(default = "default_policy")]
    pub policy: String,
    /// The CQ of this QP's send queue (default: one of its own).
    pub send_cq: Option<String>,
    /// The CQ of the peer's receive queue (default: one of its own).
    pub peer_cq: Option<String>,
    /// What the peer lets this QP do to its memory (`qp_access_flags`).
    #[serde(default = "default_peer_access")]
    pub peer_access: Vec<String>,
    /// The requester's RNR retry count (7 = forever).
    #[serde(default = "default_retries")]
    pub rnr_retry: u8,
    /// The requester's transport retry count (rxe retries 7 forever).
    #[serde(default = "default_retries")]
    pub retry_cnt: u8,
    /// Receive queue depth of the peer.
    #[serde(default = "default_recv_depth")]
    pub peer_depth: u32,
    /// `max_send_sge` asked for (default: the longest `list` of its posts, at least 1).
    pub max_send_sge: Option<u32>,
}

fn default_depth() -> u32 {
    16
}
fn default_policy() -> String {
    "every:4".to_string()
}
fn default_peer_access() -> Vec<String> {
    vec!["remote_write".into(), "remote_read".into()]
}
/// `rnr_retry` and `retry_cnt`: 7, as perftest.
fn default_retries() -> u8 {
    7
}
fn default_recv_depth() -> u32 {
    16
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegionDecl {
    pub name: String,
    pub size: u64,
    #[serde(default)]
    pub access: Vec<String>,
    /// `zero` (default), `pattern`, or a byte value.
    #[serde(default)]
    pub fill: Option<toml::Value>,
    /// `main` (default) or `other`: a second protection domain.
    #[serde(default = "default_pd")]
    pub pd: String,
}

fn default_pd() -> String {
    "main".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Step {
    pub post: Option<PostStep>,
    pub recv: Option<RecvStep>,
    pub poll: Option<PollStep>,
    pub confirm: Option<String>,
    pub drain: Option<String>,
    pub dereg: Option<String>,
    pub to_error: Option<String>,
    pub device_fatal: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PostStep {
    pub qp: String,
    /// write, write_imm, read, send, send_imm, fetch_add, cmp_swap.
    pub op: String,
    /// The local region (not needed for zero-length operations or inline data from a
    /// literal).
    pub local: Option<String>,
    /// The remote region (RDMA operations).
    pub remote: Option<String>,
    #[serde(default)]
    pub size: u64,
    #[serde(default = "one")]
    pub count: u64,
    /// Where the first work request's local bytes start (needs a local region).
    pub local_offset: Option<u64>,
    /// Where the first work request's remote bytes start (needs a remote region).
    pub remote_offset: Option<u64>,
    /// Bytes between consecutive work requests' offsets (default: `size`).
    pub stride: Option<u64>,
    /// auto (default), force, or last (force the last of the batch).
    #[serde(default = "auto")]
    pub signal: String,
    /// Send the local bytes inline.
    #[serde(default)]
    pub inline: bool,
    /// Immediate data (write_imm and send_imm only; default 0).
    pub imm: Option<u32>,
    /// bad_rkey, bad_lkey or out_of_bounds, on work request `fault_at` of the batch.
    pub fault: Option<String>,
    /// Which work request of the batch the fault breaks (1-based, default 1).
    pub fault_at: Option<u64>,
    /// What fetch_add adds (default 1).
    pub add: Option<u64>,
    /// What cmp_swap compares the remote 8 bytes with.
    pub compare: Option<u64>,
    /// What cmp_swap writes when they are equal.
    pub swap: Option<u64>,
    /// A scatter/gather list instead of `local`: each work request gathers these pieces in
    /// order (a READ scatters over them). Its size is theirs together.
    pub list: Option<Vec<EntryDecl>>,
    /// Which entry of the list a bad_lkey breaks (1-based, default 1).
    pub fault_entry: Option<u64>,
    /// Post the step's work requests as one batch (one `post_batch`, one doorbell)
    /// instead of one at a time.
    #[serde(default)]
    pub batch: bool,
}

/// An entry of a post's `list`: `size` bytes of region `local` from `offset`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EntryDecl {
    pub local: String,
    #[serde(default)]
    pub offset: u64,
    pub size: u64,
}

fn one() -> u64 {
    1
}
fn auto() -> String {
    "auto".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecvStep {
    pub qp: String,
    pub region: Option<String>,
    #[serde(default)]
    pub size: u64,
    #[serde(default = "one")]
    pub count: u64,
    /// Where the first receive's bytes start in the region (needs a region).
    pub offset: Option<u64>,
}

#[derive(Debug)]
pub(crate) enum PollStep {
    /// `poll = "idle"`.
    Word(String),
    /// `poll = { cqes = N }`.
    Count { cqes: u64 },
}

impl<'de> Deserialize<'de> for PollStep {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = PollStep;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"idle\" or { cqes = N }")
            }
            fn visit_str<E: serde::de::Error>(self, word: &str) -> Result<PollStep, E> {
                Ok(PollStep::Word(word.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<PollStep, A::Error> {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Count {
                    cqes: u64,
                }
                let c = Count::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(PollStep::Count { cqes: c.cqes })
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// `[expect]` as written, each entry with its place in the file, so that an error names the
/// entry's line. Checked into an [`Expect`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExpectDecl {
    pub cqes: Option<Vec<Spanned<ExpectCqe>>>,
    pub outcomes: Option<BTreeMap<String, Spanned<Vec<Spanned<String>>>>>,
    pub digests: Option<BTreeMap<String, Spanned<String>>>,
    pub events: Option<Vec<Spanned<String>>>,
    pub rxe: Option<Spanned<Box<ExpectDecl>>>,
}

impl ExpectDecl {
    /// The expectations without their places in the file (`rxe` is checked apart).
    pub(crate) fn plain(&self) -> Expect {
        let items = |l: &Vec<Spanned<String>>| l.iter().map(|i| i.get_ref().clone()).collect();
        Expect {
            cqes: self
                .cqes
                .as_ref()
                .map(|l| l.iter().map(|c| c.get_ref().clone()).collect()),
            outcomes: self.outcomes.as_ref().map(|m| {
                m.iter()
                    .map(|(q, l)| (q.clone(), items(l.get_ref())))
                    .collect()
            }),
            digests: self.digests.as_ref().map(|m| {
                m.iter()
                    .map(|(r, d)| (r.clone(), d.get_ref().clone()))
                    .collect()
            }),
            events: self.events.as_ref().map(items),
        }
    }
}

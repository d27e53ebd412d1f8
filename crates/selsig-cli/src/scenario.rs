//! Scenario files: a send-queue story in TOML (see docs/scenarios.md), parsed and checked
//! before anything runs. Every error names the file, the line and the problem.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;
use std::ops::Range;
use std::path::Path;

use selsig::{Access, Policy, PolicyError, WcOpcode, WcStatus};
use serde::Deserialize;
use toml::Spanned;

/// Largest region a scenario may register.
pub const MAX_REGION: u64 = 64 << 20;
/// Most work requests one post step may post (or receives one recv step).
pub const MAX_COUNT: u64 = 1 << 20;
/// Most work requests and receives a scenario may post in all (the trace keeps an event
/// or more for each: about 450 bytes a work request).
pub const MAX_TOTAL: u64 = 1 << 21;
/// Most memory all regions of a scenario may take together.
pub const MAX_REGIONS_TOTAL: u64 = 1 << 30;
/// Most queue pairs (each with its peer) a scenario may create.
pub const MAX_QPS: usize = 64;

/// A scenario error: where and what.
#[derive(Debug)]
pub struct ScenarioError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            // About the whole file (it cannot be read, or lacks something).
            return write!(f, "{}: {}", self.file, self.message);
        }
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )
    }
}

impl std::error::Error for ScenarioError {}

// ----- the file's shape -------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
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
pub struct DeviceSection {
    /// The software NIC's personality: mlx5 (default) or rxe.
    pub personality: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CqDecl {
    pub name: String,
    pub size: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QpDecl {
    pub name: String,
    /// `max_send_wr` asked for (use powers of two: mlx5 rounds up, rxe does not).
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
pub struct RegionDecl {
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
pub struct Step {
    pub post: Option<PostStep>,
    pub recv: Option<RecvStep>,
    pub poll: Option<PollStep>,
    pub confirm: Option<String>,
    pub drain: Option<String>,
    pub dereg: Option<String>,
    pub to_error: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostStep {
    pub qp: String,
    /// write, write_imm, read, send, send_imm.
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
}

fn one() -> u64 {
    1
}
fn auto() -> String {
    "auto".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecvStep {
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
pub enum PollStep {
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
pub struct ExpectDecl {
    pub cqes: Option<Vec<Spanned<ExpectCqe>>>,
    pub outcomes: Option<BTreeMap<String, Spanned<Vec<Spanned<String>>>>>,
    pub digests: Option<BTreeMap<String, Spanned<String>>>,
    pub events: Option<Vec<Spanned<String>>>,
    pub rxe: Option<Spanned<Box<ExpectDecl>>>,
}

/// What a run must show; each field is checked when given.
#[derive(Debug, Default)]
pub struct Expect {
    /// Every completion of the run, in trace order.
    pub cqes: Option<Vec<ExpectCqe>>,
    /// Outcomes per QP: ranges of sequence numbers, e.g. `["1-2 completed", "3 failed:rem_access_err"]`.
    pub outcomes: Option<BTreeMap<String, Vec<String>>>,
    /// FNV-1a 64 digests of regions at the end (hex).
    pub digests: Option<BTreeMap<String, String>>,
    /// Asynchronous events, as `type:qp` (e.g. `qp_access_err:a.peer`).
    pub events: Option<Vec<String>>,
}

impl ExpectDecl {
    /// The expectations without their places in the file (`rxe` is checked apart).
    fn plain(&self) -> Expect {
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

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExpectCqe {
    pub qp: String,
    pub wr_id: u64,
    pub status: String,
    pub opcode: Option<String>,
    pub byte_len: Option<u32>,
    /// Immediate data: only in successful completions of receives.
    pub imm: Option<u32>,
}

// ----- the checked scenario ---------------------------------------------------------------

/// A scenario ready to run: names resolved, values in range.
#[derive(Debug)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub personality: Option<selsig_soft::Personality>,
    pub cqs: Vec<Cq>,
    pub qps: Vec<Qp>,
    pub regions: Vec<Region>,
    pub steps: Vec<Action>,
    pub expect: Expect,
    /// The expectations on rxe, where they differ (see `differs`).
    pub expect_rxe: Option<Expect>,
    /// Why a provider differs, by provider.
    pub differs: BTreeMap<String, String>,
}

#[derive(Debug)]
pub struct Cq {
    pub name: String,
    pub size: u32,
    /// QPs whose send queue reports to it.
    pub senders: usize,
}

#[derive(Debug)]
pub struct Qp {
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
}

#[derive(Debug)]
pub struct Region {
    pub name: String,
    pub size: usize,
    pub access: Access,
    pub fill: Fill,
    pub other_pd: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    Zero,
    Pattern,
    Byte(u8),
}

/// An endpoint of a step: a requester QP or its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpRef {
    pub index: usize,
    pub peer: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write,
    WriteImm,
    Read,
    Send,
    SendImm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalChoice {
    Auto,
    Force,
    Last,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    BadRkey,
    BadLkey,
    OutOfBounds,
}

#[derive(Debug)]
pub struct Post {
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
}

#[derive(Debug)]
pub struct Recv {
    pub qp: QpRef,
    pub region: Option<usize>,
    pub size: u64,
    pub count: u64,
    pub offset: u64,
}

#[derive(Debug)]
pub enum Action {
    Post(Post),
    Recv(Recv),
    PollIdle,
    PollCqes(u64),
    Confirm(usize),
    Drain(usize),
    Dereg(usize),
    ToError(QpRef),
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
        }
    }
}

impl Scenario {
    /// The name of a QP endpoint (`a`, `a.peer`).
    pub fn qp_name(&self, r: QpRef) -> String {
        let base = &self.qps[r.index].name;
        if r.peer {
            format!("{base}.peer")
        } else {
            base.clone()
        }
    }
}

/// Reads and checks a scenario file.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    use std::io::Read as _;
    // `-` is standard input, as for most tools that read a file.
    let stdin = path == Path::new("-");
    let file = if stdin {
        "<stdin>".to_string()
    } else {
        path.display().to_string()
    };
    let error = |message: String| ScenarioError {
        file: file.clone(),
        line: 0,
        column: 0,
        message,
    };
    // Read up to one byte past the limit: a file larger than any scenario (or a device
    // that never ends, as /dev/zero) is refused, not read until memory runs out. A pipe
    // (`selsig run <(generate)`) is read as a file is.
    let mut text = String::new();
    let read = if stdin {
        std::io::stdin()
            .lock()
            .take(MAX_FILE + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_FILE + 1).read_to_string(&mut text))
    };
    read.map_err(|e| error(format!("cannot read the scenario: {e}")))?;
    if text.len() as u64 > MAX_FILE {
        return Err(error(format!(
            "larger than {} MiB: not a scenario",
            MAX_FILE >> 20
        )));
    }
    if stdin {
        return parse(&file, "stdin", &text);
    }
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.clone());
    parse(&file, &name, &text)
}

/// The largest scenario file read. Scenarios are a few kilobytes; counts, not lines,
/// make long runs.
const MAX_FILE: u64 = 4 << 20;

/// Parses and checks scenario text; `file` names it in errors.
pub fn parse(file: &str, name: &str, text: &str) -> Result<Scenario, ScenarioError> {
    let at = |span: Option<Range<usize>>, message: String| {
        let (line, column) = span.map_or((0, 0), |s| line_col(text, s.start));
        ScenarioError {
            file: file.to_string(),
            line,
            column,
            message,
        }
    };
    let raw: File = toml::from_str(text).map_err(|e| at(e.span(), e.message().to_string()))?;
    Checker { raw: &raw, at: &at }.check(name)
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

struct Checker<'a, F: Fn(Option<Range<usize>>, String) -> ScenarioError> {
    raw: &'a File,
    at: &'a F,
}

impl<F: Fn(Option<Range<usize>>, String) -> ScenarioError> Checker<'_, F> {
    fn check(&self, name: &str) -> Result<Scenario, ScenarioError> {
        let raw = self.raw;
        if raw.description.get_ref().trim().is_empty() {
            return Err(self.err(
                Some(raw.description.span()),
                "description is empty: say what the scenario shows".into(),
            ));
        }
        let personality = match &raw.device.personality {
            None => None,
            Some(p) => Some(p.get_ref().parse().map_err(|e: String| {
                self.err(Some(p.span()), format!("device.personality: {e}"))
            })?),
        };
        // CQs: declared ones, then one per QP side that names none.
        let mut cqs: Vec<Cq> = Vec::new();
        for c in &raw.cq {
            let span = Some(c.span());
            let c = c.get_ref();
            self.name_ok(&c.name, span.clone(), "cq")?;
            if cqs.iter().any(|x| x.name == c.name) {
                return Err(self.err(span, format!("a second cq named {:?}", c.name)));
            }
            if c.size == 0 || c.size > 1 << 20 {
                return Err(self.err(
                    span,
                    format!(
                        "cq {:?}: size {} is out of range 1..=1048576",
                        c.name, c.size
                    ),
                ));
            }
            cqs.push(Cq {
                name: c.name.clone(),
                size: c.size,
                senders: 0,
            });
        }
        if raw.qp.is_empty() {
            return Err(self.err(None, "a scenario needs at least one [[qp]]".into()));
        }
        if raw.qp.len() > MAX_QPS {
            return Err(self.err(
                Some(raw.qp[MAX_QPS].span()),
                format!(
                    "{} queue pairs: a scenario creates at most {MAX_QPS}",
                    raw.qp.len()
                ),
            ));
        }
        let mut qps: Vec<Qp> = Vec::new();
        for q in &raw.qp {
            let span = Some(q.span());
            let q = q.get_ref();
            self.name_ok(&q.name, span.clone(), "qp")?;
            if qps.iter().any(|x| x.name == q.name) {
                return Err(self.err(span, format!("a second qp named {:?}", q.name)));
            }
            if q.depth == 0 || q.depth > 32768 {
                return Err(self.err(
                    span,
                    format!(
                        "qp {:?}: depth {} is out of range 1..=32768",
                        q.name, q.depth
                    ),
                ));
            }
            if q.peer_depth == 0 || q.peer_depth > 32768 {
                return Err(self.err(
                    span,
                    format!(
                        "qp {:?}: peer_depth {} is out of range 1..=32768",
                        q.name, q.peer_depth
                    ),
                ));
            }
            for (field, value) in [("rnr_retry", q.rnr_retry), ("retry_cnt", q.retry_cnt)] {
                if value > 7 {
                    return Err(self.err(
                        span,
                        format!("qp {:?}: {field} {value} is out of range 0..=7", q.name),
                    ));
                }
            }
            // As the other policies' names: spaces around and case aside.
            let manual = q.policy.trim().eq_ignore_ascii_case("manual");
            let policy = if manual {
                Policy::Never
            } else {
                q.policy.parse().map_err(|e| {
                    // The forms a scenario takes: not the adaptive policy, and manual too.
                    let e = match e {
                        PolicyError::Unknown(text) => format!(
                            "unknown policy {text:?}: expected every:N, always, never or manual"
                        ),
                        e => e.to_string(),
                    };
                    self.err(span.clone(), format!("qp {:?}: {e}", q.name))
                })?
            };
            if matches!(policy, Policy::Adaptive { .. }) {
                return Err(self.err(
                    span,
                    format!(
                        "qp {:?}: policy {:?}: an adaptive policy signals by the time work \
                         requests wait, which a trace must not depend on: use every:N, always, \
                         never or manual",
                        q.name, q.policy
                    ),
                ));
            }
            // A QP names a declared CQ (they come first); a QP's own is its alone.
            let declared = raw.cq.len();
            let mut cq_for =
                |named: &Option<String>, own: String, size: u32| -> Result<usize, ScenarioError> {
                    match named {
                    Some(n) => cqs[..declared]
                        .iter()
                        .position(|c| &c.name == n)
                        .ok_or_else(|| {
                            let own = match n.ends_with(".cq") {
                                true => {
                                    " (a QP's own CQ is not shared: declare a [[cq]] to share one)"
                                }
                                false => "",
                            };
                            self.err(
                                span.clone(),
                                format!("qp {:?}: no [[cq]] named {n:?}{own}", q.name),
                            )
                        }),
                    None => {
                        cqs.push(Cq {
                            name: own,
                            size,
                            senders: 0,
                        });
                        Ok(cqs.len() - 1)
                    }
                }
                };
            let send_cq = cq_for(&q.send_cq, format!("{}.cq", q.name), 2 * q.depth + 2)?;
            let peer_cq = cq_for(
                &q.peer_cq,
                format!("{}.peer.cq", q.name),
                2 * q.peer_depth + 2,
            )?;
            cqs[send_cq].senders += 1;
            let peer_access = self.access(
                &q.peer_access,
                span.clone(),
                &format!("qp {:?}: peer_access", q.name),
            )?;
            // A QP's access flags are remote ones: the NIC always writes a receive's bytes.
            if peer_access.contains(Access::LOCAL_WRITE) {
                return Err(self.err(
                    span,
                    format!(
                        "qp {:?}: peer_access: local_write is a region's flag, not a queue \
                         pair's (its receives are written whatever the QP allows)",
                        q.name
                    ),
                ));
            }
            qps.push(Qp {
                name: q.name.clone(),
                depth: q.depth,
                sq_sig_all: q.sq_sig_all,
                policy,
                send_cq,
                peer_cq,
                peer_access,
                rnr_retry: q.rnr_retry,
                retry_cnt: q.retry_cnt,
                peer_depth: q.peer_depth,
            });
        }
        // Every receive completes (if only flushed): a CQ holds those of the peers that
        // report to it, and room for a send completion when a send queue reports to it too.
        // (The providers may round sizes up; the run checks what they made.)
        for (i, c) in raw.cq.iter().enumerate() {
            let receives: u64 = qps
                .iter()
                .filter(|q| q.peer_cq == i)
                .map(|q| u64::from(q.peer_depth))
                .sum();
            let needed = receives + u64::from(cqs[i].senders > 0);
            if u64::from(cqs[i].size) < needed {
                return Err(self.err(
                    Some(c.span()),
                    format!(
                        "cq {:?}: size {} holds less than the {receives} receive slots \
                         (peer_depth) of the peers that report to it{}",
                        cqs[i].name,
                        cqs[i].size,
                        if cqs[i].senders > 0 {
                            " and a send completion"
                        } else {
                            ""
                        }
                    ),
                ));
            }
        }
        // A declared CQ no QP names would only be created.
        for (i, c) in raw.cq.iter().enumerate() {
            if cqs[i].senders == 0 && !qps.iter().any(|q| q.peer_cq == i) {
                return Err(self.err(
                    Some(c.span()),
                    format!(
                        "cq {:?}: no QP reports to it (name it in a QP's send_cq or peer_cq)",
                        cqs[i].name
                    ),
                ));
            }
        }
        let mut regions: Vec<Region> = Vec::new();
        let mut total = 0u64;
        for r in &raw.region {
            let span = Some(r.span());
            let r = r.get_ref();
            self.name_ok(&r.name, span.clone(), "region")?;
            if regions.iter().any(|x| x.name == r.name) {
                return Err(self.err(span, format!("a second region named {:?}", r.name)));
            }
            if r.size == 0 || r.size > MAX_REGION {
                return Err(self.err(
                    span,
                    format!(
                        "region {:?}: size {} is out of range 1..={MAX_REGION}",
                        r.name, r.size
                    ),
                ));
            }
            total += r.size;
            if total > MAX_REGIONS_TOTAL {
                return Err(self.err(
                    span,
                    format!(
                        "region {:?}: the regions take more than {MAX_REGIONS_TOTAL} bytes together",
                        r.name
                    ),
                ));
            }
            let fill = match &r.fill {
                None => Fill::Zero,
                Some(toml::Value::String(s)) if s == "zero" => Fill::Zero,
                Some(toml::Value::String(s)) if s == "pattern" => Fill::Pattern,
                Some(toml::Value::Integer(b)) if (0..=255).contains(b) => Fill::Byte(*b as u8),
                Some(other) => {
                    return Err(self.err(span, format!(
                        "region {:?}: fill {other} is not \"zero\", \"pattern\" or a byte 0..=255",
                        r.name
                    )));
                }
            };
            let other_pd = match r.pd.as_str() {
                "main" => false,
                "other" => true,
                p => {
                    return Err(self.err(
                        span,
                        format!("region {:?}: pd {p:?} is not \"main\" or \"other\"", r.name),
                    ));
                }
            };
            let access = self.access(&r.access, span.clone(), &format!("region {:?}", r.name))?;
            if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
                && !access.contains(Access::LOCAL_WRITE)
            {
                return Err(self.err(
                    span,
                    format!(
                        "region {:?}: remote_write and remote_atomic need local_write too (as \
                         ibv_reg_mr)",
                        r.name
                    ),
                ));
            }
            regions.push(Region {
                name: r.name.clone(),
                size: r.size as usize,
                access,
                fill,
                other_pd,
            });
        }
        // Names a step gives, looked up; `step` counts from 0.
        let find_qp = |name: &str,
                       span: Option<Range<usize>>,
                       allow_peer: bool,
                       step: usize|
         -> Result<QpRef, ScenarioError> {
            let (base, peer) = match name.strip_suffix(".peer") {
                Some(b) => (b, true),
                None => (name, false),
            };
            if peer && !allow_peer {
                return Err(self.err(
                    span,
                    format!(
                        "step {}: {name:?}: this step needs a requester QP, not a peer",
                        step + 1
                    ),
                ));
            }
            qps.iter()
                .position(|q| q.name == base)
                .map(|index| QpRef { index, peer })
                .ok_or_else(|| self.err(span, format!("step {}: no qp named {name:?}", step + 1)))
        };
        let find_region =
            |name: &str, span: Option<Range<usize>>, step: usize| -> Result<usize, ScenarioError> {
                regions.iter().position(|r| r.name == name).ok_or_else(|| {
                    self.err(span, format!("step {}: no region named {name:?}", step + 1))
                })
            };
        if raw.step.is_empty() {
            return Err(self.err(None, "a scenario needs at least one [[step]]".into()));
        }
        let mut steps = Vec::new();
        // What earlier steps did: the step that deregistered each region, and what each
        // peer's receive queue may hold at most.
        let mut deregistered: Vec<Option<usize>> = vec![None; regions.len()];
        let mut recv_bounds = vec![RecvBound::default(); qps.len()];
        let mut total = 0u64;
        for (n, s) in raw.step.iter().enumerate() {
            let span = Some(s.span());
            let s = s.get_ref();
            let set = [
                s.post.is_some(),
                s.recv.is_some(),
                s.poll.is_some(),
                s.confirm.is_some(),
                s.drain.is_some(),
                s.dereg.is_some(),
                s.to_error.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if set != 1 {
                return Err(self.err(span, format!(
                    "step {}: give exactly one of post, recv, poll, confirm, drain, dereg, to_error ({set} given)",
                    n + 1
                )));
            }
            let here = |m: String| self.err(span.clone(), format!("step {}: {m}", n + 1));
            let action = if let Some(p) = &s.post {
                let qp = find_qp(&p.qp, span.clone(), false, n)?.index;
                let op = match p.op.as_str() {
                    "write" => Op::Write,
                    "write_imm" => Op::WriteImm,
                    "read" => Op::Read,
                    "send" => Op::Send,
                    "send_imm" => Op::SendImm,
                    o => {
                        return Err(here(format!(
                            "unknown op {o:?}: expected write, write_imm, read, send or send_imm"
                        )));
                    }
                };
                if p.count == 0 || p.count > MAX_COUNT {
                    return Err(here(format!(
                        "count {} is out of range 1..={MAX_COUNT}",
                        p.count
                    )));
                }
                total += p.count;
                if total > MAX_TOTAL {
                    return Err(here(format!(
                        "the steps so far post {total} work requests and receives: a scenario \
                         posts at most {MAX_TOTAL}"
                    )));
                }
                if p.size > MAX_REGION {
                    return Err(here(format!(
                        "size {} is larger than any region ({MAX_REGION})",
                        p.size
                    )));
                }
                let stride = p.stride.unwrap_or(p.size);
                let local_offset = p.local_offset.unwrap_or(0);
                let remote_offset = p.remote_offset.unwrap_or(0);
                // Bounded like sizes, region or not, so that no offset arithmetic overflows.
                for (field, value) in [
                    ("local_offset", local_offset),
                    ("remote_offset", remote_offset),
                    ("stride", stride),
                ] {
                    if value > MAX_REGION {
                        return Err(here(format!(
                            "{field} {value} is larger than any region ({MAX_REGION})"
                        )));
                    }
                }
                let local = match &p.local {
                    Some(l) => Some(find_region(l, span.clone(), n)?),
                    None if p.size > 0 => {
                        return Err(here(format!(
                            "a {} of {} bytes needs a local region",
                            p.op, p.size
                        )));
                    }
                    None => None,
                };
                let needs_remote = matches!(op, Op::Write | Op::WriteImm | Op::Read);
                let remote = match (&p.remote, needs_remote) {
                    (Some(r), true) => Some(find_region(r, span.clone(), n)?),
                    (Some(_), false) => {
                        return Err(here(format!("a {} has no remote region", p.op)));
                    }
                    (None, true) => return Err(here(format!("a {} needs a remote region", p.op))),
                    (None, false) => None,
                };
                // Fields that would change nothing are refused, not ignored.
                if p.local_offset.is_some() && local.is_none() {
                    return Err(here("local_offset needs a local region".into()));
                }
                if p.remote_offset.is_some() && remote.is_none() {
                    return Err(here(format!(
                        "remote_offset: a {} has no remote region",
                        p.op
                    )));
                }
                if p.stride.is_some() && local.is_none() && remote.is_none() {
                    return Err(here(
                        "stride needs a local or remote region (it moves their offsets)".into(),
                    ));
                }
                if p.imm.is_some() && !matches!(op, Op::WriteImm | Op::SendImm) {
                    return Err(here(format!(
                        "imm: a {} carries no immediate data (write_imm and send_imm do)",
                        p.op
                    )));
                }
                if p.fault_at.is_some() && p.fault.is_none() {
                    return Err(here("fault_at needs a fault".into()));
                }
                if let Some(l) = local.filter(|_| p.inline)
                    && let Some(k) = deregistered[l]
                {
                    return Err(here(format!(
                        "inline data from region {:?}, which step {k} deregistered",
                        regions[l].name
                    )));
                }
                let signal = match p.signal.as_str() {
                    "auto" => SignalChoice::Auto,
                    "force" => SignalChoice::Force,
                    "last" => SignalChoice::Last,
                    o => return Err(here(format!("signal {o:?} is not auto, force or last"))),
                };
                if p.inline && (op == Op::Read || p.size > 64) {
                    return Err(here(
                        "inline data is for WRITEs and SENDs of at most 64 bytes".into(),
                    ));
                }
                let fault = match p.fault.as_deref() {
                    None => None,
                    Some(f) => {
                        let kind = match f {
                            "bad_rkey" => Fault::BadRkey,
                            "bad_lkey" => Fault::BadLkey,
                            "out_of_bounds" => Fault::OutOfBounds,
                            o => {
                                return Err(here(format!(
                                    "unknown fault {o:?}: expected bad_rkey, bad_lkey or out_of_bounds"
                                )));
                            }
                        };
                        if p.size == 0 {
                            return Err(here(format!(
                                "fault {f:?} needs a post of more than 0 bytes: a zero-length transfer uses no key and touches no memory"
                            )));
                        }
                        if kind == Fault::OutOfBounds && p.size < 2 {
                            return Err(here(
                                "fault \"out_of_bounds\" needs a post of 2 bytes or more: one byte cannot start in the region and end beyond it".into(),
                            ));
                        }
                        let fault_at = p.fault_at.unwrap_or(1);
                        if fault_at == 0 || fault_at > p.count {
                            return Err(here(format!(
                                "fault_at {fault_at} names no work request of the {}",
                                p.count
                            )));
                        }
                        if kind != Fault::BadLkey && remote.is_none() {
                            return Err(here(format!("fault {f:?} needs a remote region")));
                        }
                        if kind == Fault::BadLkey && (local.is_none() || p.inline) {
                            return Err(here(
                                "fault \"bad_lkey\" needs a local region, not inline data".into(),
                            ));
                        }
                        Some((kind, fault_at))
                    }
                };
                if p.stride.is_some() && p.count == 1 {
                    return Err(here(
                        "stride with count 1: it moves the offsets of later work requests, and there are none"
                            .into(),
                    ));
                }
                if p.size == 0 && p.inline {
                    return Err(here(
                        "inline with size 0: a zero-length transfer carries no data".into(),
                    ));
                }
                // Every work request's bytes must lie in its regions (faults aside).
                let last = p.count - 1;
                if let Some(l) = local {
                    let end = local_offset + last * stride + p.size;
                    if end > regions[l].size as u64 {
                        return Err(here(format!(
                            "the local bytes end at {end}, beyond region {:?} ({} bytes)",
                            regions[l].name, regions[l].size
                        )));
                    }
                }
                if let Some(r) = remote {
                    let end = remote_offset + last * stride + p.size;
                    if end > regions[r].size as u64 {
                        return Err(here(format!(
                            "the remote bytes end at {end}, beyond region {:?} ({} bytes)",
                            regions[r].name, regions[r].size
                        )));
                    }
                }
                let cannot_use =
                    |i: usize, need: Access| unusable(&regions[i], deregistered[i], need);
                let bound = &mut recv_bounds[qp];
                // Without a fault, a request may still fail. At the peer, which goes to the
                // error state and flushes its receives: a remote region it may not touch, a
                // QP that does not allow it (at any length: rxe checks that first), or a
                // SEND longer than its receive or into one the NIC cannot write. Here: a
                // local region it cannot use. A zero-length transfer uses no key. Taken as
                // possible errors, they loosen the bounds.
                let remote_need = match op {
                    Op::Write | Op::WriteImm => Some(Access::REMOTE_WRITE),
                    Op::Read => Some(Access::REMOTE_READ),
                    Op::Send | Op::SendImm => None,
                };
                let fails_at_peer = remote_need.is_some_and(|need| {
                    !qps[qp].peer_access.contains(need)
                        || (p.size > 0 && remote.is_some_and(|r| cannot_use(r, need)))
                });
                let local_need = match op {
                    Op::Read => Access::LOCAL_WRITE,
                    _ => Access::empty(),
                };
                // A local region the NIC cannot use fails the first work request on this
                // side (every one uses the region): none reaches the peer.
                let fails_here =
                    p.size > 0 && !p.inline && local.is_some_and(|l| cannot_use(l, local_need));
                // SENDs and WRITEs with immediate use the peer's receives, in order, unless
                // the QP is in the error state (they are flushed) or drained (they are
                // refused): up to a bad local key or a local region it cannot use, which
                // fail on this side; a bad remote key or address fails at the peer, which
                // goes to the error state too and flushes its receives.
                let takes_posts = !bound.requester_error && !bound.drained;
                if matches!(op, Op::Send | Op::SendImm | Op::WriteImm) && takes_posts {
                    let n = match fault {
                        _ if fails_here => 0,
                        Some((Fault::BadLkey, at)) => at - 1,
                        _ => p.count,
                    };
                    bound.consumers += n;
                    let writes = match op {
                        Op::Send | Op::SendImm => Some(p.size),
                        _ => None,
                    };
                    if n > 0 {
                        bound.waiting_sends.push_back((writes, n));
                    }
                }
                // A drained queue refuses the posts: nothing of them reaches a NIC.
                match fault {
                    _ if bound.drained => {}
                    Some((Fault::BadLkey, _)) => bound.requester_error = true,
                    Some(_) => {
                        bound.requester_error = true;
                        bound.flushed = true;
                    }
                    None => {
                        if fails_at_peer {
                            bound.flushed = true;
                        }
                        if fails_at_peer || fails_here {
                            bound.requester_error = true;
                        }
                    }
                }
                bound.match_receives(|i| cannot_use(i, Access::LOCAL_WRITE));
                Action::Post(Post {
                    qp,
                    op,
                    local,
                    remote,
                    size: p.size,
                    count: p.count,
                    local_offset,
                    remote_offset,
                    stride,
                    signal,
                    inline: p.inline,
                    imm: p.imm.unwrap_or(0),
                    fault,
                })
            } else if let Some(r) = &s.recv {
                let qp = find_qp(&r.qp, span.clone(), true, n)?;
                if !qp.peer {
                    return Err(here(format!(
                        "receives are posted on a peer (\"{}.peer\"), not on {:?}",
                        r.qp, r.qp
                    )));
                }
                if r.count == 0 || r.count > MAX_COUNT {
                    return Err(here(format!(
                        "count {} is out of range 1..={MAX_COUNT}",
                        r.count
                    )));
                }
                total += r.count;
                if total > MAX_TOTAL {
                    return Err(here(format!(
                        "the steps so far post {total} work requests and receives: a scenario \
                         posts at most {MAX_TOTAL}"
                    )));
                }
                let offset = r.offset.unwrap_or(0);
                for (field, value) in [("size", r.size), ("offset", offset)] {
                    if value > MAX_REGION {
                        return Err(here(format!(
                            "{field} {value} is larger than any region ({MAX_REGION})"
                        )));
                    }
                }
                let region = match &r.region {
                    Some(name) => {
                        let i = find_region(name, span.clone(), n)?;
                        let end = offset + r.count * r.size;
                        if end > regions[i].size as u64 {
                            return Err(here(format!(
                                "the receives end at {end}, beyond region {name:?} ({} bytes)",
                                regions[i].size
                            )));
                        }
                        Some(i)
                    }
                    None if r.size > 0 => {
                        return Err(here("receives of more than 0 bytes need a region".into()));
                    }
                    None if r.offset.is_some() => {
                        return Err(here("offset needs a region".into()));
                    }
                    None => None,
                };
                let bound = &mut recv_bounds[qp.index];
                bound.posted += r.count;
                bound.waiting_recvs.push_back((r.size, region, r.count));
                bound.match_receives(|i| {
                    unusable(&regions[i], deregistered[i], Access::LOCAL_WRITE)
                });
                let depth = qps[qp.index].peer_depth;
                if !bound.flushed && bound.posted.saturating_sub(bound.consumers) > u64::from(depth)
                {
                    return Err(here(format!(
                        "{} receives posted on {:?}, at most {} of them used by earlier SENDs \
                         and WRITEs with immediate: more would wait than its peer_depth of \
                         {depth}",
                        bound.posted, r.qp, bound.consumers
                    )));
                }
                Action::Recv(Recv {
                    qp,
                    region,
                    size: r.size,
                    count: r.count,
                    offset,
                })
            } else if let Some(p) = &s.poll {
                match p {
                    PollStep::Word(w) if w == "idle" => {
                        unused_receives(&recv_bounds, &qps).map_err(here)?;
                        Action::PollIdle
                    }
                    PollStep::Word(w) => {
                        return Err(here(format!(
                            "poll = {w:?}: expected \"idle\" or {{ cqes = N }}"
                        )));
                    }
                    PollStep::Count { cqes: 0 } => {
                        return Err(here(
                            "poll = { cqes = 0 }: waits for nothing (N is at least 1)".to_string(),
                        ));
                    }
                    PollStep::Count { cqes } => Action::PollCqes(*cqes),
                }
            } else if let Some(q) = &s.confirm {
                Action::Confirm(find_qp(q, span.clone(), false, n)?.index)
            } else if let Some(q) = &s.drain {
                let qp = find_qp(q, span.clone(), false, n)?.index;
                // A drain waits for its own queue pair only.
                unused_receives(&recv_bounds[qp..=qp], &qps[qp..=qp]).map_err(here)?;
                recv_bounds[qp].drained = true;
                Action::Drain(qp)
            } else if let Some(r) = &s.dereg {
                let i = find_region(r, span.clone(), n)?;
                if let Some(k) = deregistered[i] {
                    return Err(here(format!("region {r:?} was deregistered by step {k}")));
                }
                deregistered[i] = Some(n + 1);
                Action::Dereg(i)
            } else if let Some(q) = &s.to_error {
                let qp = find_qp(q, span.clone(), true, n)?;
                // The peer in the error state flushes its receives; the QP in the error state
                // flushes the SENDs it posts after, which use none. (Either one in the error
                // state also ends, with an error, a SEND waiting for a receive.)
                let bound = &mut recv_bounds[qp.index];
                match qp.peer {
                    true => bound.flushed = true,
                    false => bound.requester_error = true,
                }
                Action::ToError(qp)
            } else {
                unreachable!("exactly one field is set")
            };
            steps.push(action);
        }
        let differs_span = raw.differs.as_ref().map(Spanned::span);
        let differs_decl = raw.differs.as_ref().map(Spanned::get_ref);
        if differs_decl.is_some_and(BTreeMap::is_empty) {
            return Err(self.err(
                differs_span,
                "[differs] is empty: give differs.rxe, why rxe differs, with [expect.rxe]".into(),
            ));
        }
        let mut differs = BTreeMap::new();
        for (key, why) in differs_decl.into_iter().flatten() {
            let span = Some(why.span());
            if key != "rxe" {
                return Err(self.err(
                    span,
                    format!("differs.{key}: the only provider that may differ is rxe"),
                ));
            }
            if why.get_ref().trim().is_empty() {
                return Err(self.err(
                    span,
                    format!("differs.{key} is empty: it must say why {key} differs"),
                ));
            }
            differs.insert(key.clone(), why.get_ref().clone());
        }
        let has_expect_rxe = raw
            .expect
            .as_ref()
            .is_some_and(|e| e.get_ref().rxe.is_some());
        if differs.contains_key("rxe") && !has_expect_rxe {
            return Err(self.err(
                differs_span,
                "differs.rxe says why [expect.rxe] differs, but there is no [expect.rxe]".into(),
            ));
        }
        let mut expect = Expect::default();
        let mut expect_rxe = None;
        if let Some(e) = &raw.expect {
            let e = e.get_ref();
            self.expectations(e, &qps, &regions, &deregistered, "expect")?;
            if let Some(r) = &e.rxe {
                let span = Some(r.span());
                let r = r.get_ref();
                if let Some(inner) = &r.rxe {
                    return Err(
                        self.err(Some(inner.span()), "expect.rxe.rxe: one level only".into())
                    );
                }
                if !differs.contains_key("rxe") {
                    return Err(self.err(
                        span,
                        "[expect.rxe] needs differs.rxe to say why rxe differs".into(),
                    ));
                }
                self.expectations(r, &qps, &regions, &deregistered, "expect.rxe")?;
                // The fields `[expect.rxe]` gives replace `[expect]`'s.
                let (r, e) = (r.plain(), e.plain());
                expect_rxe = Some(Expect {
                    cqes: r.cqes.or(e.cqes),
                    outcomes: r.outcomes.or(e.outcomes),
                    digests: r.digests.or(e.digests),
                    events: r.events.or(e.events),
                });
            }
            expect = e.plain();
        }
        Ok(Scenario {
            name: name.to_string(),
            description: raw.description.get_ref().clone(),
            personality,
            cqs,
            qps,
            regions,
            steps,
            expect,
            expect_rxe,
            differs,
        })
    }

    fn expectations(
        &self,
        e: &ExpectDecl,
        qps: &[Qp],
        regions: &[Region],
        // The step that deregistered each region, if one did.
        deregistered: &[Option<usize>],
        what: &str,
    ) -> Result<(), ScenarioError> {
        let names: HashSet<String> = qps
            .iter()
            .flat_map(|q| [q.name.clone(), format!("{}.peer", q.name)])
            .collect();
        for c in e.cqes.iter().flatten() {
            let span = Some(c.span());
            let c = c.get_ref();
            if !names.contains(&c.qp) {
                return Err(self.err(span, format!("{what}.cqes: no qp named {:?}", c.qp)));
            }
            if !WcStatus::ALL.iter().any(|s| s.short_name() == c.status) {
                return Err(self.err(
                    span.clone(),
                    format!("{what}.cqes: unknown status {:?}", c.status),
                ));
            }
            if let Some(o) = &c.opcode
                && !WcOpcode::ALL.iter().any(|x| x.short_name() == o)
            {
                let known: Vec<&str> = WcOpcode::ALL.iter().map(|x| x.short_name()).collect();
                return Err(self.err(
                    span.clone(),
                    format!(
                        "{what}.cqes: unknown opcode {o:?}: expected one of {}",
                        known.join(", ")
                    ),
                ));
            }
            // What the trace shows of a completion: an opcode only in a success (elsewhere
            // it is undefined), a byte_len only where it is defined.
            let this = || {
                let opcode = c
                    .opcode
                    .as_deref()
                    .map(|o| format!(" {o}"))
                    .unwrap_or_default();
                format!("a wr_id {} {}{opcode} completion", c.wr_id, c.status)
            };
            if c.opcode.is_some() && c.status != "success" {
                return Err(self.err(
                    span.clone(),
                    format!(
                        "{what}.cqes: opcode of {}: a completion that is not a success has no \
                         opcode (ibv_poll_cq(3)), and the trace shows none",
                        this()
                    ),
                ));
            }
            let measured = [
                WcOpcode::Recv,
                WcOpcode::RecvRdmaWithImm,
                WcOpcode::RdmaRead,
            ]
            .map(|o| o.short_name());
            let defined =
                c.status == "success" && c.opcode.as_deref().is_some_and(|o| measured.contains(&o));
            if c.byte_len.is_some() && !defined {
                return Err(self.err(
                    span.clone(),
                    format!(
                        "{what}.cqes: byte_len of {}: byte_len is defined only in successful \
                         completions of receives and READs (give status = \"success\" and \
                         opcode = \"recv\", \"recv_rdma_with_imm\" or \"rdma_read\")",
                        this()
                    ),
                ));
            }
            // (An opcode comes only with a success: checked above.)
            let receive = ["recv", "recv_rdma_with_imm"];
            let carries_imm = c.opcode.as_deref().is_some_and(|o| receive.contains(&o));
            if c.imm.is_some() && !carries_imm {
                return Err(self.err(
                    span.clone(),
                    format!(
                        "{what}.cqes: imm of {}: immediate data comes only in successful \
                         completions of receives (give status = \"success\" and opcode = \
                         \"recv\" or \"recv_rdma_with_imm\")",
                        this()
                    ),
                ));
            }
        }
        for (q, list) in e.outcomes.iter().flatten() {
            if !qps.iter().any(|x| &x.name == q) {
                return Err(self.err(
                    Some(list.span()),
                    format!("{what}.outcomes: no qp named {q:?}"),
                ));
            }
            let mut ranges = Vec::new();
            for item in list.get_ref() {
                let span = item.span();
                let item = item.get_ref();
                let (first, last, ..) = parse_outcome_range(item).map_err(|m| {
                    self.err(Some(span.clone()), format!("{what}.outcomes.{q}: {m}"))
                })?;
                ranges.push((first, last, item, span));
            }
            // Each work request has one outcome: ranges must not overlap. Of two that do,
            // the later in the file is at fault.
            ranges.sort_by(|x, y| (x.0, x.1, x.2).cmp(&(y.0, y.1, y.2)));
            for pair in ranges.windows(2) {
                let ((_, last, a, a_at), (first, _, b, b_at)) = (&pair[0], &pair[1]);
                if first <= last {
                    let later = if a_at.start > b_at.start { a_at } else { b_at };
                    return Err(self.err(
                        Some(later.clone()),
                        format!(
                            "{what}.outcomes.{q}: {a:?} and {b:?} overlap (work request {first} \
                             is in both)"
                        ),
                    ));
                }
            }
        }
        for (r, d) in e.digests.iter().flatten() {
            let span = Some(d.span());
            let d = d.get_ref();
            let Some(i) = regions.iter().position(|x| &x.name == r) else {
                return Err(self.err(
                    span.clone(),
                    format!("{what}.digests: no region named {r:?}"),
                ));
            };
            if let Some(k) = deregistered[i] {
                return Err(self.err(
                    span.clone(),
                    format!(
                        "{what}.digests.{r}: step {k} deregisters the region, so nothing is left \
                         to read at the end"
                    ),
                ));
            }
            if d.len() != 16 || !d.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(self.err(
                    span.clone(),
                    format!("{what}.digests.{r}: {d:?} is not 16 hex digits"),
                ));
            }
        }
        for event in e.events.iter().flatten() {
            let span = Some(event.span());
            let event = event.get_ref();
            let (kind, qp) = match event.split_once(':') {
                Some((k, q)) => (k, Some(q)),
                None => (event.as_str(), None),
            };
            let needs_qp = match kind {
                "qp_fatal" | "qp_access_err" | "qp_req_err" => true,
                "cq_err" | "port_active" | "port_err" | "other" => false,
                _ => {
                    return Err(self.err(
                        span.clone(),
                        format!(
                            "{what}.events: {event:?}: unknown event type {kind:?}: expected \
                             qp_fatal, qp_access_err or qp_req_err (as \"type:qp\"), cq_err, \
                             port_active, port_err or other"
                        ),
                    ));
                }
            };
            match qp {
                Some(q) if !needs_qp => {
                    return Err(self.err(
                        span.clone(),
                        format!("{what}.events: {event:?}: {kind} names no qp (drop \":{q}\")"),
                    ));
                }
                Some(q) if !names.contains(q) => {
                    return Err(self.err(
                        span.clone(),
                        format!("{what}.events: {event:?}: no qp named {q:?}"),
                    ));
                }
                None if needs_qp => {
                    return Err(self.err(
                        span.clone(),
                        format!("{what}.events: {event:?}: name the qp, as \"{kind}:a\""),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn err(&self, span: Option<Range<usize>>, message: String) -> ScenarioError {
        (self.at)(span, message)
    }

    fn name_ok(
        &self,
        name: &str,
        span: Option<Range<usize>>,
        what: &str,
    ) -> Result<(), ScenarioError> {
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && name.len() <= 32;
        if ok {
            Ok(())
        } else {
            Err(self.err(
                span,
                format!("{what} name {name:?}: use 1 to 32 letters, digits, '_' or '-'"),
            ))
        }
    }

    /// The access flags `names` give; `what` names the list in an error.
    fn access(
        &self,
        names: &[String],
        span: Option<Range<usize>>,
        what: &str,
    ) -> Result<Access, ScenarioError> {
        let mut a = Access::empty();
        for n in names {
            a |= match n.as_str() {
                "local_write" => Access::LOCAL_WRITE,
                "remote_write" => Access::REMOTE_WRITE,
                "remote_read" => Access::REMOTE_READ,
                "remote_atomic" => Access::REMOTE_ATOMIC,
                o => {
                    return Err(self.err(span, format!(
                        "{what}: unknown access {o:?}: expected local_write, remote_write, remote_read or remote_atomic"
                    )));
                }
            };
        }
        Ok(a)
    }
}

/// What a peer's receive queue holds at most, as far as the file tells: the receives posted
/// on it less the SENDs and WRITEs with immediate posted to it (each uses one at most; those
/// posted once the QP may be in the error state are flushed and use none). Once the peer
/// may be in the error state, its receives may be flushed: no bound.
#[derive(Debug, Clone, Default)]
struct RecvBound {
    posted: u64,
    consumers: u64,
    /// The peer may be in the error state (its receives flushed).
    flushed: bool,
    /// The QP may be in the error state (its later SENDs flushed).
    requester_error: bool,
    /// The QP's queue was drained: it refuses every later post.
    drained: bool,
    /// SENDs and WRITEs with immediate no receive was matched with yet, in order: (the
    /// bytes a SEND writes, `None` for a WRITE with immediate, which writes none into
    /// its receive; how many).
    waiting_sends: VecDeque<(Option<u64>, u64)>,
    /// Receives no SEND was matched with yet, in order: (size, region, how many).
    waiting_recvs: VecDeque<(u64, Option<usize>, u64)>,
}

/// Whether the NIC cannot use `region` for `need`: its access, the other protection
/// domain, or deregistered (by the step `deregistered`).
fn unusable(region: &Region, deregistered: Option<usize>, need: Access) -> bool {
    !region.access.contains(need) || region.other_pd || deregistered.is_some()
}

impl RecvBound {
    /// Matches waiting SENDs with waiting receives, in order, as the NIC will: a SEND
    /// longer than its receive, or writing into a region the NIC cannot write
    /// (`unwritable`), fails at the peer, which goes to the error state and flushes the
    /// rest.
    fn match_receives(&mut self, unwritable: impl Fn(usize) -> bool) {
        while !self.flushed {
            let (Some(send), Some(recv)) = (
                self.waiting_sends.front_mut(),
                self.waiting_recvs.front_mut(),
            ) else {
                return;
            };
            let fails = send
                .0
                .is_some_and(|len| len > 0 && (len > recv.0 || recv.1.is_some_and(&unwritable)));
            if fails {
                self.flushed = true;
                self.requester_error = true;
                return;
            }
            let n = send.1.min(recv.2);
            send.1 -= n;
            recv.2 -= n;
            if send.1 == 0 {
                self.waiting_sends.pop_front();
            }
            if recv.2 == 0 {
                self.waiting_recvs.pop_front();
            }
        }
    }
}

/// A poll until idle (`poll = "idle"`, or `drain` for its queue pair's peer) waits for
/// every receive to complete: one that no SEND or WRITE with immediate posted before uses,
/// and no error flushes, never does. The error names the first such peer.
fn unused_receives(bounds: &[RecvBound], qps: &[Qp]) -> Result<(), String> {
    for (b, q) in bounds.iter().zip(qps) {
        if !b.flushed && b.posted > b.consumers {
            return Err(format!(
                "{} of the {} receives posted on \"{}.peer\" are used by no SEND or WRITE \
                 with immediate posted before: this poll would wait for them for ever (post \
                 the SENDs first, or move the peer to the error state, to_error = \
                 \"{}.peer\", which flushes them)",
                b.posted - b.consumers,
                b.posted,
                q.name,
                q.name
            ));
        }
    }
    Ok(())
}

/// One item of `expect.outcomes`: `"1-2 completed"`, `"3 failed:rem_access_err"`,
/// `"4-8 flushed"`. Returns (first, last, outcome, status).
pub fn parse_outcome_range(item: &str) -> Result<(u64, u64, String, Option<String>), String> {
    let bad = || {
        format!(
            "{item:?} is not like \"1-2 completed\", \"3 failed:rem_access_err\" or \"4-8 flushed\""
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
        ("completed" | "flushed", None) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
description = "two WRITEs"
[[qp]]
name = "a"
[[region]]
name = "src"
size = 128
fill = "pattern"
[[region]]
name = "dst"
size = 128
access = ["local_write", "remote_write"]
[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 2 }
[[step]]
poll = "idle"
"#;

    fn error(text: &str) -> String {
        parse("x.toml", "x", text).unwrap_err().to_string()
    }

    #[test]
    fn a_valid_scenario_parses() {
        let s = parse("x.toml", "x", OK).unwrap();
        assert_eq!(s.steps.len(), 2);
        assert_eq!(s.cqs.len(), 2, "a send CQ and a peer CQ of their own");
        assert_eq!(
            s.qp_name(QpRef {
                index: 0,
                peer: true
            }),
            "a.peer"
        );
    }

    /// Policy names as the library reads them: spaces around and case aside, `manual` too.
    #[test]
    fn policy_names_take_any_case() {
        for (name, want) in [
            (" MANUAL", Policy::Never),
            ("Manual", Policy::Never),
            ("never", Policy::Never),
            ("ALWAYS ", Policy::Always),
            ("Every:8", Policy::Every(8)),
        ] {
            let text = OK.replace("name = \"a\"", &format!("name = \"a\"\npolicy = {name:?}"));
            let s = parse("x.toml", "x", &text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s.qps[0].policy, want, "{name}");
        }
        let e = error(&OK.replace("name = \"a\"", "name = \"a\"\npolicy = \"manually\""));
        assert!(
            e.contains("unknown policy \"manually\": expected every:N, always, never or manual"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_file_line_and_problem() {
        let e = error(&OK.replace("size = 64, count = 2", "size = 64, count = 3"));
        assert!(e.starts_with("x.toml:13:1: step 1:"), "{e}");
        assert!(e.contains("beyond region \"src\""), "{e}");
        let e = error(&OK.replace("remote = \"dst\"", "remote = \"dts\""));
        assert!(
            e.starts_with("x.toml:13:1: step 1: no region named \"dts\""),
            "{e}"
        );
        let e = error(&OK.replace("fill = \"pattern\"", "fill = \"pattern\"\ncolour = 3"));
        assert!(
            e.starts_with("x.toml:9:1:") && e.contains("unknown field `colour`"),
            "{e}"
        );
        let e = error(&OK.replace("op = \"write\"", "op = \"swap\""));
        assert!(e.contains("unknown op \"swap\""), "{e}");
        let e = error("description = 3");
        assert!(e.starts_with("x.toml:1:"), "{e}");
        let e = error(&OK.replace("size = 128\nfill", "size = 0\nfill"));
        assert!(e.contains("size 0 is out of range"), "{e}");
        for field in ["rnr_retry", "retry_cnt"] {
            let e = error(&OK.replace("name = \"a\"", &format!("name = \"a\"\n{field} = 8")));
            assert!(
                e.contains(&format!("qp \"a\": {field} 8 is out of range 0..=7")),
                "{e}"
            );
            let s = parse(
                "x.toml",
                "x",
                &OK.replace("name = \"a\"", &format!("name = \"a\"\n{field} = 3")),
            )
            .unwrap();
            let q = &s.qps[0];
            assert_eq!(
                (q.rnr_retry, q.retry_cnt),
                if field == "rnr_retry" { (3, 7) } else { (7, 3) }
            );
        }
        let e = error(&OK.replace("poll = \"idle\"", "poll = \"soon\""));
        assert!(e.contains("expected \"idle\""), "{e}");
        let e = error(&format!("{OK}\n[[step]]\nconfirm = \"a\"\ndrain = \"a\"\n"));
        assert!(e.contains("exactly one of"), "{e}");
        // Registration rules are checked with the file, not when the region is registered.
        let e = error(&OK.replace("[\"local_write\", \"remote_write\"]", "[\"remote_write\"]"));
        assert!(
            e.starts_with(
                "x.toml:9:1: region \"dst\": remote_write and remote_atomic need local_write too"
            ),
            "{e}"
        );
    }

    /// `OK` with `extra` after the QP's name.
    fn qp_with(extra: &str) -> String {
        OK.replace("name = \"a\"", &format!("name = \"a\"\n{extra}"))
    }

    /// `OK` with its post's `size = 64, count = 2` replaced.
    fn post_with(fields: &str) -> String {
        OK.replace("size = 64, count = 2", fields)
    }

    /// Asserts that `text` parses, naming `what` if not.
    fn parses(what: &str, text: &str) -> Scenario {
        parse("x.toml", "x", text).unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    /// Asserts that `text` is refused with an error containing `problem`.
    fn refused(what: &str, text: &str, problem: &str) {
        match parse("x.toml", "x", text) {
            Ok(_) => panic!("{what}: taken"),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(problem), "{what}: {e}\nshould say: {problem}");
            }
        }
    }

    #[test]
    fn each_limit_is_taken_at_its_bound_and_refused_one_beyond() {
        let cq = |size: u64| {
            format!(
                "{}\n[[cq]]\nname = \"c\"\nsize = {size}\n",
                qp_with("send_cq = \"c\"")
            )
        };
        parses("cq 1048576", &cq(1 << 20));
        refused(
            "cq 1048577",
            &cq((1 << 20) + 1),
            "cq \"c\": size 1048577 is out of range 1..=1048576",
        );
        for field in ["depth", "peer_depth"] {
            parses(field, &qp_with(&format!("{field} = 32768")));
            for bad in [0, 32769] {
                refused(
                    field,
                    &qp_with(&format!("{field} = {bad}")),
                    &format!("qp \"a\": {field} {bad} is out of range 1..=32768"),
                );
            }
        }
        let src = |size: u64| OK.replace("size = 128\nfill", &format!("size = {size}\nfill"));
        parses("region 64 MiB", &src(MAX_REGION));
        refused(
            "region 64 MiB + 1",
            &src(MAX_REGION + 1),
            "region \"src\": size 67108865 is out of range 1..=67108864",
        );
        // OK's two regions take 256 bytes; fifteen of 64 MiB and one of `last` bytes more.
        let regions = |last: u64| {
            let mut text = OK.to_string();
            for i in 0..15 {
                text.push_str(&format!(
                    "\n[[region]]\nname = \"big{i}\"\nsize = {MAX_REGION}\n"
                ));
            }
            text + &format!("\n[[region]]\nname = \"last\"\nsize = {last}\n")
        };
        parses("regions of 1 GiB", &regions(MAX_REGION - 256));
        refused(
            "regions of 1 GiB + 1",
            &regions(MAX_REGION - 255),
            "region \"last\": the regions take more than 1073741824 bytes together",
        );
        // Steps posting `counts` zero-length WRITEs after OK's two.
        let posts = |counts: &[u64]| {
            let mut text = OK.to_string();
            for count in counts {
                text.push_str(&format!(
                    "\n[[step]]\npost = {{ qp = \"a\", op = \"write\", remote = \"dst\", count = {count} }}\n"
                ));
            }
            text
        };
        parses("count 2^20", &posts(&[MAX_COUNT]));
        refused(
            "count 2^20 + 1",
            &posts(&[MAX_COUNT + 1]),
            "step 3: count 1048577 is out of range 1..=1048576",
        );
        parses("2^21 in all", &posts(&[MAX_COUNT, MAX_COUNT - 2]));
        refused(
            "2^21 + 1 in all",
            &posts(&[MAX_COUNT, MAX_COUNT - 1]),
            "step 4: the steps so far post 2097153 work requests and receives: a scenario \
             posts at most 2097152",
        );
        // Receives count too: 32768 of them, after OK's two WRITEs, then WRITEs up to one
        // beyond the total.
        let recv = format!(
            "{}\n[[step]]\nrecv = {{ qp = \"a.peer\", count = 32768 }}\n",
            qp_with("peer_depth = 32768")
        );
        let writes = |count: u64| {
            format!(
                "\n[[step]]\npost = {{ qp = \"a\", op = \"write\", remote = \"dst\", count = {count} }}\n"
            )
        };
        let last = MAX_TOTAL - 2 - 32768 - MAX_COUNT;
        parses(
            "receives in all",
            &(recv.clone() + &writes(MAX_COUNT) + &writes(last)),
        );
        refused(
            "receives in all, and one more",
            &(recv + &writes(MAX_COUNT) + &writes(last + 1)),
            "step 5: the steps so far post 2097153 work requests and receives",
        );
        refused(
            "size 64 MiB + 1",
            &post_with("size = 67108865, count = 1"),
            "step 1: size 67108865 is larger than any region (67108864)",
        );
        for field in ["stride", "local_offset", "remote_offset"] {
            refused(
                field,
                &post_with(&format!("size = 64, count = 2, {field} = 67108865")),
                &format!("step 1: {field} 67108865 is larger than any region (67108864)"),
            );
        }
        // At the bound, the region is what is too small.
        refused(
            "stride 64 MiB",
            &post_with("size = 64, count = 2, stride = 67108864"),
            "step 1: the local bytes end at 67108928, beyond region \"src\" (128 bytes)",
        );
        // The two WRITEs end exactly at the end of both 128-byte regions; one byte on is
        // beyond.
        refused(
            "local_offset 1",
            &post_with("size = 64, count = 2, local_offset = 1"),
            "step 1: the local bytes end at 129, beyond region \"src\" (128 bytes)",
        );
        refused(
            "remote_offset 1",
            &post_with("size = 64, count = 2, remote_offset = 1"),
            "step 1: the remote bytes end at 129, beyond region \"dst\" (128 bytes)",
        );
        parses(
            "inline 64",
            &post_with("size = 64, count = 2, inline = true"),
        );
        refused(
            "inline 65",
            &post_with("size = 65, count = 1, inline = true"),
            "step 1: inline data is for WRITEs and SENDs of at most 64 bytes",
        );
        let name32 = "n".repeat(32);
        parses(
            "a 32-character name",
            &OK.replace("\"a\"", &format!("{name32:?}")),
        );
        for bad in ["n".repeat(33), "x.peer".to_string(), "x.cq".to_string()] {
            refused(
                &bad,
                &OK.replace("\"a\"", &format!("{bad:?}")),
                &format!("qp name {bad:?}: use 1 to 32 letters, digits, '_' or '-'"),
            );
        }
    }

    #[test]
    fn defaults_are_what_the_format_documents() {
        let s = parses("OK", OK);
        let q = &s.qps[0];
        assert_eq!((q.depth, q.peer_depth), (16, 16));
        assert_eq!(q.policy, Policy::Every(4));
        assert_eq!((q.rnr_retry, q.retry_cnt), (7, 7));
        assert_eq!(q.peer_access, Access::REMOTE_WRITE | Access::REMOTE_READ);
        // Every work request can complete in error: two entries per slot, and a marker's.
        let sizes: Vec<_> = s.cqs.iter().map(|c| (c.name.as_str(), c.size)).collect();
        assert_eq!(sizes, [("a.cq", 34), ("a.peer.cq", 34)]);
        let s = parses("depths", &qp_with("depth = 8\npeer_depth = 100"));
        assert_eq!((s.cqs[0].size, s.cqs[1].size), (18, 202));
        // A region's access is empty unless given; its fill zero.
        assert_eq!(s.regions[0].access, Access::empty());
        assert_eq!(s.regions[0].fill, Fill::Pattern);
        assert_eq!(s.regions[1].fill, Fill::Zero);
    }

    #[test]
    fn region_fields_are_read_as_written() {
        let access = |list: &str| {
            let text = OK.replace("[\"local_write\", \"remote_write\"]", list);
            parses(list, &text).regions[1].access
        };
        assert_eq!(access("[\"local_write\"]"), Access::LOCAL_WRITE);
        assert_eq!(
            access("[\"local_write\", \"remote_read\"]"),
            Access::LOCAL_WRITE | Access::REMOTE_READ
        );
        assert_eq!(
            access("[\"local_write\", \"remote_atomic\"]"),
            Access::LOCAL_WRITE | Access::REMOTE_ATOMIC
        );
        refused(
            "remote_atomic alone",
            &OK.replace("[\"local_write\", \"remote_write\"]", "[\"remote_atomic\"]"),
            "region \"dst\": remote_write and remote_atomic need local_write too",
        );
        let fill = |value: &str| OK.replace("fill = \"pattern\"", &format!("fill = {value}"));
        assert_eq!(
            parses("fill 255", &fill("255")).regions[0].fill,
            Fill::Byte(255)
        );
        for bad in ["256", "-1"] {
            refused(
                bad,
                &fill(bad),
                &format!(
                    "region \"src\": fill {bad} is not \"zero\", \"pattern\" or a byte 0..=255"
                ),
            );
        }
        assert!(parses("pd other", &fill("\"zero\"\npd = \"other\"")).regions[0].other_pd);
        refused(
            "pd second",
            &fill("\"zero\"\npd = \"second\""),
            "region \"src\": pd \"second\" is not \"main\" or \"other\"",
        );
    }

    #[test]
    fn fields_that_would_be_ignored_or_misread_are_refused() {
        refused(
            "imm on a send",
            &OK.replace(
                "op = \"write\", local = \"src\", remote = \"dst\", size = 64, count = 2",
                "op = \"send\", size = 0, imm = 5",
            ),
            "step 1: imm: a send carries no immediate data (write_imm and send_imm do)",
        );
        refused(
            "bad_lkey inline",
            &post_with("size = 64, count = 1, inline = true, fault = \"bad_lkey\""),
            "step 1: fault \"bad_lkey\" needs a local region, not inline data",
        );
        refused(
            "post on a peer",
            &OK.replace("qp = \"a\", op", "qp = \"a.peer\", op"),
            "x.toml:13:1: step 1: \"a.peer\": this step needs a requester QP, not a peer",
        );
        refused(
            "stride of one",
            &post_with("size = 64, count = 1, stride = 128"),
            "step 1: stride with count 1: it moves the offsets of later work requests",
        );
        parses(
            "stride of two",
            &post_with("size = 32, count = 2, stride = 64"),
        );
        refused(
            "inline nothing",
            &post_with("size = 0, inline = true"),
            "step 1: inline with size 0: a zero-length transfer carries no data",
        );
        refused(
            "peer_access local_write",
            &qp_with("peer_access = [\"remote_write\", \"local_write\"]"),
            "x.toml:3:1: qp \"a\": peer_access: local_write is a region's flag, not a queue pair's",
        );
        refused(
            "peer_access unknown",
            &qp_with("peer_access = [\"rw\"]"),
            "x.toml:3:1: qp \"a\": peer_access: unknown access \"rw\"",
        );
        refused(
            "region access unknown",
            &OK.replace("[\"local_write\", \"remote_write\"]", "[\"rw\"]"),
            "region \"dst\": unknown access \"rw\"",
        );
        refused(
            "a cq of no QP",
            &format!("{OK}\n[[cq]]\nname = \"c\"\nsize = 8\n"),
            "cq \"c\": no QP reports to it (name it in a QP's send_cq or peer_cq)",
        );
        parses(
            "a cq of a peer",
            &format!(
                "{}\n[[cq]]\nname = \"c\"\nsize = 40\n",
                qp_with("peer_cq = \"c\"")
            ),
        );
        for step in ["confirm", "drain"] {
            refused(
                step,
                &format!("{OK}\n[[step]]\n{step} = \"a.peer\"\n"),
                "\"a.peer\": this step needs a requester QP, not a peer",
            );
        }
        refused(
            "recv cnt",
            &format!("{OK}\n[[step]]\nrecv = {{ qp = \"a.peer\", cnt = 4 }}\n"),
            "unknown field `cnt`",
        );
        let expect = |body: &str| format!("{OK}\n[expect]\n{body}\n");
        refused(
            "differs.mlx5",
            &expect("[expect.rxe]\nevents = []\n[differs]\nrxe = \"x\"\nmlx5 = \"y\""),
            "differs.mlx5: the only provider that may differ is rxe",
        );
        refused(
            "expect.rxe.rxe",
            &expect(
                "[expect.rxe]\nevents = []\n[expect.rxe.rxe]\nevents = []\n[differs]\nrxe = \"x\"",
            ),
            "expect.rxe.rxe: one level only",
        );
        for bad in ["1fb4", "1fb4000000000000000", "1fb400000000000g"] {
            refused(
                bad,
                &expect(&format!("digests = {{ dst = {bad:?} }}")),
                &format!("expect.digests.dst: {bad:?} is not 16 hex digits"),
            );
        }
        refused(
            "qp_req_err",
            &expect("events = [\"qp_req_err\"]"),
            "expect.events: \"qp_req_err\": name the qp, as \"qp_req_err:a\"",
        );
        refused(
            "cq_err:a",
            &expect("events = [\"cq_err:a\"]"),
            "expect.events: \"cq_err:a\": cq_err names no qp (drop \":a\")",
        );
    }

    /// An error in `[expect]` or `[differs]` names the line and column of the entry at fault,
    /// not the table's header (`OK` ends on line 16; `[expect]` is on line 18).
    #[test]
    fn expectation_errors_name_the_line_of_their_entry() {
        let at = |body: &str, want: &str| {
            let text = format!("{OK}\n[expect]\n{body}\n");
            let e = error(&text);
            assert!(
                e.starts_with(want),
                "{body}:\n{e}\nshould start with: {want}"
            );
        };
        at(
            "events = []\ncqes = [\n  { qp = \"a\", wr_id = 1, status = \"success\" },\n  \
             { qp = \"b\", wr_id = 2, status = \"success\" },\n]",
            "x.toml:22:3: expect.cqes: no qp named \"b\"",
        );
        at(
            "cqes = [\n  { qp = \"a\", wr_id = 1, status = \"success\" },\n  \
             { qp = \"a\", wr_id = 2, status = \"nope\" },\n]",
            "x.toml:21:3: expect.cqes: unknown status \"nope\"",
        );
        at(
            "cqes = [\n  { qp = \"a\", wr_id = 1, status = \"success\", opcode = \"rdma_write\", \
             imm = 1 },\n]",
            "x.toml:20:3: expect.cqes: imm of a wr_id 1 success rdma_write completion: immediate \
             data comes only in successful completions of receives",
        );
        at(
            "cqes = [\n  { qp = \"a\", wr_id = 1, status = \"rem_access_err\", imm = 1 },\n]",
            "x.toml:20:3: expect.cqes: imm of a wr_id 1 rem_access_err completion: immediate",
        );
        at(
            "events = []\n[expect.outcomes]\na = [\"1 completed\"]\nb = [\"1 completed\"]",
            "x.toml:22:5: expect.outcomes: no qp named \"b\"",
        );
        at(
            "events = []\n[expect.outcomes]\na = [\"1 completed\", \"x completed\"]",
            "x.toml:21:21: expect.outcomes.a: ",
        );
        // Of two overlapping ranges, the later in the file is at fault.
        at(
            "[expect.outcomes]\na = [\n  \"3 completed\",\n  \"1-3 flushed\",\n]",
            "x.toml:22:3: expect.outcomes.a: \"1-3 flushed\" and \"3 completed\" overlap",
        );
        at(
            "events = []\n[expect.digests]\ndst = \"0123456789abcdef\"\nsrc = \"1fb4\"",
            "x.toml:22:7: expect.digests.src: \"1fb4\" is not 16 hex digits",
        );
        at(
            "[expect.digests]\nnone = \"0123456789abcdef\"",
            "x.toml:20:8: expect.digests: no region named \"none\"",
        );
        at(
            "events = [\n  \"cq_err\",\n  \"qp_req_err\",\n]",
            "x.toml:21:3: expect.events: \"qp_req_err\": name the qp",
        );
        // Inside `[expect.rxe]`, its own entries' lines.
        at(
            "events = []\n[expect.rxe]\nevents = [\n  \"cq_err\",\n  \"qp_fatal:z\",\n]\n\
             [differs]\nrxe = \"why\"",
            "x.toml:23:3: expect.rxe.events: \"qp_fatal:z\": no qp named \"z\"",
        );
        // The rules on `[expect.rxe]` as a whole name its header, and `[differs]`'s rules
        // the entry they are about.
        at(
            "events = []\n[expect.rxe]\nevents = []",
            "x.toml:20:1: [expect.rxe] needs differs.rxe",
        );
        at(
            "events = []\n[expect.rxe]\nevents = []\n[expect.rxe.rxe]\nevents = []\n\
             [differs]\nrxe = \"x\"",
            "x.toml:22:1: expect.rxe.rxe: one level only",
        );
        at(
            "[expect.rxe]\nevents = []\n[differs]\nrxe = \"x\"\nmlx5 = \"y\"",
            "x.toml:23:8: differs.mlx5: the only provider that may differ is rxe",
        );
        at(
            "[expect.rxe]\nevents = []\n[differs]\nrxe = \"  \"",
            "x.toml:22:7: differs.rxe is empty",
        );
    }

    #[test]
    fn rxe_expectations_keep_what_they_do_not_replace() {
        let s = parses(
            "expect.rxe",
            &format!(
                "{OK}\n[expect]\n\
                 cqes = [{{ qp = \"a\", wr_id = 2, status = \"success\", opcode = \"rdma_write\" }}]\n\
                 outcomes = {{ a = [\"1-2 completed\"] }}\n\
                 digests = {{ dst = \"0123456789abcdef\" }}\n\
                 events = [\"qp_access_err:a.peer\"]\n\
                 [expect.rxe]\nevents = []\n[differs]\nrxe = \"why\"\n"
            ),
        );
        let rxe = s.expect_rxe.as_ref().expect("rxe expectations");
        assert_eq!(rxe.events, Some(Vec::new()));
        assert_eq!(
            s.expect.events,
            Some(vec!["qp_access_err:a.peer".to_string()])
        );
        assert_eq!(rxe.cqes, s.expect.cqes);
        assert!(rxe.cqes.as_ref().is_some_and(|c| c.len() == 1));
        assert_eq!(rxe.outcomes, s.expect.outcomes);
        assert!(rxe.outcomes.is_some());
        assert_eq!(rxe.digests, s.expect.digests);
        assert!(rxe.digests.is_some());
        assert_eq!(s.differs.get("rxe").map(String::as_str), Some("why"));
    }

    #[test]
    fn outcome_ranges() {
        assert_eq!(
            parse_outcome_range("1-2 completed").unwrap(),
            (1, 2, "completed".into(), None)
        );
        assert_eq!(
            parse_outcome_range("3 failed:rem_access_err").unwrap(),
            (3, 3, "failed".into(), Some("rem_access_err".into()))
        );
        assert!(parse_outcome_range("2-1 completed").is_err());
        assert!(parse_outcome_range("3 failed").is_err());
        assert!(parse_outcome_range("3 failed:nope").is_err());
        // Outcomes no work request can have.
        assert_eq!(
            parse_outcome_range("1-4 failed:success").unwrap_err(),
            "\"1-4 failed:success\": a work request whose completion is success is completed, \
             never failed (write \"1-4 completed\")"
        );
        assert_eq!(
            parse_outcome_range("5 failed:wr_flush_err").unwrap_err(),
            "\"5 failed:wr_flush_err\": a work request whose completion is wr_flush_err is \
             flushed, never failed (write \"5 flushed\")"
        );
        assert!(parse_outcome_range("x completed").is_err());
    }
}

//! Random scenarios from a seed: the same seed gives the same file, every file is one
//! `selsig run` accepts, and each is race-free (its trace is the same on every run and on
//! every faithful device) or says in [`Generated::racy`] which construct makes it racy.
//!
//! Race-free by construction: each queue pair writes only its own regions (`s{i}` its
//! source, `d{i}` its remote target, `l{i}` where READs and atomics land, `r{i}` its peer's
//! receives); a fault, a `dereg` or a `to_error` comes only when the queue pair it touches
//! has nothing in flight, and a faulted post fits in the queue without waiting for room;
//! SENDs and WRITEs with immediate find their receives posted; a shared send CQ holds every
//! send queue's work; `poll = { cqes = 1 }` comes only where one CQ can complete. A racy
//! scenario breaks one of these rules on purpose (see docs/campaign.md).

use selsig::PostApi;
use selsig_soft::Personality;

mod emit;
mod rng;

use emit::{PostGen, qp_section, region};
use rng::Rng;

/// What the generator makes: sizes and mix.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GenOptions {
    /// The most queue pairs a scenario has (1 to 4; default 3).
    pub qps: u32,
    /// The most steps a scenario has before its closing ones (2 to 64; default 12).
    pub steps: u32,
    /// How many scenarios in a hundred contain one racy construct (0 to 100; default 10).
    pub racy_percent: u32,
    /// Whether a scenario may end with a `device_fatal` step (only the software NIC can
    /// take one; default true).
    pub device_fatal: bool,
    /// The personality written into the file's `[device]` (default none).
    pub personality: Option<Personality>,
    /// The post API written into the file's `[device]` (default none: legacy).
    pub post_api: Option<PostApi>,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            qps: 3,
            steps: 12,
            racy_percent: 10,
            device_fatal: true,
            personality: None,
            post_api: None,
        }
    }
}

impl GenOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`qps`](Self::qps) (kept within 1 to 4).
    pub fn qps(mut self, qps: u32) -> Self {
        self.qps = qps.clamp(1, 4);
        self
    }

    /// Sets [`steps`](Self::steps) (kept within 2 to 64).
    pub fn steps(mut self, steps: u32) -> Self {
        self.steps = steps.clamp(2, 64);
        self
    }

    /// Sets [`racy_percent`](Self::racy_percent) (at most 100).
    pub fn racy_percent(mut self, percent: u32) -> Self {
        self.racy_percent = percent.min(100);
        self
    }

    /// Sets [`device_fatal`](Self::device_fatal).
    pub fn device_fatal(mut self, allowed: bool) -> Self {
        self.device_fatal = allowed;
        self
    }

    /// Sets [`personality`](Self::personality).
    pub fn personality(mut self, personality: Option<Personality>) -> Self {
        self.personality = personality;
        self
    }

    /// Sets [`post_api`](Self::post_api).
    pub fn post_api(mut self, post_api: Option<PostApi>) -> Self {
        self.post_api = post_api;
        self
    }
}

/// A generated scenario.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Generated {
    /// The seed it was made from.
    pub seed: u64,
    /// Its name: `gen-` and the seed.
    pub name: String,
    /// The scenario file.
    pub text: String,
    /// The racy constructs it contains, each as the race class
    /// ([`Race::class`](crate::Race::class)) it belongs to; empty for a race-free one.
    pub racy: Vec<&'static str>,
}

/// Makes the scenario of `seed`.
pub fn generate(seed: u64, options: &GenOptions) -> Generated {
    let mut g = Gen::new(seed, options);
    g.body();
    let name = format!("gen-{seed}");
    let text = g.file(&name);
    Generated {
        seed,
        name,
        text,
        racy: g.racy,
    }
}

/// A queue pair as declared.
struct QpGen {
    depth: u64,
    policy: String,
    sq_sig_all: bool,
    rnr_retry: u64,
    retry_cnt: u64,
    peer_depth: u64,
    sges: u64,
    atomics: bool,
}

/// Where a queue pair stands, as the generator tracks it.
#[derive(Default, Clone)]
struct Live {
    /// Work posted since its last `poll = "idle"` or drain.
    in_flight: bool,
    /// Receives of its peer posted since then.
    recvs: u64,
    /// A fault put it in the error state: nothing is posted on it until an idle poll, and
    /// what is posted after is refused.
    errored: bool,
    /// Moved to the error state by a step, or its region deregistered: nothing more is
    /// posted on it.
    frozen: bool,
    /// Drained: nothing more is posted on it.
    drained: bool,
    /// Its last post forced a signal.
    forced: bool,
}

/// The racy constructs.
#[derive(Clone, Copy)]
enum Racy {
    ToError,
    Dereg,
    SameBytes,
    Credits,
    TwoCqs,
}

struct Gen<'a> {
    rng: Rng,
    o: &'a GenOptions,
    qps: Vec<QpGen>,
    live: Vec<Live>,
    /// The send CQ all queue pairs share (`[[cq]] shared`), with its size.
    shared: Option<u64>,
    /// The receive CQ all peers share (`[[cq]] peers`), with its size.
    peers: Option<u64>,
    /// The steps, each as its line of TOML.
    steps: Vec<String>,
    racy: Vec<&'static str>,
    planned: Option<Racy>,
}

const REGION: u64 = 4096;

impl<'a> Gen<'a> {
    fn new(seed: u64, o: &'a GenOptions) -> Self {
        let mut rng = Rng::new(seed);
        let n = rng.range(1, u64::from(o.qps.clamp(1, 4)));
        let planned = rng.chance(u64::from(o.racy_percent)).then(|| {
            let mut kinds = vec![Racy::ToError, Racy::Dereg];
            if n >= 2 {
                kinds.extend([Racy::SameBytes, Racy::Credits, Racy::TwoCqs]);
            }
            rng.pick(&kinds)
        });
        let qps: Vec<QpGen> = (0..n)
            .map(|_| {
                let policy = match rng.range(0, 9) {
                    0 => "always".to_string(),
                    1 => "never".to_string(),
                    2 => "manual".to_string(),
                    _ => format!("every:{}", rng.range(1, 8)),
                };
                QpGen {
                    depth: rng.pick(&[4, 8, 16, 32]),
                    policy,
                    sq_sig_all: rng.chance(8),
                    rnr_retry: if rng.chance(20) { rng.range(0, 6) } else { 7 },
                    retry_cnt: if rng.chance(20) { rng.range(1, 6) } else { 7 },
                    peer_depth: rng.pick(&[4, 8, 16]),
                    sges: if rng.chance(30) { rng.range(2, 3) } else { 1 },
                    atomics: rng.chance(30),
                }
            })
            .collect();
        let depths: u64 = qps.iter().map(|q| q.depth).sum();
        let shared = match planned {
            // Credits for fewer work requests than one queue holds.
            Some(Racy::Credits) => Some(qps.iter().map(|q| q.depth).min().unwrap_or(4)),
            Some(Racy::TwoCqs) => None,
            _ if n >= 2 && rng.chance(25) => Some(depths + 1),
            _ => None,
        };
        let peers = (n >= 2 && rng.chance(20)).then(|| qps.iter().map(|q| q.peer_depth).sum());
        Gen {
            rng,
            o,
            live: vec![Live::default(); qps.len()],
            qps,
            shared,
            peers,
            steps: Vec::new(),
            racy: Vec::new(),
            planned,
        }
    }

    /// The steps: a random mix, the racy construct somewhere if one is planned, then what
    /// retires everything.
    fn body(&mut self) {
        let n = self.rng.range(2, u64::from(self.o.steps.clamp(2, 64)));
        // Shared credits race from the first post on: the construct comes first.
        let racy_at = match self.planned {
            Some(Racy::Credits) => 0,
            _ => self.rng.range(0, n - 1),
        };
        for i in 0..n {
            if i == racy_at
                && let Some(kind) = self.planned
            {
                self.racy_step(kind);
                continue;
            }
            match self.rng.range(0, 99) {
                0..=49 => self.post(),
                50..=61 => self.idle(),
                62..=67 => self.drain(),
                68..=73 => self.poll_one(),
                74..=79 => self.move_to_error(),
                80..=85 => self.dereg(),
                _ => self.fault(),
            }
        }
        self.idle();
        if self.o.device_fatal && self.rng.chance(8) {
            self.device_fatal();
        }
    }

    fn push(&mut self, step: String) {
        self.steps.push(step);
    }

    /// A queue pair that may take ordinary posts.
    fn postable(&mut self) -> Option<usize> {
        let ok: Vec<usize> = (0..self.qps.len())
            .filter(|&i| {
                let l = &self.live[i];
                !l.frozen && !l.drained && !l.errored
            })
            .collect();
        (!ok.is_empty()).then(|| self.rng.pick(&ok))
    }

    /// A queue pair with nothing in flight that may take a post.
    fn quiet(&mut self) -> Option<usize> {
        let ok: Vec<usize> = (0..self.qps.len())
            .filter(|&i| {
                let l = &self.live[i];
                !l.frozen && !l.drained && !l.errored && !l.in_flight && l.recvs == 0
            })
            .collect();
        (!ok.is_empty()).then(|| self.rng.pick(&ok))
    }

    /// An ordinary post (its receives first, where it needs them), or, on a queue pair in
    /// the error state and idle, one that is refused.
    fn post(&mut self) {
        let refusable: Vec<usize> = (0..self.qps.len())
            .filter(|&i| {
                let l = &self.live[i];
                l.errored && !l.in_flight && !l.frozen && !l.drained
            })
            .collect();
        if !refusable.is_empty() && self.rng.chance(15) {
            let q = self.rng.pick(&refusable);
            let mut p = PostGen::new(q, "write");
            p.local = Some(format!("s{q}"));
            p.remote = Some(format!("d{q}"));
            p.size = 16;
            p.count = self.rng.range(1, 3);
            self.push(p.step());
            // Refused, as the queue knows its error state; confirmed at the next idle all
            // the same, should a device take them.
            self.live[q].in_flight = true;
            return;
        }
        let Some(q) = self.postable() else { return };
        let mut ops = vec![
            "write",
            "write",
            "write",
            "read",
            "send",
            "write_imm",
            "send_imm",
        ];
        if self.qps[q].atomics {
            ops.extend(["fetch_add", "cmp_swap"]);
        }
        let op = self.rng.pick(&ops);
        let p = self.ordinary(q, op);
        self.emit_post(p);
    }

    /// A post of `op` on `q` with no fault: sizes, offsets, signals, inline data, lists and
    /// batches at random.
    fn ordinary(&mut self, q: usize, op: &'static str) -> PostGen {
        let qp = &self.qps[q];
        let (depth, sges, peer_depth) = (qp.depth, qp.sges, qp.peer_depth);
        let mut p = PostGen::new(q, op);
        let atomic = matches!(op, "fetch_add" | "cmp_swap");
        let consumes = matches!(op, "send" | "send_imm" | "write_imm");
        p.size = if atomic {
            8
        } else {
            match self.rng.range(0, 9) {
                0 => 0,
                1..=5 => self.rng.range(1, 64),
                6..=8 => self.rng.range(65, 1024),
                _ => self.rng.range(1025, 2048),
            }
        };
        let most = (REGION / p.size.max(1)).min(if consumes { peer_depth } else { 3 * depth });
        p.count = self.rng.range(1, most.clamp(1, 48));
        if atomic {
            p.local = Some(format!("l{q}"));
            p.remote = Some(format!("d{q}"));
            p.local_offset = 8 * self.rng.range(0, (REGION - 8 * p.count) / 8);
            p.remote_offset = 8 * self.rng.range(0, (REGION - 8 * p.count) / 8);
            if op == "fetch_add" {
                p.add = Some(self.rng.range(1, 1000));
            } else {
                p.compare = Some(self.rng.range(0, 2));
                p.swap = Some(self.rng.range(1, 1 << 40));
            }
        } else {
            let span = p.count * p.size;
            let local = if op == "read" { "l" } else { "s" };
            if p.size > 0 {
                p.local = Some(format!("{local}{q}"));
                p.local_offset = self.rng.range(0, REGION - span);
            }
            if !matches!(op, "send" | "send_imm") {
                p.remote = Some(format!("d{q}"));
                p.remote_offset = self.rng.range(0, REGION - span);
            }
            if (1..=32).contains(&p.size) && op != "read" && self.rng.chance(20) {
                p.inline = true;
            } else if sges >= 2
                && p.size >= 2
                && matches!(op, "write" | "read" | "send")
                && self.rng.chance(25)
            {
                // Entry j in its own kilobyte of the local region; the work requests move
                // through it by the list's total size.
                let parts = self.rng.range(2, sges.min(p.size));
                p.count = p.count.min(1024 / p.size).max(1);
                let mut left = p.size;
                for j in 0..parts {
                    let size = if j + 1 == parts {
                        left
                    } else {
                        self.rng.range(1, left - (parts - 1 - j))
                    };
                    left -= size;
                    p.list.push((format!("{local}{q}"), j * 1024, size));
                }
                p.local = None;
                p.local_offset = 0;
                let span = p.count * p.size;
                if p.remote.is_some() {
                    p.remote_offset = self.rng.range(0, REGION - span);
                }
            }
            if matches!(op, "write_imm" | "send_imm") {
                p.imm = Some(self.rng.range(0, u64::from(u32::MAX)));
            }
        }
        p.signal = match self.rng.range(0, 9) {
            0 => "force",
            1 => "last",
            _ => "auto",
        };
        // A batch waits for room for all of it: within the queue and a shared CQ's credits.
        let room = depth.min(self.shared.unwrap_or(depth));
        if p.count >= 2 && p.count <= room && self.rng.chance(12) {
            p.batch = true;
        }
        p
    }

    /// Writes a post, with the receives it needs before it.
    fn emit_post(&mut self, p: PostGen) {
        let q = p.qp;
        if matches!(p.op, "send" | "send_imm" | "write_imm") {
            let size = if p.op == "write_imm" && self.rng.chance(50) {
                0
            } else {
                p.size
            };
            let offset = self.rng.range(0, REGION - size * p.count);
            self.push(recv_step(q, size, p.count, offset));
            self.live[q].recvs += p.count;
        }
        // A batch waits for room for all of it: an unsignaled tail must be confirmed, or
        // its slots never come back.
        if p.batch && self.live[q].in_flight && !self.live[q].errored {
            self.push(format!("confirm = \"q{q}\""));
        }
        let forced = p.signal != "auto";
        self.push(p.step());
        self.live[q].in_flight = true;
        self.live[q].forced = forced;
    }

    /// Confirms every queue pair's unsignaled tail, then polls until everything retired.
    fn idle(&mut self) {
        for q in 0..self.qps.len() {
            let l = &self.live[q];
            // A queue in the error state needs no confirm (every work request after the
            // error completes), but whether a fault made the error is the device's to say
            // (rxe's provider refuses a misaligned atomic at the post): confirm them all.
            if l.in_flight {
                self.push(format!("confirm = \"q{q}\""));
            }
        }
        self.push("poll = \"idle\"".to_string());
        for l in &mut self.live {
            l.in_flight = false;
            l.recvs = 0;
            l.forced = false;
        }
    }

    fn drain(&mut self) {
        let ok: Vec<usize> = (0..self.qps.len())
            .filter(|&i| {
                let l = &self.live[i];
                !(l.frozen || l.drained || (l.errored && l.in_flight))
            })
            .collect();
        if ok.is_empty() {
            return;
        }
        let q = self.rng.pick(&ok);
        self.push(format!("drain = \"q{q}\""));
        let l = &mut self.live[q];
        l.drained = true;
        l.in_flight = false;
        l.recvs = 0;
    }

    /// `poll = { cqes = 1 }` after a post that forced a signal, where that queue pair's
    /// send CQ is the only one a completion can come to.
    fn poll_one(&mut self) {
        let busy: Vec<usize> = (0..self.qps.len())
            .filter(|&i| self.live[i].in_flight || self.live[i].recvs > 0)
            .collect();
        if let [q] = busy[..] {
            let l = &self.live[q];
            if l.forced && l.recvs == 0 && !l.errored && !l.frozen {
                self.push("poll = { cqes = 1 }".to_string());
                self.live[q].forced = false;
                return;
            }
        }
        self.post();
    }

    /// A queue pair, or its peer, moved to the error state with nothing in flight.
    fn move_to_error(&mut self) {
        let Some(q) = self.quiet() else { return };
        let peer = if self.rng.chance(40) { ".peer" } else { "" };
        self.push(format!("to_error = \"q{q}{peer}\""));
        self.live[q].frozen = true;
    }

    /// A region deregistered while nothing is in flight, and often a post that uses it.
    fn dereg(&mut self) {
        if self.live.iter().any(|l| l.in_flight || l.recvs > 0) {
            return self.idle();
        }
        let Some(q) = self.quiet() else { return };
        let remote = self.rng.chance(60);
        let region = if remote {
            format!("d{q}")
        } else {
            format!("s{q}")
        };
        self.push(format!("dereg = \"{region}\""));
        self.live[q].frozen = true;
        if self.rng.chance(70) {
            let mut p = PostGen::new(q, "write");
            p.local = Some(format!("s{q}"));
            p.remote = Some(format!("d{q}"));
            p.size = self.rng.range(1, 256);
            p.count = self.rng.range(1, self.qps[q].depth.min(REGION / p.size));
            p.local_offset = self.rng.range(0, REGION - p.size * p.count);
            p.remote_offset = self.rng.range(0, REGION - p.size * p.count);
            self.push(p.step());
            self.live[q].in_flight = true;
            self.live[q].errored = true;
        }
    }

    /// A post with a fault, on a queue pair with nothing in flight, that fits in its queue.
    fn fault(&mut self) {
        let Some(q) = self.quiet() else {
            return self.post();
        };
        let mut ops = vec!["write", "read"];
        if self.qps[q].atomics {
            ops.extend(["fetch_add", "cmp_swap"]);
        }
        let op = self.rng.pick(&ops);
        let mut p = self.ordinary(q, op);
        p.batch = p.batch && p.count >= 2;
        p.count = p.count.min(self.qps[q].depth);
        if p.size == 0 || !p.list.is_empty() {
            p.list.clear();
            p.size = 8;
            p.local = Some(format!("{}{q}", if op == "write" { "s" } else { "l" }));
            p.local_offset = 0;
            p.remote_offset = 0;
            p.inline = false;
        }
        if p.batch && p.count < 2 {
            p.batch = false;
        }
        let atomic = matches!(op, "fetch_add" | "cmp_swap");
        let mut faults = vec!["bad_rkey", "bad_lkey", "wrong_pd", "no_access"];
        if atomic {
            faults = vec!["bad_rkey", "bad_lkey", "misaligned"];
        } else if p.size >= 2 {
            faults.push("out_of_bounds");
        }
        if op == "write" && p.size <= 32 {
            faults.push("inline_too_long");
        }
        let fault = self.rng.pick(&faults);
        let mut refused = false;
        match fault {
            "wrong_pd" => p.remote = Some(format!("x{q}")),
            "no_access" => {
                // A region its operation may not touch: READ a source, WRITE where
                // READs land.
                let r = if op == "read" { "s" } else { "l" };
                p.remote = Some(format!("{r}{q}"));
            }
            "inline_too_long" => {
                p.inline = true;
                refused = true;
                p.fault = Some(fault);
            }
            "bad_lkey" => {
                p.inline = false;
                p.fault = Some(fault);
            }
            _ => p.fault = Some(fault),
        }
        if p.fault.is_some() {
            p.fault_at = Some(self.rng.range(1, p.count));
        }
        self.push(p.step());
        let l = &mut self.live[q];
        l.in_flight = true;
        l.errored = !refused;
        // A misaligned atomic fails at an mlx5 responder and is refused at the post by
        // rxe's provider: whether the queue is in the error state is the device's to say.
        l.frozen = fault == "misaligned";
        l.forced = false;
    }

    /// SENDs no receive waits for, then the device fails: they retire as `device_lost`.
    fn device_fatal(&mut self) {
        let ok: Vec<usize> = (0..self.qps.len())
            .filter(|&i| {
                let l = &self.live[i];
                !l.frozen && !l.drained && !l.errored && self.qps[i].rnr_retry == 7
            })
            .collect();
        if !ok.is_empty() {
            let q = self.rng.pick(&ok);
            let mut p = PostGen::new(q, "send");
            p.size = self.rng.range(0, 64);
            if p.size > 0 {
                p.local = Some(format!("s{q}"));
            }
            // Within the queue and a shared CQ's credits: they wait for ever, not for room.
            let most = self.qps[q].depth.min(8).min(self.shared.unwrap_or(8));
            p.count = self.rng.range(1, most);
            self.push(p.step());
        }
        self.push("device_fatal = true".to_string());
        self.push("poll = \"idle\"".to_string());
    }

    /// The planned racy construct.
    fn racy_step(&mut self, kind: Racy) {
        let writes = |g: &mut Self, q: usize, target: usize| {
            let mut p = PostGen::new(q, "write");
            p.local = Some(format!("s{q}"));
            p.remote = Some(format!("d{target}"));
            p.size = 64;
            p.count = g.rng.range(2, g.qps[q].depth);
            p.remote_offset = 0;
            p
        };
        let two: Vec<usize> = (0..self.qps.len())
            .filter(|&i| {
                let l = &self.live[i];
                !l.frozen && !l.drained && !l.errored
            })
            .collect();
        match kind {
            Racy::ToError | Racy::Dereg => {
                // Not on a pair with receives waiting: a SEND flushed before it met its
                // receive would leave the receive waiting for ever.
                let free: Vec<usize> = two
                    .iter()
                    .copied()
                    .filter(|&q| self.live[q].recvs == 0)
                    .collect();
                if free.is_empty() {
                    return;
                }
                let q = self.rng.pick(&free);
                let p = writes(self, q, q);
                self.emit_post(p);
                if matches!(kind, Racy::ToError) {
                    self.push(format!("to_error = \"q{q}\""));
                    self.racy.push("to_error_in_flight");
                    self.live[q].frozen = true;
                } else {
                    self.push(format!("dereg = \"d{q}\""));
                    self.racy.push("dereg_in_flight");
                    // The WRITEs may fail or not, and its queue be in the error state or
                    // not: a confirm retires an unsignaled tail either way.
                    self.push(format!("confirm = \"q{q}\""));
                    self.live[q].frozen = true;
                }
            }
            Racy::SameBytes | Racy::TwoCqs | Racy::Credits if two.len() >= 2 => {
                let (a, b) = (two[0], two[1]);
                let mut pa = writes(self, a, a);
                let mut pb = writes(
                    self,
                    b,
                    if matches!(kind, Racy::SameBytes) {
                        a
                    } else {
                        b
                    },
                );
                if matches!(kind, Racy::Credits) {
                    pa.count = self.qps[a].depth;
                    pb.count = self.qps[b].depth;
                }
                if matches!(kind, Racy::TwoCqs) {
                    pa.signal = "force";
                    pb.signal = "force";
                }
                self.emit_post(pa);
                self.emit_post(pb);
                match kind {
                    Racy::SameBytes => self.racy.push("same_bytes"),
                    Racy::Credits => self.racy.push("shared_credits"),
                    _ => {
                        self.push("poll = { cqes = 1 }".to_string());
                        self.racy.push("two_cqs");
                    }
                }
            }
            // The queue pairs the construct needs were taken out of play before it came.
            _ => {}
        }
    }

    /// The whole file.
    fn file(&self, name: &str) -> String {
        let mut t = String::new();
        let racy = if self.racy.is_empty() {
            "race-free".to_string()
        } else {
            format!("racy: {}", self.racy.join(", "))
        };
        t.push_str(&format!(
            "description = \"{name}: generated by selsig campaign ({racy})\"\n"
        ));
        if self.o.personality.is_some() || self.o.post_api.is_some() {
            t.push_str("\n[device]\n");
            if let Some(p) = self.o.personality {
                t.push_str(&format!("personality = \"{p}\"\n"));
            }
            if let Some(api) = self.o.post_api {
                let api = match api {
                    PostApi::Extended => "extended",
                    _ => "legacy",
                };
                t.push_str(&format!("post_api = \"{api}\"\n"));
            }
        }
        if let Some(size) = self.shared {
            t.push_str(&format!("\n[[cq]]\nname = \"shared\"\nsize = {size}\n"));
        }
        if let Some(size) = self.peers {
            t.push_str(&format!("\n[[cq]]\nname = \"peers\"\nsize = {size}\n"));
        }
        for (i, q) in self.qps.iter().enumerate() {
            t.push_str(&qp_section(
                i,
                q,
                self.shared.is_some(),
                self.peers.is_some(),
            ));
        }
        for (i, q) in self.qps.iter().enumerate() {
            let remote = if q.atomics {
                "[\"local_write\", \"remote_write\", \"remote_read\", \"remote_atomic\"]"
            } else {
                "[\"local_write\", \"remote_write\", \"remote_read\"]"
            };
            let fill = self.fill_of(i);
            t.push_str(&region(&format!("s{i}"), "[]", "\"pattern\"", None));
            t.push_str(&region(&format!("d{i}"), remote, &fill, None));
            t.push_str(&region(
                &format!("l{i}"),
                "[\"local_write\"]",
                "\"zero\"",
                None,
            ));
            t.push_str(&region(
                &format!("r{i}"),
                "[\"local_write\"]",
                "\"zero\"",
                None,
            ));
        }
        for i in 0..self.qps.len() {
            t.push_str(&region(
                &format!("x{i}"),
                "[\"local_write\", \"remote_write\", \"remote_read\"]",
                "\"zero\"",
                Some("other"),
            ));
        }
        for s in &self.steps {
            t.push_str(&format!("\n[[step]]\n{s}\n"));
        }
        t
    }

    /// The fill of `d{i}`: a byte, from the queue pair's own numbers, so that the file's
    /// text alone gives it.
    fn fill_of(&self, i: usize) -> String {
        let q = &self.qps[i];
        match (q.depth + q.peer_depth + i as u64) % 3 {
            0 => "\"zero\"".to_string(),
            1 => "\"pattern\"".to_string(),
            _ => format!("{}", (q.depth * 7 + i as u64) % 256),
        }
    }
}

fn recv_step(q: usize, size: u64, count: u64, offset: u64) -> String {
    if size == 0 {
        format!("recv = {{ qp = \"q{q}.peer\", count = {count} }}")
    } else {
        format!(
            "recv = {{ qp = \"q{q}.peer\", region = \"r{q}\", size = {size}, count = {count}, offset = {offset} }}"
        )
    }
}

//! The generated scenario as TOML text.

use std::fmt::Write as _;

use super::QpGen;

/// A post step as the generator builds it.
pub(super) struct PostGen {
    pub qp: usize,
    pub op: &'static str,
    pub local: Option<String>,
    pub remote: Option<String>,
    pub size: u64,
    pub count: u64,
    pub local_offset: u64,
    pub remote_offset: u64,
    pub signal: &'static str,
    pub inline: bool,
    pub imm: Option<u64>,
    pub fault: Option<&'static str>,
    pub fault_at: Option<u64>,
    /// Scatter/gather entries: region, offset, size.
    pub list: Vec<(String, u64, u64)>,
    pub batch: bool,
    pub add: Option<u64>,
    pub compare: Option<u64>,
    pub swap: Option<u64>,
}

impl PostGen {
    pub fn new(qp: usize, op: &'static str) -> Self {
        PostGen {
            qp,
            op,
            local: None,
            remote: None,
            size: 0,
            count: 1,
            local_offset: 0,
            remote_offset: 0,
            signal: "auto",
            inline: false,
            imm: None,
            fault: None,
            fault_at: None,
            list: Vec::new(),
            batch: false,
            add: None,
            compare: None,
            swap: None,
        }
    }

    /// The step's line: `post = { ... }`, with only the fields that say something.
    pub fn step(&self) -> String {
        let mut s = format!("post = {{ qp = \"q{}\", op = \"{}\"", self.qp, self.op);
        // (Writing to a String cannot fail.)
        if self.list.is_empty() {
            if let Some(l) = &self.local {
                let _ = write!(s, ", local = \"{l}\"");
                if self.local_offset > 0 {
                    let _ = write!(s, ", local_offset = {}", self.local_offset);
                }
            }
            if self.size > 0 {
                let _ = write!(s, ", size = {}", self.size);
            }
        } else {
            let entries: Vec<String> = self
                .list
                .iter()
                .map(|(r, o, n)| format!("{{ local = \"{r}\", offset = {o}, size = {n} }}"))
                .collect();
            let _ = write!(s, ", list = [{}]", entries.join(", "));
        }
        if let Some(r) = &self.remote {
            let _ = write!(s, ", remote = \"{r}\"");
            if self.remote_offset > 0 {
                let _ = write!(s, ", remote_offset = {}", self.remote_offset);
            }
        }
        if self.count != 1 {
            let _ = write!(s, ", count = {}", self.count);
        }
        if self.signal != "auto" {
            let _ = write!(s, ", signal = \"{}\"", self.signal);
        }
        if self.inline {
            s.push_str(", inline = true");
        }
        if let Some(imm) = self.imm {
            let _ = write!(s, ", imm = {imm}");
        }
        if let Some(f) = self.fault {
            let _ = write!(s, ", fault = \"{f}\"");
            if let Some(at) = self.fault_at.filter(|&a| a != 1) {
                let _ = write!(s, ", fault_at = {at}");
            }
        }
        if let Some(add) = self.add {
            let _ = write!(s, ", add = {add}");
        }
        if let (Some(c), Some(w)) = (self.compare, self.swap) {
            let _ = write!(s, ", compare = {c}, swap = {w}");
        }
        if self.batch {
            s.push_str(", batch = true");
        }
        s.push_str(" }");
        s
    }
}

/// A `[[qp]]` section.
pub(super) fn qp_section(i: usize, q: &QpGen, shared: bool, peers: bool) -> String {
    let mut t = format!(
        "\n[[qp]]\nname = \"q{i}\"\ndepth = {}\npolicy = \"{}\"\npeer_depth = {}\n",
        q.depth, q.policy, q.peer_depth
    );
    if q.sq_sig_all {
        t.push_str("sq_sig_all = true\n");
    }
    if q.rnr_retry != 7 {
        let _ = writeln!(t, "rnr_retry = {}", q.rnr_retry);
    }
    if q.retry_cnt != 7 {
        let _ = writeln!(t, "retry_cnt = {}", q.retry_cnt);
    }
    if q.sges > 1 {
        let _ = writeln!(t, "max_send_sge = {}", q.sges);
    }
    if q.atomics {
        t.push_str("peer_access = [\"remote_write\", \"remote_read\", \"remote_atomic\"]\n");
    }
    if shared {
        t.push_str("send_cq = \"shared\"\n");
    }
    if peers {
        t.push_str("peer_cq = \"peers\"\n");
    }
    t
}

/// A `[[region]]` section of 4 KiB.
pub(super) fn region(name: &str, access: &str, fill: &str, pd: Option<&str>) -> String {
    let mut t = format!(
        "\n[[region]]\nname = \"{name}\"\nsize = {}\naccess = {access}\nfill = {fill}\n",
        super::REGION
    );
    if let Some(pd) = pd {
        let _ = writeln!(t, "pd = \"{pd}\"");
    }
    t
}

//! A scenario whose queue pair's other end is on another host: [`RemoteSide`], what it
//! must provide, and [`Scenario::remote_region`], which scenarios can run that way.
//!
//! The remote side holds one region (the scenario's region that the WRITEs go to) and the
//! queue pair they arrive at; this side runs the steps as on a loopback pair, and reads
//! the region's digest from the remote side at the end. A scenario runs so only where
//! nothing in it depends on the peer being in this process: one queue pair, WRITEs to one
//! region that no step reads or deregisters, no receives, nothing done to the peer.

use anyhow::Result;
use selsig::{Access, ConnectOptions, Device, RemoteAddr};

use crate::model::{Action, Fill, Op, Scenario};

/// The other end of a scenario's queue pair on another host (`selsig serve`, for
/// `selsig run --connect`): its queue pair, and the scenario's remote region on its
/// device.
pub trait RemoteSide<D: Device> {
    /// Connects `qp` (this side's, in the RESET state; `options` as the scenario's queue
    /// pair asks, with its retry counts) to the remote queue pair, which has a region of
    /// `len` bytes, zeroed, with remote write access: where that region starts.
    fn connect(&mut self, qp: &D::Qp, options: &ConnectOptions, len: u64) -> Result<RemoteAddr>;

    /// The region's [`fnv1a64`](crate::fnv1a64) digest, asked for once every work request
    /// has its outcome.
    fn digest(&mut self) -> Result<u64>;
}

impl Scenario {
    /// The region a [`run_remote`](crate::run_remote) puts on the remote side: the one the
    /// scenario's WRITEs go to. An `Err` says why the scenario cannot run with a remote
    /// side.
    pub fn remote_region(&self) -> Result<&str, String> {
        self.remote_index().map(|r| self.regions[r].name.as_str())
    }

    /// [`remote_region`](Self::remote_region)'s index.
    pub(crate) fn remote_index(&self) -> Result<usize, String> {
        let [q] = self.qps.as_slice() else {
            return Err(format!(
                "it has {} queue pairs; a remote side is one queue pair (selsig serve's)",
                self.qps.len()
            ));
        };
        if self.cqs[q.peer_cq].name != format!("{}.peer.cq", q.name) {
            return Err(format!(
                "qp {:?}: peer_cq: the remote queue pair reports to the server's CQ",
                q.name
            ));
        }
        if !q.peer_access.contains(Access::REMOTE_WRITE) {
            return Err(format!(
                "qp {:?}: peer_access lacks remote_write: the remote queue pair allows WRITEs",
                q.name
            ));
        }
        let mut target = None;
        for (n, step) in self.steps.iter().enumerate() {
            let n = n + 1;
            let p = match step {
                Action::Post(p) => p,
                Action::Recv(_) => {
                    return Err(format!(
                        "step {n}: a receive on the peer (the remote side posts none)"
                    ));
                }
                Action::ToError(r) if r.peer => {
                    return Err(format!(
                        "step {n}: moves the peer to the error state (it is the remote side's)"
                    ));
                }
                Action::DeviceFatal => {
                    return Err(format!(
                        "step {n}: device_fatal (the software NIC's, in one process)"
                    ));
                }
                _ => continue,
            };
            if p.op != Op::Write {
                return Err(format!(
                    "step {n}: posts a {} (the remote side takes WRITEs only: no receives, \
                     no remote read or atomic access)",
                    op_name(p.op)
                ));
            }
            match (target, p.remote) {
                (_, None) => {}
                (None, Some(r)) => target = Some(r),
                (Some(t), Some(r)) if t == r => {}
                (Some(t), Some(r)) => {
                    return Err(format!(
                        "step {n}: WRITEs to region {:?} after region {:?}; a remote side \
                         holds one region",
                        self.regions[r].name, self.regions[t].name
                    ));
                }
            }
        }
        let r = target.ok_or("it WRITEs to no region")?;
        self.remote_region_ok(r)?;
        Ok(r)
    }

    /// Region `r`, the remote side's, is as the server's is, and no step uses it here.
    fn remote_region_ok(&self, r: usize) -> Result<(), String> {
        let region = &self.regions[r];
        let name = &region.name;
        if region.fill != Fill::Zero {
            return Err(format!(
                "region {name:?} is filled: the remote side's starts zeroed"
            ));
        }
        if region.other_pd || !region.access.contains(Access::REMOTE_WRITE) {
            return Err(format!(
                "region {name:?}: the remote side's region is on its queue pair's protection \
                 domain, with remote write access (a fault of access or protection domain \
                 runs on one host)"
            ));
        }
        for (n, step) in self.steps.iter().enumerate() {
            let used_here = match step {
                Action::Post(p) => p.local == Some(r) || p.list.iter().any(|e| e.region == r),
                Action::Dereg(d) => *d == r,
                _ => false,
            };
            if used_here {
                return Err(format!(
                    "step {}: uses region {name:?} on this side, but it is on the remote side",
                    n + 1
                ));
            }
        }
        Ok(())
    }
}

/// An operation's name in the scenario format.
fn op_name(op: Op) -> &'static str {
    match op {
        Op::Write => "write",
        Op::WriteImm => "write_imm",
        Op::Read => "read",
        Op::Send => "send",
        Op::SendImm => "send_imm",
        Op::FetchAdd { .. } => "fetch_add",
        Op::CmpSwap { .. } => "cmp_swap",
    }
}

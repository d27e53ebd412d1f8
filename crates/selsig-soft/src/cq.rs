//! `SoftCq`: a completion queue of the software NIC, polled as libmlx5 and rxe poll
//! theirs, with its completion events.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use selsig::{CompletionQueue, CqError, WcOpcode, WcStatus, WorkCompletion};

use crate::engine::Engine;
use crate::ring::Cqe;
use crate::state::CqInner;

/// A completion queue of a software device.
#[derive(Debug)]
pub struct SoftCq {
    pub(crate) cq: Arc<CqInner>,
    /// Its device's NIC (which also tells the device it belongs to).
    pub(crate) engine: Arc<Engine>,
}

impl SoftCq {
    /// The CQ's id, as in [`AsyncEvent::CqErr`](selsig::AsyncEvent::CqErr).
    pub fn id(&self) -> u32 {
        self.cq.id
    }
}

impl CompletionQueue for SoftCq {
    fn capacity(&self) -> u32 {
        // Created from a u32.
        self.cq.ring.capacity() as u32
    }

    fn identity(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self.cq) as usize)
    }

    fn req_notify(&self) -> Result<(), CqError> {
        self.cq
            .events
            .arm(self.cq.ring.published())
            .map_err(CqError::Event)
    }

    fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.cq.events.raw_fd().ok()
    }

    fn take_events(&self) -> Result<u32, CqError> {
        self.cq.events.take().map_err(CqError::Event)
    }

    fn wait_event(&self, timeout: Option<Duration>) -> Result<u32, CqError> {
        self.cq.events.wait(timeout).map_err(CqError::Event)
    }

    fn ignores_overrun(&self) -> bool {
        self.cq.ignore_overrun
    }

    fn device_lost(&self) -> bool {
        self.engine.dev.fatal.load(Ordering::Acquire)
    }

    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, CqError> {
        let cq = &self.cq;
        let mut st = cq.poll.lock();
        let available = cq.ring.available(st.consumer);
        if available == 0 {
            if cq.error.load(Ordering::Acquire) {
                return Err(CqError::Overrun {
                    capacity: self.capacity(),
                });
            }
            return Ok(0);
        }
        let n = (available as usize).min(out.len());
        for (k, slot) in out[..n].iter_mut().enumerate() {
            let c = cq.ring.read(st.consumer + k as u64);
            *slot = decode(&c);
            if c.send_queue && cq.free_on_poll {
                // mlx5: polling a completion frees its WQE's slot and every earlier one
                // (`wq->tail = wq->wqe_head[idx] + 1`).
                if st.last_sq.as_ref().is_none_or(|(qpn, _)| *qpn != c.qp_num) {
                    let found = cq.send_queues.read().get(&c.qp_num).cloned();
                    st.last_sq = found.map(|sq| (c.qp_num, sq));
                }
                // A reference, not a clone: the ring's reference count shares a line with
                // fields the NIC reads for every WQE.
                if let Some((_, sq)) = &st.last_sq {
                    sq.free_through(c.wqe_counter);
                }
            } else if !c.send_queue && cq.free_on_poll {
                // mlx5: polling a receive's completion frees its slot (`++wq->tail`).
                if let Some(rq) = cq.recv_queues.read().get(&c.qp_num) {
                    rq.polled_one();
                }
            }
        }
        st.consumer += n as u64;
        cq.ring.set_consumed(st.consumer);
        Ok(n)
    }
}

fn decode(c: &Cqe) -> WorkCompletion {
    // The NIC writes only values of these enums; an unknown one would be a bug of ours,
    // reported as a general error rather than a panic.
    let status = WcStatus::try_from(u32::from(c.status)).unwrap_or(WcStatus::GeneralErr);
    let opcode = if status.is_success() {
        WcOpcode::try_from(u32::from(c.opcode)).ok()
    } else {
        None
    };
    WorkCompletion {
        wr_id: c.wr_id,
        status,
        opcode,
        byte_len: if opcode.is_some_and(WcOpcode::has_byte_len) {
            c.byte_len
        } else {
            0
        },
        qp_num: c.qp_num,
        imm_data: c.has_imm.then_some(c.imm),
        vendor_err: c.vendor_err,
    }
}

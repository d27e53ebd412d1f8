//! The device and its objects: protection domains, memory regions, completion queues and
//! RC queue pairs, and their `selsig` provider traits.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use selsig::{
    Access, AsyncEvent, ConnectOptions, Device, Endpoint, Local, MemoryRegion, Opcode, PostApi,
    PostFailure, PostWrError, ProviderError, QpCaps, QpInit, QpState, QueuePair, RecvWr, SendWr,
    Sge,
};

use selsig::mlx5_sizing::{self, Mlx5Limits, Mlx5Request, SendOps};

use crate::config::{MAX_CQE, MAX_QP_WR, Personality, SoftConfig};
use crate::cq::SoftCq;
use crate::engine::{self, Engine};
use crate::events::CqEvents;
use crate::mem;
use crate::mr::{MrInner, MrTable, random_u32};
use crate::ring::{self, CompletionRing, MAX_INLINE, RecvRing, Rqe, SendRing, Wqe};
use crate::state::{CqInner, DeviceInner, PollState, Producer, QpChange, QpInner, Registry};
use crate::sync::Padded;
use crate::times::ExecTimes;

/// The limits libmlx5 would be given for a ConnectX with `config`'s `max_qp_wr`.
fn mlx5_limits(config: &SoftConfig) -> Mlx5Limits {
    Mlx5Limits::connectx(config.max_qp_wr)
}

/// A software RDMA device: one NIC thread executes the work requests of all its queue
/// pairs, strictly in order per send queue.
///
/// Queue pairs connect to queue pairs of the same device (loopback); two devices share
/// nothing. Cloning gives another handle to the same device.
#[derive(Debug, Clone)]
pub struct SoftDevice {
    dev: Arc<DeviceInner>,
    engine: Arc<Engine>,
}

/// Makes a software device fail on purpose ([`SoftDevice::faults`]).
#[derive(Debug, Clone)]
pub struct SoftFaults {
    engine: Arc<Engine>,
}

impl SoftFaults {
    /// Makes the device fail as a ConnectX does at a fatal error (a firmware or PCI error:
    /// `IBV_EVENT_DEVICE_FATAL`): the NIC executes nothing more and writes no more
    /// completions, not even flushes (libmlx5 does not flush a user-space QP); the
    /// completions already written can still be polled; posts are still taken until the
    /// send queue is full (libmlx5 checks nothing on a post); the CQs make no completion
    /// event (mlx5 wakes no user-space CQ); the asynchronous event
    /// [`AsyncEvent::DeviceFatal`] is raised, once. The kernel's rxe never raises it: on
    /// the rxe personality this is mlx5's behaviour all the same.
    ///
    /// Returns once the NIC has stopped: the work requests it was executing at that
    /// instant finish first, and nothing is written after.
    pub fn inject_fatal(&self) {
        let dev = &self.engine.dev;
        if !dev.fatal.swap(true, Ordering::AcqRel) {
            dev.events.lock().push_back(AsyncEvent::DeviceFatal);
        }
        loop {
            if !self.engine.running() {
                return;
            }
            if let Some(t) = dev.engine_thread.get() {
                t.unpark();
            }
            std::thread::yield_now();
        }
    }
}

impl SoftDevice {
    /// Opens a new device with `config` and starts its NIC thread.
    pub fn open(config: SoftConfig) -> Result<SoftDevice, ProviderError> {
        if config.max_qp_wr > MAX_QP_WR {
            return Err(ProviderError::Invalid {
                what: "max_qp_wr",
                why: format!(
                    "{}: a completion's 16-bit WQE counter names at most {MAX_QP_WR} send \
                     queue slots",
                    config.max_qp_wr
                ),
            });
        }
        if config.name.contains('\0') {
            return Err(ProviderError::Invalid {
                what: "device name",
                why: format!("{:?} holds a NUL character", config.name),
            });
        }
        if config.max_cqe > MAX_CQE {
            return Err(ProviderError::Invalid {
                what: "max_cqe",
                why: format!("{}: at most {MAX_CQE}", config.max_cqe),
            });
        }
        let guid = u64::from(random_u32()) << 32 | u64::from(random_u32());
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[8..].copy_from_slice(&guid.to_be_bytes());
        let dev = Arc::new(DeviceInner {
            name: config.name.clone(),
            gid,
            config,
            mrs: Padded(RwLock::new(MrTable::default())),
            qps: Mutex::new(Registry::default()),
            qps_version: AtomicU64::new(0),
            served_version: AtomicU64::new(0),
            steps: Padded(AtomicU64::new(0)),
            events: Mutex::new(VecDeque::new()),
            stop: AtomicBool::new(false),
            fatal: AtomicBool::new(false),
            sleeping: Padded(AtomicBool::new(false)),
            engine_thread: OnceLock::new(),
            next_id: AtomicU32::new(1),
            next_pd: AtomicU64::new(1),
        });
        let for_thread = Arc::clone(&dev);
        let handle = std::thread::Builder::new()
            .name(format!("selsig-soft {}", dev.name))
            .spawn(move || engine::run(for_thread))
            .map_err(|source| ProviderError::Os {
                verb: "spawn the NIC thread",
                source,
            })?;
        let _ = dev.engine_thread.set(handle.thread().clone());
        let engine = Arc::new(Engine {
            dev: Arc::clone(&dev),
            thread: Mutex::new(Some(handle)),
        });
        Ok(SoftDevice { dev, engine })
    }

    /// Opens a device with default settings and `personality`.
    pub fn with_personality(personality: Personality) -> Result<SoftDevice, ProviderError> {
        SoftDevice::open(SoftConfig::with_personality(personality))
    }

    /// The device's settings.
    pub fn config(&self) -> &SoftConfig {
        &self.dev.config
    }

    /// The device's GID (every QP's endpoint carries it).
    pub fn gid(&self) -> [u8; 16] {
        self.dev.gid
    }

    /// What makes this device fail on purpose, as a handle of its own (for a test or a
    /// scenario runner that holds no reference to the device).
    pub fn faults(&self) -> SoftFaults {
        SoftFaults {
            engine: Arc::clone(&self.engine),
        }
    }

    /// [`SoftFaults::inject_fatal`]: the device fails as at a fatal error.
    pub fn inject_fatal(&self) {
        self.faults().inject_fatal();
    }

    /// A completion queue created with `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`
    /// (`ibv_create_cq_ex`), as libmlx5 makes one: a completion that finds it full is lost
    /// without a word (no error state, no `IBV_EVENT_CQ_ERR`, the QP goes on). A ConnectX
    /// writes it over an entry not polled yet; the software NIC drops it, which loses as
    /// much. A [`SignaledQueue`](selsig::SignaledQueue) refuses such a CQ. On the rxe
    /// personality creation fails with `EOPNOTSUPP`, as the kernel's rxe refuses any CQ
    /// flag (`rxe_create_cq`).
    pub fn create_cq_ignore_overrun(&self, min_entries: u32) -> Result<SoftCq, ProviderError> {
        if self.dev.config.personality == Personality::Rxe {
            return Err(ProviderError::Os {
                verb: "ibv_create_cq_ex",
                source: std::io::Error::from_raw_os_error(
                    rustix::io::Errno::OPNOTSUPP.raw_os_error(),
                ),
            });
        }
        self.make_cq(min_entries, true)
    }

    fn make_cq(&self, min_entries: u32, ignore_overrun: bool) -> Result<SoftCq, ProviderError> {
        if min_entries == 0 || min_entries > self.dev.config.max_cqe {
            return Err(ProviderError::Invalid {
                what: "CQ size",
                why: format!(
                    "{min_entries} entries: {} supports 1 to {}",
                    self.dev.name, self.dev.config.max_cqe
                ),
            });
        }
        // Like mlx5: room for at least one more than asked, in a power of two, one kept empty.
        let capacity = (min_entries + 1).next_power_of_two() - 1;
        Ok(SoftCq {
            cq: Arc::new(CqInner {
                id: self.id(),
                ring: CompletionRing::new(capacity),
                error: AtomicBool::new(false),
                seen_consumer: crate::sync::AtomicU64::new(0),
                free_on_poll: self.dev.config.personality == Personality::Mlx5,
                overrun_is_fatal: self.dev.config.personality == Personality::Mlx5,
                ignore_overrun,
                events: CqEvents::new(),
                poll: Padded(Mutex::new(PollState::default())),
                send_queues: RwLock::new(HashMap::new()),
                recv_queues: RwLock::new(HashMap::new()),
            }),
            engine: Arc::clone(&self.engine),
        })
    }

    fn id(&self) -> u32 {
        self.dev.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Refuses an object of another device (as verbs refuses one of another context: the
    /// other device's NIC thread would write to the CQ too, and ids would collide).
    fn own(&self, what: &'static str, engine: &Arc<Engine>) -> Result<(), ProviderError> {
        if Arc::ptr_eq(engine, &self.engine) {
            Ok(())
        } else {
            Err(ProviderError::Invalid {
                what,
                why: format!("it belongs to another device, not {}", self.dev.name),
            })
        }
    }

    /// A 24-bit QP number no live QP has (object ids wrap; 0 and 1 are the special QPs of
    /// InfiniBand), held in the registry until the QP takes it.
    fn reserve_qpn(&self) -> Result<u32, ProviderError> {
        let mut reg = self.dev.qps.lock();
        let qpn = (0..=QPN_MASK)
            .map(|_| self.id() & QPN_MASK)
            .find(|n| *n > 1 && !reg.by_num.contains_key(n))
            .ok_or_else(|| ProviderError::Invalid {
                what: "queue pair count",
                why: format!("{} has no free QP number", self.dev.name),
            })?;
        reg.by_num.insert(qpn, Weak::new());
        Ok(qpn)
    }
}

/// QP numbers are 24 bits.
const QPN_MASK: u32 = 0x00ff_ffff;
/// The port's active MTU in bytes: the largest the IB MTUs allow, as on rxe0 over a link
/// of 4500 bytes.
pub(crate) const ACTIVE_MTU: u32 = 4096;

/// A protection domain.
#[derive(Debug)]
pub struct SoftPd {
    id: u64,
    /// Its device's NIC (which also tells the device it belongs to).
    engine: Arc<Engine>,
}

/// A registered memory region of a software device. Deregistered when dropped: from then
/// on the NIC cannot reach it, and work requests naming its keys fail.
pub struct SoftMr {
    mr: Arc<MrInner>,
    dev: Arc<DeviceInner>,
    _engine: Arc<Engine>,
}

impl fmt::Debug for SoftMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftMr")
            .field("addr", &format_args!("{:#x}", self.mr.addr))
            .field("len", &self.mr.len)
            .field("key", &format_args!("{:#x}", self.mr.key))
            .field("access", &self.mr.access)
            .finish()
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        // The NIC looks regions up under the read lock for a whole batch: once the write
        // lock is ours, it holds no reference to this region's key any more.
        self.dev.mrs.write().remove(self.mr.key);
    }
}

impl SoftMr {
    fn check(&self, offset: usize, len: usize) -> Result<(), ProviderError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.mr.len => Ok(()),
            _ => Err(ProviderError::OutOfBounds {
                offset,
                len,
                region_len: self.mr.len,
            }),
        }
    }
}

impl MemoryRegion for SoftMr {
    fn addr(&self) -> u64 {
        self.mr.addr
    }
    fn len(&self) -> usize {
        self.mr.len
    }
    fn lkey(&self) -> u32 {
        self.mr.key
    }
    fn rkey(&self) -> u32 {
        self.mr.key
    }
    fn access(&self) -> Access {
        self.mr.access
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<(), ProviderError> {
        self.check(offset, data.len())?;
        mem::write(&self.mr.words, offset, data);
        Ok(())
    }
    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), ProviderError> {
        self.check(offset, buf.len())?;
        mem::read(&self.mr.words, offset, buf);
        Ok(())
    }
}

/// An RC queue pair of a software device.
#[derive(Debug)]
pub struct SoftQp {
    qp: Arc<QpInner>,
    dev: Arc<DeviceInner>,
    /// Keeps the NIC thread running; the drop asks whether it still runs.
    engine: Arc<Engine>,
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        // Gone for its peer too: from now on the NIC delivers nothing to it.
        self.qp.destroy();
        let mut reg = self.dev.qps.lock();
        reg.list.retain(|q| !Arc::ptr_eq(q, &self.qp));
        reg.record(QpChange::Destroyed(Arc::clone(&self.qp)));
        drop(reg);
        let version = self.dev.bump();
        // Once destroyed, a QP executes nothing more (rxe stops its tasks, mlx5 its
        // hardware queue, before destroy returns): wait until the NIC no longer serves it.
        let unserved = self.wait_unserved(version);
        // mlx5 removes the destroyed QP's completions that were not polled from its CQs
        // (libmlx5 `mlx5_destroy_qp` → `__mlx5_cq_clean`); rxe leaves them.
        if self.dev.config.personality == Personality::Mlx5 && unserved {
            self.qp.send_cq.clean(self.qp.qpn);
            if !Arc::ptr_eq(&self.qp.recv_cq, &self.qp.send_cq) {
                self.qp.recv_cq.clean(self.qp.qpn);
            }
        }
        self.qp.send_cq.send_queues.write().remove(&self.qp.qpn);
        self.qp.recv_cq.recv_queues.write().remove(&self.qp.qpn);
        // The number is free for a new QP only now that nothing refers to it.
        self.dev.qps.lock().by_num.remove(&self.qp.qpn);
    }
}

/// How long a NIC thread may take no step before a destroy stops waiting for it (short
/// in unit tests, which wait it out).
const STUCK: Duration = Duration::from_millis(if cfg!(test) { 2_000 } else { 60_000 });

impl SoftQp {
    /// Waits until the NIC thread took a list of QPs of `version` or later (so it no
    /// longer serves this QP), or is gone (then nothing serves it). `false` only if a
    /// running NIC thread takes no step for [`STUCK`] (it no longer turns): the
    /// completions are then left in place, and `destroy_cleans_cq` was wrong. A long pass
    /// (up to [`engine::BUDGET`] work requests of up to 2 GiB for each QP) is waited out.
    fn wait_unserved(&self, version: u64) -> bool {
        let mut last = (self.dev.steps.load(Ordering::Relaxed), Instant::now());
        loop {
            if self.dev.served_version.load(Ordering::Acquire) >= version {
                return true;
            }
            if !self.engine.running() {
                // Nothing serves any QP any more.
                return true;
            }
            // A step of the NIC is bounded work (a group of copies of up to 2 GiB each): a
            // thread that takes none for that long no longer turns.
            let steps = self.dev.steps.load(Ordering::Relaxed);
            if steps != last.0 {
                last = (steps, Instant::now());
            } else if last.1.elapsed() > STUCK {
                return false;
            }
            if let Some(t) = self.dev.engine_thread.get() {
                t.unpark();
            }
            std::thread::yield_now();
        }
    }
}

impl SoftQp {
    /// The post lock, unless the QP is in a state that takes no sends (RESET, INIT, RTR):
    /// libmlx5 (rdma-core 40 and later) refuses those with `ENOMEM` (semantics 33).
    #[inline(always)]
    fn lock_for_posting(&self) -> Result<parking_lot::MutexGuard<'_, Producer>, PostWrError> {
        let p = self.qp.post.lock();
        let state = self.qp.state();
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(PostWrError {
                index: 0,
                failure: PostFailure::State(state),
                source: self.mlx5().then(|| errno(ENOMEM)),
            });
        }
        Ok(p)
    }

    /// A refused work request of a batch, with [`PostApi::Extended`]: as `ibv_wr_complete`
    /// does, nothing of the batch is posted (the slots written from `first` on stay
    /// unpublished, to be written again), and the refusal is of the batch, at index 0
    /// (semantics 44).
    /// Whether it took the batch back.
    #[cold]
    fn all_or_nothing(&self, p: &mut Producer, first: u64, e: &mut PostWrError) -> bool {
        let whole = self.dev.config.post_api == PostApi::Extended;
        if whole {
            p.head = first;
            e.index = 0;
        }
        whole
    }

    /// Whether the device has the mlx5 personality.
    fn mlx5(&self) -> bool {
        self.dev.config.personality == Personality::Mlx5
    }

    /// Checks work request `i` of a list and writes it to slot `head`, if that slot is free
    /// (the caller holds the post lock, `p`, and publishes the slots written).
    #[inline(always)]
    fn write_wqe(
        &self,
        p: &mut Producer,
        posting: &mut ring::Posting<'_>,
        head: u64,
        (i, wr): (usize, &SendWr<'_>),
    ) -> Result<(), PostWrError> {
        let qp = &self.qp;
        let (inline, len, local_addr, lkey) = match wr.local {
            Local::Empty => (&[][..], 0, 0, 0),
            Local::Sge(sge) => (&[][..], sge.length, sge.addr, sge.lkey),
            // Out of line, and in the values of one entry (the list's length, and the
            // number of its entries as the key), so that the path of one entry is as
            // before lists: it differs in which variants set `inline` alone.
            Local::Sges(list) => {
                let (len, count) = self.write_list(p, posting, head, (i, wr), list)?;
                (&[][..], len, 0, count)
            }
            Local::Inline(data) => {
                if data.len() > qp.caps.max_inline_data as usize {
                    // libmlx5's `set_data_inl_seg` answers ENOMEM, rxe EINVAL: semantics 33.
                    return Err(PostWrError {
                        index: i,
                        failure: PostFailure::InlineTooLong {
                            len: data.len(),
                            max: qp.caps.max_inline_data,
                        },
                        source: Some(errno(if self.mlx5() { ENOMEM } else { EINVAL })),
                    });
                }
                (data, data.len() as u32, 0, 0)
            }
        };
        if wr.opcode == Opcode::RdmaRead && matches!(wr.local, Local::Inline(_)) {
            return Err(invalid(i, "an RDMA READ cannot be inline"));
        }
        if let Some(why) = wr.atomic_refusal(!self.mlx5()) {
            return Err(invalid(i, why));
        }
        if u64::from(len) > selsig::MAX_MESSAGE_LEN {
            return Err(invalid(i, "longer than the largest message (2 GiB)"));
        }
        let limit = posting.limit();
        if head - p.freed >= limit {
            p.freed = qp.freed();
            if head - p.freed >= limit {
                return Err(PostWrError {
                    index: i,
                    failure: PostFailure::Full,
                    source: Some(errno(ENOMEM)),
                });
            }
        }
        // An atomic's operands travel in its slot's inline words (it has no inline data).
        let operands;
        let (opcode, inline) = match wr.opcode {
            Opcode::RdmaWrite => (ring::op::WRITE, inline),
            Opcode::RdmaWriteWithImm => (ring::op::WRITE_IMM, inline),
            Opcode::RdmaRead => (ring::op::READ, inline),
            Opcode::Send => (ring::op::SEND, inline),
            Opcode::SendWithImm => (ring::op::SEND_IMM, inline),
            Opcode::AtomicCmpSwp { compare, swap } => {
                operands = ring::atomic_operands(compare, swap);
                (ring::op::CMP_SWP, &operands[..])
            }
            Opcode::AtomicFetchAdd { add } => {
                operands = ring::atomic_operands(add, 0);
                (ring::op::FETCH_ADD, &operands[..])
            }
        };
        let wqe = Wqe {
            opcode,
            signaled: wr.signaled,
            // A list's entries are in the slot's inline words, as inline data is.
            inline: matches!(wr.local, Local::Inline(_) | Local::Sges(_)),
            len,
            local_addr,
            lkey,
            rkey: wr.remote.rkey,
            remote_addr: wr.remote.addr,
        };
        posting.write(head, &wqe, wr.wr_id, wr.imm_data, inline);
        Ok(())
    }

    /// Checks work request `i`'s scatter/gather list and writes its entries to slot
    /// `head`'s inline words, if that slot is free: the message's length and the number of
    /// entries, which its WQE then holds (an empty list is a zero-length operation).
    ///
    /// At most the QP's `max_send_sge` entries: libmlx5's `_mlx5_post_send` refuses more
    /// with `ENOMEM` (`wr->num_sge > qp->sq.qp_state_max_gs`, `max_gs` in RTS: semantics
    /// 33), rxe's provider with `EINVAL` (`validate_send_wr`: `num_sge > sq->max_sge`). A
    /// message of at most [`selsig::MAX_MESSAGE_LEN`] bytes in all. The other refusals
    /// `write_wqe` makes after this one come first here, as they do there, so that none of
    /// them is left once the entries are written.
    #[cold]
    #[inline(never)]
    fn write_list(
        &self,
        p: &mut Producer,
        posting: &mut ring::Posting<'_>,
        head: u64,
        (i, wr): (usize, &SendWr<'_>),
        list: &[Sge],
    ) -> Result<(u32, u32), PostWrError> {
        let max = self.qp.caps.max_send_sge;
        if list.len() > max as usize {
            return Err(PostWrError {
                index: i,
                failure: PostFailure::TooManySges {
                    count: list.len(),
                    max,
                },
                source: Some(errno(if self.mlx5() { ENOMEM } else { EINVAL })),
            });
        }
        if let Some(why) = wr.atomic_refusal(!self.mlx5()) {
            return Err(invalid(i, why));
        }
        let len: u64 = list.iter().map(|s| u64::from(s.length)).sum();
        if len > selsig::MAX_MESSAGE_LEN {
            return Err(invalid(i, "longer than the largest message (2 GiB)"));
        }
        let limit = posting.limit();
        if head - p.freed >= limit {
            p.freed = self.qp.freed();
            if head - p.freed >= limit {
                return Err(PostWrError {
                    index: i,
                    failure: PostFailure::Full,
                    source: Some(errno(ENOMEM)),
                });
            }
        }
        posting.write_list(head, list);
        // At most `MAX_MESSAGE_LEN` (2^31) bytes, and `max_send_sge` (32) entries.
        Ok((len as u32, list.len() as u32))
    }

    fn transition_error(
        &self,
        from: QpState,
        to: QpState,
        why: impl Into<String>,
    ) -> ProviderError {
        let _ = from;
        ProviderError::Transition {
            qp_num: self.qp.qpn,
            from: self.qp.state(),
            to,
            why: why.into(),
        }
    }
}

impl QueuePair for SoftQp {
    fn qp_num(&self) -> u32 {
        self.qp.qpn
    }

    fn record_execution_times(&self, on: bool) -> bool {
        self.qp.times.set(on);
        true
    }

    fn executed_at(&self, index: u64) -> Option<Instant> {
        self.qp.times.get(index)
    }

    fn caps(&self) -> QpCaps {
        self.qp.caps
    }

    fn send_cq_identity(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self.qp.send_cq) as usize)
    }

    fn recv_cq_is_send_cq(&self) -> bool {
        Arc::ptr_eq(&self.qp.recv_cq, &self.qp.send_cq)
    }

    fn destroy_cleans_cq(&self) -> bool {
        self.dev.config.personality == Personality::Mlx5
    }

    fn sq_sig_all(&self) -> bool {
        self.qp.sq_sig_all
    }

    fn state(&self) -> QpState {
        self.qp.state()
    }

    fn endpoint(&self, options: &ConnectOptions) -> Result<Endpoint, ProviderError> {
        options.check()?;
        if options.port != 1 {
            return Err(ProviderError::Invalid {
                what: "port",
                why: format!("{} has one port, 1, not {}", self.dev.name, options.port),
            });
        }
        Ok(Endpoint {
            qp_num: self.qp.qpn,
            psn: random_u32() & 0x00ff_ffff,
            lid: 0,
            gid: self.dev.gid,
            // The largest IB MTU is the port's active MTU (as rxe0's on a link of 4500).
            mtu: options.mtu.min(ACTIVE_MTU),
            // Not limited: the soft NIC serves every READ at once (only soft QPs connect
            // to it, and they do not read this).
            rd_atomic: 0,
        })
    }

    fn connect(&self, remote: &Endpoint, options: &ConnectOptions) -> Result<(), ProviderError> {
        let qp = &self.qp;
        options.check()?;
        if options.port != 1 {
            return Err(self.transition_error(
                QpState::Reset,
                QpState::Init,
                format!(
                    "port {} does not exist (the device has port 1)",
                    options.port
                ),
            ));
        }
        // Everything is checked before the QP changes: a refused connect leaves the QP as
        // it was (in the reset state, ready for another try), as a failed ibv_modify_qp does.
        let not_reset = || {
            self.transition_error(
                QpState::Reset,
                QpState::Init,
                "the QP is not in the reset state",
            )
        };
        if qp.state() != QpState::Reset {
            return Err(not_reset());
        }
        if remote.gid != self.dev.gid {
            return Err(self.transition_error(
                QpState::Init,
                QpState::Rtr,
                format!(
                    "the remote GID is not {}'s: software QPs connect only within one device",
                    self.dev.name
                ),
            ));
        }
        let peer = self.dev.qps.lock().by_num.get(&remote.qp_num).cloned();
        let Some(peer) = peer.filter(|p| p.strong_count() > 0) else {
            return Err(self.transition_error(
                QpState::Init,
                QpState::Rtr,
                format!("no QP {:#x} on {}", remote.qp_num, self.dev.name),
            ));
        };
        if !qp.transition(QpState::Reset, QpState::Init) {
            return Err(not_reset());
        }
        qp.access.store(options.access.bits(), Ordering::Release);
        qp.rnr_retry.store(options.rnr_retry, Ordering::Release);
        qp.retry_cnt.store(options.retry_cnt, Ordering::Release);
        // The smallest of what this side asks for, its port's and the remote side's (0:
        // not limited).
        let remote_mtu = if remote.mtu == 0 {
            u32::MAX
        } else {
            remote.mtu
        };
        qp.path_mtu.store(
            options.mtu.min(ACTIVE_MTU).min(remote_mtu),
            Ordering::Release,
        );
        *qp.peer.lock() = Some(peer);
        if !qp.transition(QpState::Init, QpState::Rtr) || !qp.transition(QpState::Rtr, QpState::Rts)
        {
            return Err(self.transition_error(
                QpState::Init,
                QpState::Rts,
                "the QP left the init state",
            ));
        }
        self.dev
            .qps
            .lock()
            .record(QpChange::Connected(Arc::clone(&self.qp)));
        self.dev.bump();
        self.dev.ring_doorbell();
        Ok(())
    }

    fn to_error(&self) -> Result<(), ProviderError> {
        // Any state but RESET may move to ERR (the kernel's `ib_modify_qp_is_ok`, for mlx5
        // and rxe alike).
        if self.qp.state() == QpState::Reset {
            return Err(self.transition_error(
                QpState::Reset,
                QpState::Err,
                "a QP in the reset state moves only to the init state",
            ));
        }
        self.qp.set_error();
        self.dev.bump();
        self.dev.ring_doorbell();
        Ok(())
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostWrError> {
        let mut p = self.lock_for_posting()?;
        let mut result = Ok(());
        let mut posting = self.qp.sq.posting(wrs.len());
        let first = p.head;
        for wr in wrs.iter().enumerate() {
            let head = p.head;
            result = self.write_wqe(&mut p, &mut posting, head, wr);
            if result.is_err() {
                break;
            }
            p.head += 1;
        }
        if let Err(e) = &mut result {
            self.all_or_nothing(&mut p, first, e);
        }
        // The doorbell: publish what was written, even if a later WR failed (as mlx5).
        posting.publish(p.head);
        drop(p);
        self.dev.ring_doorbell();
        result
    }

    /// Each work request is written to its slot as `wrs` yields it, under the QP's post
    /// lock (a `wrs` that posts to this QP waits for itself), and the slots published once
    /// `wrs` ends: if `wrs` panics, the slots it filled stay unpublished, to be written
    /// again by the next post.
    fn post_send_iter<'a, I>(&self, max: usize, wrs: I) -> Result<usize, PostWrError>
    where
        I: Iterator<Item = SendWr<'a>>,
    {
        let mut p = self.lock_for_posting()?;
        let mut result = Ok(());
        let mut posting = self.qp.sq.posting(max);
        let mut head = p.head;
        for (i, wr) in wrs.take(max).enumerate() {
            // (Only an error is stored: storing each `Ok` cost a few instructions a WQE.)
            if let Err(e) = self.write_wqe(&mut p, &mut posting, head, (i, &wr)) {
                result = Err(e);
                break;
            }
            head += 1;
        }
        if let Err(e) = &mut result {
            let first = p.head;
            if self.all_or_nothing(&mut p, first, e) {
                head = first;
            }
        }
        let posted = head - p.head;
        p.head = head;
        posting.publish(head);
        drop(p);
        self.dev.ring_doorbell();
        result.map(|()| posted as usize)
    }

    /// From the length on which WQEs are streamed. The words of a shorter list are plain
    /// stores, each waiting for its slot's line to come back from the NIC thread's core:
    /// interleaved with the tracker's stores, fewer of those lines are requested at once
    /// than when the list is written in one go (measured in `selsig bench`, every WRITE
    /// signaled: about 12% slower). Streamed stores do not wait, and a long list written
    /// as it comes saves its copy (every 64, depth 8192, lists of 512: 58.3 to 66.3 M
    /// WR/s, medians of eight alternating runs on a 2-vCPU Xeon guest).
    fn post_send_iter_min(&self) -> usize {
        ring::STREAM_MIN
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), PostWrError> {
        let qp = &self.qp;
        let mut head = qp.recv_post.lock();
        let state = qp.state();
        if state == QpState::Reset {
            // libmlx5's `mlx5_post_recv` answers EINVAL (`qp_state_max_gs`): semantics 33.
            return Err(PostWrError {
                index: 0,
                failure: PostFailure::State(state),
                source: self.mlx5().then(|| errno(EINVAL)),
            });
        }
        let mut result = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if *head - qp.rq.freed(qp.free_on_poll) >= qp.rq.limit() {
                result = Err(PostWrError {
                    index: i,
                    failure: PostFailure::Full,
                    source: Some(errno(ENOMEM)),
                });
                break;
            }
            let (addr, len, lkey) = wr.sge.map_or((0, 0, 0), |s| (s.addr, s.length, s.lkey));
            qp.rq.write(
                *head,
                &Rqe {
                    wr_id: wr.wr_id,
                    addr,
                    len,
                    lkey,
                },
            );
            *head += 1;
        }
        qp.rq.publish(*head);
        drop(head);
        self.dev.ring_doorbell();
        result
    }
}

/// `ENOMEM`: a full queue, and more on mlx5 (semantics 11, 33).
const ENOMEM: i32 = 12;
/// `EINVAL`.
const EINVAL: i32 = 22;
/// The scatter/gather entries an rxe send work request may have: the kernel's
/// `RXE_MAX_SGE` (`rxe_param.h`), the device's `max_send_sge`.
const RXE_MAX_SGE: u32 = 32;

fn errno(code: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(code)
}

/// Work request `index` refused as invalid, with `EINVAL` (rxe's errno for it).
fn invalid(index: usize, why: &'static str) -> PostWrError {
    PostWrError {
        index,
        failure: PostFailure::Invalid(why),
        source: Some(errno(EINVAL)),
    }
}

impl Device for SoftDevice {
    type Pd = SoftPd;
    type Mr = SoftMr;
    type Cq = SoftCq;
    type Qp = SoftQp;

    fn name(&self) -> &str {
        &self.dev.name
    }

    fn alloc_pd(&self) -> Result<SoftPd, ProviderError> {
        Ok(SoftPd {
            id: self.dev.next_pd.fetch_add(1, Ordering::Relaxed),
            engine: Arc::clone(&self.engine),
        })
    }

    fn reg_mr(&self, pd: &SoftPd, len: usize, access: Access) -> Result<SoftMr, ProviderError> {
        self.own("protection domain", &pd.engine)?;
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !access.contains(Access::LOCAL_WRITE)
        {
            // As verbs: ibv_reg_mr(3) fails with EINVAL.
            return Err(ProviderError::Invalid {
                what: "access flags",
                why: format!(
                    "{access}: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too (ibv_reg_mr(3))"
                ),
            });
        }
        if len > self.dev.config.max_mr_size {
            return Err(ProviderError::Invalid {
                what: "region length",
                why: format!(
                    "{len} bytes is more than {} supports ({} bytes)",
                    self.dev.name, self.dev.config.max_mr_size
                ),
            });
        }
        let no_key = || ProviderError::Invalid {
            what: "region count",
            why: format!(
                "{} holds at most {} regions",
                self.dev.name,
                crate::mr::MAX_REGIONS
            ),
        };
        if self.dev.mrs.read().is_full() {
            return Err(no_key());
        }
        // Allocated (and zeroed) before the table is locked for writing: the NIC thread
        // reads the table for every work request.
        let words = crate::mem::zeroed(len).ok_or_else(|| ProviderError::Os {
            verb: "register a memory region",
            source: std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot allocate {len} bytes"),
            ),
        })?;
        let mut table = self.dev.mrs.write();
        let key = table.allocate_key().ok_or_else(no_key)?;
        let mr = Arc::new(MrInner::new(words, len, access, pd.id, key));
        table.insert(Arc::clone(&mr));
        Ok(SoftMr {
            mr,
            dev: Arc::clone(&self.dev),
            _engine: Arc::clone(&self.engine),
        })
    }

    fn create_cq(&self, min_entries: u32) -> Result<SoftCq, ProviderError> {
        self.make_cq(min_entries, false)
    }

    fn create_qp(
        &self,
        pd: &SoftPd,
        send_cq: &SoftCq,
        recv_cq: &SoftCq,
        init: &QpInit,
    ) -> Result<SoftQp, ProviderError> {
        self.own("protection domain", &pd.engine)?;
        self.own("send CQ", &send_cq.engine)?;
        self.own("receive CQ", &recv_cq.engine)?;
        let req = init.caps;
        if req.max_recv_sge > 1 {
            return Err(ProviderError::Invalid {
                what: "max_recv_sge",
                why: format!(
                    "{} supports one scatter/gather entry per receive work request",
                    self.dev.name
                ),
            });
        }
        let personality = self.dev.config.personality;
        // The capacities read back, the slots each ring really holds, and the inline data
        // each send WQE holds.
        let (caps, send_limit, recv_limit, inline_room) = match personality {
            Personality::Mlx5 => {
                // libmlx5's arithmetic (semantics 13). The verbs provider asks for at least
                // one entry of each kind, so the same request sizes the same here.
                let request = Mlx5Request {
                    max_send_wr: req.max_send_wr,
                    max_recv_wr: req.max_recv_wr,
                    max_send_sge: req.max_send_sge.max(1),
                    max_recv_sge: req.max_recv_sge.max(1),
                    max_inline_data: req.max_inline_data,
                    send_ops: SendOps::Default,
                };
                let sized = mlx5_sizing::size_rc_qp(&mlx5_limits(&self.dev.config), &request)
                    .map_err(|e| ProviderError::Invalid {
                        what: e.what(),
                        why: format!("{}: {e}", self.dev.name),
                    })?;
                let caps = QpCaps {
                    max_send_wr: sized.max_send_wr,
                    max_recv_wr: sized.max_recv_wr,
                    max_send_sge: sized.max_send_sge,
                    max_recv_sge: sized.max_recv_sge,
                    max_inline_data: sized.max_inline_data,
                };
                // A QP without a send queue reads `max_inline_data` back as asked, and
                // has no WQE to hold it. A WQE holds its inline data or its scatter/gather
                // list (libmlx5's `max_send_sge` as asked, at most what fits a WQE:
                // `mlx5_calc_send_wqe`'s `max_gather`, 20 on a ConnectX of 512-byte WQEs).
                let room = if sized.max_send_wr == 0 {
                    0
                } else {
                    (sized.max_inline_data as usize)
                        .max(sized.max_send_sge as usize * ring::SGE_BYTES)
                };
                (caps, sized.max_send_wr, sized.max_recv_wr, room)
            }
            Personality::Rxe => {
                let max = self.dev.config.max_qp_wr;
                for (what, n) in [
                    ("max_send_wr", req.max_send_wr),
                    ("max_recv_wr", req.max_recv_wr),
                ] {
                    // 0 is a queue pair that only sends, or only receives.
                    if n > max {
                        return Err(ProviderError::Invalid {
                            what,
                            why: format!("{n}: {} supports 0 to {max}", self.dev.name),
                        });
                    }
                }
                if req.max_inline_data as usize > MAX_INLINE {
                    return Err(ProviderError::Invalid {
                        what: "max_inline_data",
                        why: format!(
                            "{} bytes: {} supports up to {MAX_INLINE}",
                            req.max_inline_data, self.dev.name
                        ),
                    });
                }
                // The kernel's `rxe_qp_chk_cap` refuses more entries than the device's
                // `max_send_sge` (`RXE_MAX_SGE`) with `EINVAL`.
                if req.max_send_sge > RXE_MAX_SGE {
                    return Err(ProviderError::Invalid {
                        what: "max_send_sge",
                        why: format!(
                            "{}: {} supports up to {RXE_MAX_SGE}",
                            req.max_send_sge, self.dev.name
                        ),
                    });
                }
                // rxe sizes a WQE for the larger of its list and its inline data and, in
                // Linux 6.1, reads both back from that size (`rxe_qp_init_req`, `rxe_qp.c`:
                // `wqe_size = max(max_send_sge * sizeof(struct ib_sge), max_inline_data)`,
                // `max_send_sge = wqe_size / sizeof(struct ib_sge)`, `max_inline_data =
                // wqe_size`; semantics 42): a QP asked for 2 entries and no inline data
                // reads back 2 entries and 32 bytes, one asked for 1 entry and 64 bytes 4
                // entries and 64 bytes, one asked for 32 entries 32 and 512 bytes. (The
                // verbs provider asks for at least one entry.)
                let wqe_size = (req.max_send_sge.max(1) as usize * ring::SGE_BYTES)
                    .max(req.max_inline_data as usize);
                let caps = QpCaps {
                    max_send_wr: req.max_send_wr,
                    max_recv_wr: req.max_recv_wr,
                    max_send_sge: (wqe_size / ring::SGE_BYTES) as u32,
                    max_recv_sge: 1,
                    max_inline_data: wqe_size as u32,
                };
                (
                    caps,
                    (req.max_send_wr + 1).next_power_of_two() - 1,
                    (req.max_recv_wr + 1).next_power_of_two() - 1,
                    wqe_size,
                )
            }
        };
        let qpn = self.reserve_qpn()?;
        let sq = Arc::new(SendRing::with_inline(send_limit, inline_room));
        let rq = Arc::new(RecvRing::new(recv_limit));
        let qp = Arc::new(QpInner {
            qpn,
            pd: pd.id,
            caps,
            sq_sig_all: init.sq_sig_all,
            times: ExecTimes::new(sq.slots()),
            sq: Arc::clone(&sq),
            rq: Arc::clone(&rq),
            send_cq: Arc::clone(&send_cq.cq),
            recv_cq: Arc::clone(&recv_cq.cq),
            state: AtomicU8::new(QpState::Reset as u8),
            access: AtomicU32::new(0),
            rnr_retry: AtomicU8::new(7),
            retry_cnt: AtomicU8::new(7),
            path_mtu: AtomicU32::new(ACTIVE_MTU),
            peer: Mutex::new(None),
            free_on_poll: personality == Personality::Mlx5,
            post: Padded(Mutex::new(Producer::default())),
            recv_post: Padded(Mutex::new(0)),
        });
        send_cq.cq.send_queues.write().insert(qpn, sq);
        recv_cq.cq.recv_queues.write().insert(qpn, rq);
        let mut reg = self.dev.qps.lock();
        reg.list.push(Arc::clone(&qp));
        reg.by_num.insert(qpn, Arc::downgrade(&qp));
        reg.record(QpChange::Created(Arc::clone(&qp)));
        drop(reg);
        self.dev.bump();
        Ok(SoftQp {
            qp,
            dev: Arc::clone(&self.dev),
            engine: Arc::clone(&self.engine),
        })
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.dev.events.lock().pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use selsig::{CompletionQueue, WcStatus, WorkCompletion, connect_pair};

    #[test]
    fn a_region_of_another_pd_stays_out_of_reach_past_2_to_the_32_pds() {
        let dev = SoftDevice::open(SoftConfig::default()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        // As if 2^32 protection domains had been allocated since.
        dev.dev.next_pd.store(pd.id + (1 << 32), Ordering::Relaxed);
        let other_pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(4).unwrap();
        let init = QpInit {
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: 1,
                ..QpCaps::default()
            },
            sq_sig_all: false,
        };
        let a = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
        let b = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
        connect_pair(&a, &b, &selsig::ConnectOptions::default()).unwrap();
        let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
        let other = dev
            .reg_mr(&other_pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        local.write(0, &[0xab; 64]).unwrap();
        a.post_send(&[SendWr {
            wr_id: 1,
            opcode: Opcode::RdmaWrite,
            local: Local::Sge(local.sge(0, 64)),
            remote: other.remote(0),
            imm_data: 0,
            signaled: true,
        }])
        .unwrap();
        let mut wc = [WorkCompletion::new(0, WcStatus::Success, 0)];
        let start = Instant::now();
        while cq.poll(&mut wc).unwrap() == 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "no completion");
            std::thread::yield_now();
        }
        let mut landed = [0u8; 1];
        other.read(0, &mut landed).unwrap();
        assert_eq!((wc[0].status, landed[0]), (WcStatus::RemAccessErr, 0));
    }

    fn qp_init(send: u32) -> QpInit {
        QpInit {
            caps: QpCaps {
                max_send_wr: send,
                max_recv_wr: 1,
                ..QpCaps::default()
            },
            sq_sig_all: false,
        }
    }

    /// A signaled WRITE of 8 bytes from the start of `local` to the start of `remote`.
    fn write_8<'a>(wr_id: u64, local: &SoftMr, remote: &SoftMr) -> SendWr<'a> {
        SendWr {
            wr_id,
            opcode: Opcode::RdmaWrite,
            local: Local::Sge(local.sge(0, 8)),
            remote: remote.remote(0),
            imm_data: 0,
            signaled: true,
        }
    }

    fn wait_one(cq: &SoftCq) -> WorkCompletion {
        let mut wc = [WorkCompletion::new(0, WcStatus::Success, 0)];
        let start = Instant::now();
        while cq.poll(&mut wc).unwrap() == 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "no completion");
            std::thread::yield_now();
        }
        wc[0]
    }

    #[test]
    fn qp_numbers_stay_unique_when_the_24_bit_space_wraps() {
        let dev = SoftDevice::open(SoftConfig::default()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(4).unwrap();
        let a = dev.create_qp(&pd, &cq, &cq, &qp_init(1)).unwrap();
        let b = dev.create_qp(&pd, &cq, &cq, &qp_init(1)).unwrap();
        connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
        // The id counter wraps onto `a`'s number, then `b`'s, both live: skipped.
        dev.dev
            .next_id
            .store(a.qp_num() + (1 << 24), Ordering::Relaxed);
        let x = dev.create_qp(&pd, &cq, &cq, &qp_init(1)).unwrap();
        assert_eq!(x.qp_num(), (a.qp_num() + 2) & QPN_MASK);
        // Destroying the newcomer leaves `a` working: its completions still reach its CQ.
        drop(x);
        let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
        let remote = dev
            .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        a.post_send(&[write_8(1, &local, &remote)]).unwrap();
        let wc = wait_one(&cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.qp_num),
            (1, WcStatus::Success, a.qp_num())
        );
    }

    /// A QP destroyed after its completions were polled, and a new QP given its number on
    /// the same CQ: polling the new QP's completions frees the new QP's slots (the destroy
    /// makes the poller forget the old QP's ring).
    #[test]
    fn a_reused_qp_number_frees_the_new_queues_slots() {
        let dev = SoftDevice::open(SoftConfig::default()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
        let remote = dev
            .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let write = |wr_id| write_8(wr_id, &local, &remote);
        let a = dev.create_qp(&pd, &cq, &cq, &qp_init(1)).unwrap();
        let b = dev.create_qp(&pd, &cq, &cq, &qp_init(1)).unwrap();
        connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
        a.post_send(&[write(1)]).unwrap();
        assert_eq!(wait_one(&cq).status, WcStatus::Success);
        let qpn = a.qp_num();
        drop(a);
        drop(b);
        dev.dev.next_id.store(qpn, Ordering::Relaxed);
        let a2 = dev.create_qp(&pd, &cq, &cq, &qp_init(1)).unwrap();
        assert_eq!(a2.qp_num(), qpn, "the number is reused");
        let b2 = dev.create_qp(&pd, &cq, &cq, &qp_init(1)).unwrap();
        connect_pair(&a2, &b2, &ConnectOptions::default()).unwrap();
        for wr_id in 2..6 {
            a2.post_send(&[write(wr_id)])
                .expect("the polled completion freed the slot");
            let wc = wait_one(&cq);
            assert_eq!(
                (wc.wr_id, wc.status, wc.qp_num),
                (wr_id, WcStatus::Success, qpn)
            );
        }
    }

    /// rxe retransmits forever to a responder that does not answer (retry count 7), as a
    /// timer does: the NIC thread parks meanwhile instead of spinning on the stalled
    /// queue (a parked thread takes a step per wake-up, every few milliseconds).
    #[test]
    fn the_nic_parks_while_a_queue_waits_for_a_responder() {
        let dev = SoftDevice::open(SoftConfig::with_personality(Personality::Rxe)).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(4).unwrap();
        let a = dev.create_qp(&pd, &cq, &cq, &qp_init(2)).unwrap();
        let b = dev.create_qp(&pd, &cq, &cq, &qp_init(1)).unwrap();
        connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
        let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
        let remote = dev
            .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        b.to_error().unwrap();
        a.post_send(&[write_8(1, &local, &remote)]).unwrap();
        // Past the spins and yields of going idle.
        std::thread::sleep(Duration::from_millis(100));
        let before = dev.dev.steps.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(200));
        let steps = dev.dev.steps.load(Ordering::Relaxed).wrapping_sub(before);
        assert!(
            steps < 1_000,
            "{steps} steps in 200 ms: the NIC thread spins"
        );
        // Still waiting, not failed: the error state flushes it.
        let mut wc = [WorkCompletion::new(0, WcStatus::Success, 0)];
        assert_eq!(cq.poll(&mut wc).unwrap(), 0);
        a.to_error().unwrap();
        let wc = wait_one(&cq);
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::WrFlushErr));
    }

    #[test]
    fn a_device_name_with_a_nul_character_is_refused() {
        let config = SoftConfig {
            name: "soft\0x".into(),
            ..SoftConfig::default()
        };
        let Err(err) = SoftDevice::open(config) else {
            panic!("a NUL in the name was accepted");
        };
        let err = err.to_string();
        assert!(err.contains("device name") && err.contains("NUL"), "{err}");
    }

    #[test]
    fn a_destroy_waits_for_a_nic_pass_that_takes_steps_however_long() {
        let dev = SoftDevice::open(SoftConfig::default()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(4).unwrap();
        let init = QpInit {
            caps: QpCaps {
                max_send_wr: 1,
                ..QpCaps::default()
            },
            sq_sig_all: false,
        };
        let qp = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
        // The NIC thread blocks where it takes its next list of QPs, as if in a long pass,
        // while its steps go on (counted here in its place) for three times `STUCK`.
        let registry = dev.dev.qps.lock();
        let version = dev.dev.bump();
        let waiter = std::thread::spawn(move || {
            let start = Instant::now();
            let unserved = qp.wait_unserved(version);
            (unserved, start.elapsed(), qp)
        });
        let pass = 3 * STUCK;
        let start = Instant::now();
        while start.elapsed() < pass {
            std::thread::sleep(STUCK / 10);
            dev.dev.step();
        }
        let (unserved, waited, qp) = {
            drop(registry);
            waiter.join().unwrap()
        };
        assert!(unserved, "gave up after {waited:?}");
        assert!(waited >= pass, "{waited:?}");
        // A thread that takes no step for `STUCK` no longer turns: the wait ends.
        let registry = dev.dev.qps.lock();
        let version = dev.dev.bump();
        let start = Instant::now();
        assert!(!qp.wait_unserved(version));
        let waited = start.elapsed();
        assert!(waited >= STUCK && waited < 4 * STUCK, "{waited:?}");
        drop(registry);
    }
}

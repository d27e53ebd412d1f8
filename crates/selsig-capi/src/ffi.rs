//! The exported functions and types: see the crate documentation.

use std::ffi::{c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use selsig::{
    CompletionError, ConfigError, CqBudget, CqCredits, Outcome, Policy, PostError, QueueState,
    Retired, RollbackError, SendTracker, Seq, Signal, TrackerConfig, WcStatus, WorkCompletion,
};
use selsig_verbs::sys::ibv_wc;

/// What a call did: `SELSIG_OK`, or why it did nothing (a batch call says how far it got).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum selsig_result {
    /// Done.
    SELSIG_OK = 0,
    /// A required pointer argument is NULL.
    SELSIG_ERR_NULL = 1,
    /// An argument is out of range: a capacity of 0, an interval of 0, an unknown policy
    /// or flag.
    SELSIG_ERR_INVALID = 2,
    /// The send queue is full: poll completions first.
    SELSIG_ERR_SQ_FULL = 3,
    /// The CQ credits are all taken: poll completions first.
    SELSIG_ERR_CQ_FULL = 4,
    /// The queue is in the error state: no more posts; every outstanding work request
    /// still retires (flushed).
    SELSIG_ERR_QUEUE_ERROR = 5,
    /// The queue is draining: only markers are posted.
    SELSIG_ERR_DRAINING = 6,
    /// No sequence number is left below the `wr_id` tag.
    SELSIG_ERR_SEQ_EXHAUSTED = 7,
    /// The completion belongs to another QP than the tracker's.
    SELSIG_ERR_WRONG_QP = 8,
    /// The completion is not one of the tracker's sends (a receive's, or a `wr_id`
    /// without the tag).
    SELSIG_ERR_NOT_A_SEND = 9,
    /// The completion's `wr_id` was never posted by this tracker.
    SELSIG_ERR_UNKNOWN_WR = 10,
    /// The completion's work request was already retired by an earlier completion.
    SELSIG_ERR_ALREADY_RETIRED = 11,
    /// A successful completion of a work request posted unsignaled.
    SELSIG_ERR_UNSIGNALED = 12,
    /// The completion comes before an earlier signaled work request's.
    SELSIG_ERR_OUT_OF_ORDER = 13,
    /// A successful completion after the queue entered the error state.
    SELSIG_ERR_SUCCESS_AFTER_ERROR = 14,
    /// A rollback from a `wr_id` that is not outstanding.
    SELSIG_ERR_NOT_OUTSTANDING = 15,
    /// The output array is too small for what must be handed back (nothing was done).
    SELSIG_ERR_BUFFER_TOO_SMALL = 16,
    /// The tracker for a send queue this large cannot be allocated.
    SELSIG_ERR_ALLOC = 17,
    /// A bug inside libselsig (a panic, caught at the boundary).
    SELSIG_ERR_PANIC = 18,
    /// The device was lost (`selsig_tracker_device_lost`): nothing more can be posted.
    SELSIG_ERR_DEVICE_LOST = 19,
}

use selsig_result::*;

/// `selsig_config.policy`: signal every `interval`-th work request.
pub const SELSIG_POLICY_EVERY: u32 = 0;
/// `selsig_config.policy`: signal every work request.
pub const SELSIG_POLICY_ALWAYS: u32 = 1;
/// `selsig_config.policy`: signal only when asked or to keep the queue from deadlocking.
pub const SELSIG_POLICY_NEVER: u32 = 2;
/// `selsig_config.policy`: at the latest every `interval`-th work request, or when the
/// oldest unsignaled one is `max_lag_ns` old.
pub const SELSIG_POLICY_ADAPTIVE: u32 = 3;

/// `selsig_config.flags`: the QP was created with `sq_sig_all = 1`.
pub const SELSIG_SQ_SIG_ALL: u32 = 1;
/// `selsig_config.flags`: every send's `wr_id` has bit 63 set, and completions without it
/// are not sends: set it when the QP's receive completions go to the same CQ (post
/// receives with bit 63 clear), since an error completion's opcode is undefined.
pub const SELSIG_TAG_SENDS: u32 = 2;
/// `selsig_config.flags`: refuse completions of QPs other than `qp_num`.
pub const SELSIG_CHECK_QP_NUM: u32 = 4;
/// `selsig_config.flags`: do not read the clock (no confirmation-lag statistics); not
/// with `SELSIG_POLICY_ADAPTIVE`.
pub const SELSIG_NO_CLOCK: u32 = 8;

const FLAGS: u32 = SELSIG_SQ_SIG_ALL | SELSIG_TAG_SENDS | SELSIG_CHECK_QP_NUM | SELSIG_NO_CLOCK;

/// Bit 63: the `wr_id` tag of `SELSIG_TAG_SENDS`.
pub const SELSIG_WR_ID_TAG: u64 = 0x8000_0000_0000_0000;
const _: () = assert!(SELSIG_WR_ID_TAG == selsig::SEND_WR_ID_BIT);

/// `flags` of a post: signal this work request (the last of a batch).
pub const SELSIG_POST_SIGNAL: u32 = 1;

/// `IBV_SEND_SIGNALED`, as `selsig_posted.send_flags` carries it.
pub const SELSIG_IBV_SEND_SIGNALED: u32 = 1 << 1;

/// `selsig_retired.outcome`: the work request completed.
pub const SELSIG_COMPLETED: u16 = 0;
/// `selsig_retired.outcome`: it failed with `selsig_retired.status`.
pub const SELSIG_FAILED: u16 = 1;
/// `selsig_retired.outcome`: it was flushed (`IBV_WC_WR_FLUSH_ERR`): it did not execute,
/// or not wholly.
pub const SELSIG_FLUSHED: u16 = 2;
/// `selsig_retired.outcome`: unknown: the device was lost (`IBV_EVENT_DEVICE_FATAL`)
/// before a completion said; it may have executed, in part, or not at all. `status` is
/// `IBV_WC_GENERAL_ERR` (no completion gave one). The device executes nothing more: the
/// buffer is the caller's again.
pub const SELSIG_DEVICE_LOST: u16 = 3;

/// `selsig_tracker_state`: accepting posts.
pub const SELSIG_STATE_READY: u32 = 0;
/// `selsig_tracker_state`: draining: only markers.
pub const SELSIG_STATE_DRAINING: u32 = 1;
/// `selsig_tracker_state`: a work request failed; every later one is flushed.
pub const SELSIG_STATE_ERROR: u32 = 2;
/// `selsig_tracker_state`: the device was lost; nothing is outstanding.
pub const SELSIG_STATE_DEVICE_LOST: u32 = 3;

/// How one send queue is tracked. Fill it with `selsig_config_init`, then change what
/// differs.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct selsig_config {
    /// The send queue's capacity: `cap.max_send_wr` as `ibv_create_qp` read it back, never
    /// the value asked for.
    pub sq_capacity: u32,
    /// The CQ credits of this send queue: the `cqe` that `ibv_create_cq` read back, less
    /// the receive slots whose completions go to the same CQ, less other send queues'
    /// credits on it. Every outstanding work request holds one, since an error or a flush
    /// makes a completion for every one. Ignored with `pool`.
    pub cq_capacity: u32,
    /// `SELSIG_POLICY_EVERY` (the default), `_ALWAYS`, `_NEVER` or `_ADAPTIVE`.
    pub policy: u32,
    /// The interval of `SELSIG_POLICY_EVERY`, the longest run of `SELSIG_POLICY_ADAPTIVE`
    /// (default 4).
    pub interval: u32,
    /// The lag bound of `SELSIG_POLICY_ADAPTIVE`, in nanoseconds.
    pub max_lag_ns: u64,
    /// `SELSIG_SQ_SIG_ALL`, `SELSIG_TAG_SENDS`, `SELSIG_CHECK_QP_NUM`, `SELSIG_NO_CLOCK`.
    pub flags: u32,
    /// The QP number, checked with `SELSIG_CHECK_QP_NUM`.
    pub qp_num: u32,
    /// A CQ credit pool shared with the other send queues on the CQ, or NULL.
    pub pool: *const selsig_pool,
}

/// A tracker: one send queue's bookkeeping. Made by `selsig_tracker_create`, freed by
/// `selsig_tracker_destroy`. Not thread-safe: one thread at a time.
pub struct selsig_tracker {
    inner: SendTracker<u64>,
    /// Whether to read the clock; else the time given is the creation's.
    clock: bool,
    epoch: Instant,
}

/// A pool of CQ credits shared by the send queues of one CQ. Thread-safe.
pub struct selsig_pool {
    credits: CqCredits,
}

/// One registered work request: post it with this `wr_id`, and `send_flags |=` these.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct selsig_posted {
    /// The `wr_id` to post.
    pub wr_id: u64,
    /// `SELSIG_IBV_SEND_SIGNALED` (`IBV_SEND_SIGNALED`) or 0.
    pub send_flags: u32,
}

/// One retired work request, in posting order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct selsig_retired {
    /// The cookie given to the post.
    pub cookie: u64,
    /// Its sequence number (1, 2, ... by default).
    pub seq: u64,
    /// Its `enum ibv_wc_status`: `IBV_WC_SUCCESS`, the failure's, or
    /// `IBV_WC_WR_FLUSH_ERR` (`IBV_WC_GENERAL_ERR` when the device was lost).
    pub status: u32,
    /// `SELSIG_COMPLETED`, `SELSIG_FAILED`, `SELSIG_FLUSHED` or `SELSIG_DEVICE_LOST`.
    pub outcome: u16,
    /// 1 when it was posted signaled.
    pub signaled: u16,
}

/// Counters of one tracker.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct selsig_stats {
    /// Work requests posted (markers not counted).
    pub posted: u64,
    /// Of them, posted signaled.
    pub signaled: u64,
    /// Markers posted (`selsig_tracker_confirm_all`, `selsig_tracker_post_marker`).
    pub markers: u64,
    /// Completions accepted.
    pub cqes: u64,
    /// Completions refused.
    pub rejected_cqes: u64,
    /// Work requests retired completed.
    pub completed: u64,
    /// Work requests retired failed.
    pub failed: u64,
    /// Work requests retired flushed.
    pub flushed: u64,
}

/// Runs `body`, turning a panic into `SELSIG_ERR_PANIC`.
fn boundary(body: impl FnOnce() -> selsig_result) -> selsig_result {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(SELSIG_ERR_PANIC)
}

/// `ptr` as a reference, or `SELSIG_ERR_NULL`.
macro_rules! arg {
    ($ptr:expr) => {
        match $ptr.is_null() {
            true => return SELSIG_ERR_NULL,
            // SAFETY: not NULL, and the caller gives a valid, aligned pointer to a live
            // object not used elsewhere during the call (the header's contract).
            false => unsafe { &mut *$ptr },
        }
    };
}

/// `ptr` as a shared reference, or `SELSIG_ERR_NULL`.
macro_rules! arg_ref {
    ($ptr:expr) => {
        match $ptr.is_null() {
            true => return SELSIG_ERR_NULL,
            // SAFETY: not NULL, and the caller gives a valid, aligned pointer to a live
            // object (the header's contract).
            false => unsafe { &*$ptr },
        }
    };
}

/// `n` elements at `ptr` (NULL allowed when `n` is 0), or `SELSIG_ERR_NULL`.
macro_rules! slice {
    ($ptr:expr, $n:expr) => {
        match ($ptr.is_null(), $n) {
            (_, 0) => &[][..],
            (true, _) => return SELSIG_ERR_NULL,
            // SAFETY: not NULL, and the caller gives `n` valid, initialized elements there
            // (the header's contract).
            (false, n) => unsafe { std::slice::from_raw_parts($ptr, n) },
        }
    };
}

/// `n` writable elements at `ptr` (NULL allowed when `n` is 0), or `SELSIG_ERR_NULL`.
macro_rules! slice_mut {
    ($ptr:expr, $n:expr) => {
        match ($ptr.is_null(), $n) {
            (_, 0) => &mut [][..],
            (true, _) => return SELSIG_ERR_NULL,
            // SAFETY: not NULL, and the caller gives `n` writable elements there, used by
            // nothing else during the call (the header's contract); they are plain data,
            // and only written.
            (false, n) => unsafe { std::slice::from_raw_parts_mut($ptr, n) },
        }
    };
}

/// The message of a result code: a static, NUL-terminated string ("unknown result code"
/// for a value that is none).
#[unsafe(no_mangle)]
pub extern "C" fn selsig_strerror(code: c_int) -> *const c_char {
    let text: &'static [u8] = match code {
        0 => b"success\0",
        1 => b"a required pointer argument is NULL\0",
        2 => b"an argument is out of range (a capacity or interval of 0, an unknown policy or flag)\0",
        3 => b"the send queue is full: poll completions first\0",
        4 => b"the completion queue credits are all taken: poll completions first\0",
        5 => b"the queue is in the error state: no more posts\0",
        6 => b"the queue is draining and accepts no more work requests\0",
        7 => b"no sequence number is left\0",
        8 => b"the completion belongs to another queue pair\0",
        9 => b"the completion is not a send of this tracker (a receive, or a wr_id without the tag)\0",
        10 => b"the completion's wr_id was never posted by this tracker\0",
        11 => b"the completion's work request was already retired\0",
        12 => b"a successful completion of a work request posted unsignaled\0",
        13 => b"the completion comes before an earlier signaled work request's\0",
        14 => b"a successful completion after the queue entered the error state\0",
        15 => b"the wr_id to roll back from is not outstanding\0",
        16 => b"the output array is too small\0",
        17 => b"the tracker for a send queue this large cannot be allocated\0",
        18 => b"an internal error of libselsig (a panic, caught)\0",
        19 => b"the device was lost (a fatal error): nothing more can be posted\0",
        _ => b"unknown result code\0",
    };
    text.as_ptr().cast()
}

/// Fills `config` with the defaults for a send queue of `sq_capacity` work requests and
/// `cq_capacity` CQ credits: signal every 4th, no flags, no pool.
///
/// # Safety
///
/// `config` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_config_init(
    config: *mut selsig_config,
    sq_capacity: u32,
    cq_capacity: u32,
) -> selsig_result {
    let config = arg!(config);
    *config = selsig_config {
        sq_capacity,
        cq_capacity,
        policy: SELSIG_POLICY_EVERY,
        interval: 4,
        max_lag_ns: 0,
        flags: 0,
        qp_num: 0,
        pool: std::ptr::null(),
    };
    SELSIG_OK
}

/// Makes a pool of `credits` CQ credits for the send queues of one CQ (its `cqe`, less the
/// receive slots that report to it). Free it with `selsig_pool_destroy`; trackers made
/// with it keep what they need of it.
///
/// # Safety
///
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_pool_create(
    credits: u32,
    out: *mut *mut selsig_pool,
) -> selsig_result {
    boundary(|| {
        let out = arg!(out);
        if credits == 0 {
            return SELSIG_ERR_INVALID;
        }
        *out = Box::into_raw(Box::new(selsig_pool {
            credits: CqCredits::new(credits),
        }));
        SELSIG_OK
    })
}

/// Frees a pool handle (NULL: nothing).
///
/// # Safety
///
/// `pool` is NULL or a pool of `selsig_pool_create` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_pool_destroy(pool: *mut selsig_pool) {
    if !pool.is_null() {
        // SAFETY: made by `Box::into_raw` in `selsig_pool_create` and not freed (the
        // caller's contract).
        drop(unsafe { Box::from_raw(pool) });
    }
}

fn policy_of(c: &selsig_config) -> Option<Policy> {
    Some(match c.policy {
        SELSIG_POLICY_EVERY => Policy::Every(c.interval),
        SELSIG_POLICY_ALWAYS => Policy::Always,
        SELSIG_POLICY_NEVER => Policy::Never,
        SELSIG_POLICY_ADAPTIVE => Policy::Adaptive {
            max_unsignaled: c.interval,
            max_lag: Duration::from_nanos(c.max_lag_ns),
        },
        _ => return None,
    })
}

fn config_error(e: &ConfigError) -> selsig_result {
    match e {
        ConfigError::TooLarge(_) => SELSIG_ERR_ALLOC,
        _ => SELSIG_ERR_INVALID,
    }
}

/// Makes a tracker for one send queue as `config` describes it.
///
/// # Safety
///
/// `config` points to a `selsig_config` whose `pool` is NULL or a live pool; `out` to a
/// writable pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_create(
    config: *const selsig_config,
    out: *mut *mut selsig_tracker,
) -> selsig_result {
    boundary(|| {
        let c = arg_ref!(config);
        let out = arg!(out);
        let Some(policy) = policy_of(c) else {
            return SELSIG_ERR_INVALID;
        };
        let clock = c.flags & SELSIG_NO_CLOCK == 0;
        if c.flags & !FLAGS != 0 || !clock && c.policy == SELSIG_POLICY_ADAPTIVE {
            return SELSIG_ERR_INVALID;
        }
        let budget = match c.pool.is_null() {
            true => CqBudget::Exclusive(c.cq_capacity),
            // SAFETY: not NULL, and a live pool (the caller's contract).
            false => CqBudget::Shared(unsafe { &*c.pool }.credits.clone()),
        };
        let mut tc = TrackerConfig::new(c.sq_capacity, 0)
            .cq(budget)
            .policy(policy)
            .sq_sig_all(c.flags & SELSIG_SQ_SIG_ALL != 0)
            .measure_lag(clock);
        if c.flags & SELSIG_TAG_SENDS != 0 {
            tc = tc.wr_id_tag(SELSIG_WR_ID_TAG);
        }
        if c.flags & SELSIG_CHECK_QP_NUM != 0 {
            tc = tc.qp_num(c.qp_num);
        }
        let epoch = Instant::now();
        match SendTracker::new(tc, epoch) {
            Ok(inner) => {
                *out = Box::into_raw(Box::new(selsig_tracker {
                    inner,
                    clock,
                    epoch,
                }));
                SELSIG_OK
            }
            Err(e) => config_error(&e),
        }
    })
}

/// Frees a tracker (NULL: nothing). Its outstanding work requests' credits of a shared
/// pool are given back: destroy the QP first.
///
/// # Safety
///
/// `tracker` is NULL or a tracker of `selsig_tracker_create` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_destroy(tracker: *mut selsig_tracker) {
    if !tracker.is_null() {
        // SAFETY: made by `Box::into_raw` in `selsig_tracker_create` and not freed (the
        // caller's contract). Dropping a tracker cannot panic across this boundary: its
        // fields are plain data and an Arc.
        drop(unsafe { Box::from_raw(tracker) });
    }
}

impl selsig_tracker {
    fn now(&self) -> Instant {
        match self.clock {
            true => Instant::now(),
            false => self.epoch,
        }
    }
}

fn post_error<T>(e: &PostError<T>) -> selsig_result {
    match e {
        PostError::Full { .. } => SELSIG_ERR_SQ_FULL,
        PostError::CqFull { .. } => SELSIG_ERR_CQ_FULL,
        PostError::QueueError { .. } => SELSIG_ERR_QUEUE_ERROR,
        PostError::Draining { .. } => SELSIG_ERR_DRAINING,
        PostError::SeqExhausted { .. } => SELSIG_ERR_SEQ_EXHAUSTED,
        PostError::DeviceLost { .. } => SELSIG_ERR_DEVICE_LOST,
        // (PostError is non_exhaustive.)
        _ => SELSIG_ERR_INVALID,
    }
}

fn completion_error(e: &CompletionError) -> selsig_result {
    match e {
        CompletionError::WrongQueue { .. } => SELSIG_ERR_WRONG_QP,
        CompletionError::NotASend { .. } => SELSIG_ERR_NOT_A_SEND,
        CompletionError::Unknown { .. } => SELSIG_ERR_UNKNOWN_WR,
        CompletionError::AlreadyRetired { .. } => SELSIG_ERR_ALREADY_RETIRED,
        CompletionError::Unsignaled { .. } => SELSIG_ERR_UNSIGNALED,
        CompletionError::OutOfOrder { .. } => SELSIG_ERR_OUT_OF_ORDER,
        CompletionError::SuccessAfterError { .. } => SELSIG_ERR_SUCCESS_AFTER_ERROR,
        _ => SELSIG_ERR_INVALID,
    }
}

/// Registers a batch of `n` work requests about to be posted, with their cookies: for
/// each, `out[i]` says the `wr_id` to post it with and whether to set `IBV_SEND_SIGNALED`.
/// With `SELSIG_POST_SIGNAL` in `flags` the last one of the batch is signaled. The clock
/// is read once for the batch.
///
/// Registers as many as there is room for, in order, and sets `*posted` to their number:
/// `SELSIG_OK` when all of them, else the reason the next was refused (`SELSIG_ERR_SQ_FULL`
/// or `SELSIG_ERR_CQ_FULL`: poll completions, then register the rest). Post exactly
/// those `*posted` work requests; if `ibv_post_send` refuses some, hand them back with
/// `selsig_tracker_rollback` from `bad_wr->wr_id`.
///
/// # Safety
///
/// `tracker` is a live tracker; `cookies` has `n` elements and `out` room for `n` (either
/// may be NULL when `n` is 0); `posted` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_post_batch(
    tracker: *mut selsig_tracker,
    cookies: *const u64,
    n: usize,
    flags: u32,
    out: *mut selsig_posted,
    posted: *mut usize,
) -> selsig_result {
    boundary(|| {
        let t = arg!(tracker);
        let cookies = slice!(cookies, n);
        let out = slice_mut!(out, n);
        let posted = arg!(posted);
        *posted = 0;
        if flags & !SELSIG_POST_SIGNAL != 0 {
            return SELSIG_ERR_INVALID;
        }
        let signal = match flags & SELSIG_POST_SIGNAL != 0 {
            true => Signal::Force,
            false => Signal::Auto,
        };
        let now = t.now();
        let mut slots = out.iter_mut();
        let mut count = 0;
        let result = t
            .inner
            .post_batch(cookies.iter().copied(), signal, now, |p| {
                // (One decision per cookie, and `out` has as many slots.)
                if let Some(slot) = slots.next() {
                    *slot = selsig_posted {
                        wr_id: p.wr_id,
                        send_flags: if p.signaled() {
                            SELSIG_IBV_SEND_SIGNALED
                        } else {
                            0
                        },
                    };
                    count += 1;
                }
            });
        *posted = count;
        match result {
            Ok(()) => SELSIG_OK,
            Err(e) => post_error(&e),
        }
    })
}

/// Registers one work request: `selsig_tracker_post_batch` of one.
///
/// # Safety
///
/// `tracker` is a live tracker and `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_post(
    tracker: *mut selsig_tracker,
    cookie: u64,
    flags: u32,
    out: *mut selsig_posted,
) -> selsig_result {
    let mut posted = 0usize;
    // SAFETY: the caller's contract, for a batch of one at `&cookie`.
    unsafe { selsig_tracker_post_batch(tracker, &cookie, 1, flags, out, &mut posted) }
}

/// Hands the tracker the `n` completions `ibv_poll_cq` wrote to `wcs`, in order. Each
/// retires every work request it covers; collect them with
/// `selsig_tracker_poll_retired`. On a completion the tracker refuses (another QP's with
/// `SELSIG_CHECK_QP_NUM`, a receive's with `SELSIG_TAG_SENDS`, one that cannot be: see the
/// codes) it stops there and returns why: `*handled` is its index, and the tracker is as
/// before it. On a CQ shared with other QPs, route by `qp_num` first.
///
/// # Safety
///
/// `tracker` is a live tracker; `wcs` has `n` elements (NULL when `n` is 0); `handled` is
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_handle_wcs(
    tracker: *mut selsig_tracker,
    wcs: *const ibv_wc,
    n: usize,
    handled: *mut usize,
) -> selsig_result {
    boundary(|| {
        let t = arg!(tracker);
        let wcs = slice!(wcs, n);
        let handled = arg!(handled);
        *handled = 0;
        let now = t.now();
        for (i, wc) in wcs.iter().enumerate() {
            if let Err(e) = t.inner.handle_completion(&WorkCompletion::from(wc), now) {
                return completion_error(&e);
            }
            *handled = i + 1;
        }
        SELSIG_OK
    })
}

/// Whether `wc` is a completion of this tracker's sends (its QP with
/// `SELSIG_CHECK_QP_NUM`, the tag with `SELSIG_TAG_SENDS`, not a successful receive):
/// `*yes` is 1 or 0. For a CQ shared with receives or other QPs.
///
/// # Safety
///
/// `tracker` is a live tracker, `wc` a completion, `yes` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_owns(
    tracker: *const selsig_tracker,
    wc: *const ibv_wc,
    yes: *mut c_int,
) -> selsig_result {
    boundary(|| {
        let t = arg_ref!(tracker);
        let wc = arg_ref!(wc);
        let yes = arg!(yes);
        *yes = c_int::from(t.inner.send_seq(&WorkCompletion::from(wc)).is_some());
        SELSIG_OK
    })
}

/// Writes up to `max` retired work requests to `out`, in posting order, and their number
/// to `*n`: call after `selsig_tracker_handle_wcs` until `*n` is 0. The NIC no longer
/// uses their buffers.
///
/// # Safety
///
/// `tracker` is a live tracker, `out` has room for `max` (NULL when `max` is 0), `n` is
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_poll_retired(
    tracker: *mut selsig_tracker,
    out: *mut selsig_retired,
    max: usize,
    n: *mut usize,
) -> selsig_result {
    boundary(|| {
        let t = arg!(tracker);
        let out = slice_mut!(out, max);
        let n = arg!(n);
        let mut count = 0;
        // All of them in one pass where they fit (markers among the pending are skipped),
        // else one at a time.
        if t.inner.pending_retired() <= out.len() {
            let mut slots = out.iter_mut();
            t.inner.poll_retired_with(|r| {
                if let Some(slot) = slots.next() {
                    *slot = retired_of(r);
                    count += 1;
                }
            });
        } else {
            for slot in out.iter_mut() {
                let Some(r) = t.inner.poll_retired() else {
                    break;
                };
                *slot = retired_of(r);
                count += 1;
            }
        }
        *n = count;
        SELSIG_OK
    })
}

/// The fast path of `selsig_tracker_poll_retired` where every work request completed:
/// writes the cookies of up to `max` retired work requests that completed to `cookies`, in
/// posting order, and their number to `*n`, stopping before the first retired one that did
/// not (failed, flushed, lost). Call until `*n` is less than `max`, then
/// `selsig_tracker_poll_retired`, which hands back the ones that did not complete with
/// their outcomes (and finds none when none is left).
///
/// # Safety
///
/// `tracker` is a live tracker, `cookies` has room for `max` (NULL when `max` is 0), `n`
/// is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_poll_completed(
    tracker: *mut selsig_tracker,
    cookies: *mut u64,
    max: usize,
    n: *mut usize,
) -> selsig_result {
    boundary(|| {
        let t = arg!(tracker);
        let out = slice_mut!(cookies, max);
        let n = arg!(n);
        let mut slots = out.iter_mut();
        *n = t.inner.poll_completed_with(max, |cookie| {
            // (At most `max` handed, and `out` has as many slots.)
            if let Some(slot) = slots.next() {
                *slot = cookie;
            }
        });
        SELSIG_OK
    })
}

fn retired_of(r: Retired<u64>) -> selsig_retired {
    let (outcome, status) = match r.outcome {
        Outcome::Completed => (SELSIG_COMPLETED, WcStatus::Success),
        Outcome::Failed(status) => (SELSIG_FAILED, status),
        Outcome::Flushed => (SELSIG_FLUSHED, WcStatus::WrFlushErr),
        Outcome::DeviceLost => (SELSIG_DEVICE_LOST, WcStatus::GeneralErr),
    };
    selsig_retired {
        cookie: r.payload,
        seq: r.seq.0,
        status: u32::from(status),
        outcome,
        signaled: u16::from(r.signaled),
    }
}

/// Confirms the unsignaled tail: when work requests after the last signaled one are
/// outstanding, `*marker` is 1 and the caller posts a signaled zero-length RDMA WRITE with
/// `wr_id` `*wr_id` (its completion confirms them all); otherwise `*marker` is 0. Call
/// when nothing more is to be posted for a while.
///
/// # Safety
///
/// `tracker` is a live tracker; `marker` and `wr_id` are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_confirm_all(
    tracker: *mut selsig_tracker,
    marker: *mut c_int,
    wr_id: *mut u64,
) -> selsig_result {
    boundary(|| {
        let t = arg!(tracker);
        let marker = arg!(marker);
        let wr_id = arg!(wr_id);
        *marker = 0;
        let now = t.now();
        match t.inner.confirm_all(now) {
            Ok(Some(seq)) => {
                *marker = 1;
                *wr_id = t.inner.wr_id(seq);
                SELSIG_OK
            }
            Ok(None) => SELSIG_OK,
            Err(e) => post_error(&e),
        }
    })
}

/// Stops accepting posts (markers still go): to tear down, after an error too.
///
/// # Safety
///
/// `tracker` is a live tracker.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_start_drain(tracker: *mut selsig_tracker) -> selsig_result {
    boundary(|| {
        arg!(tracker).inner.start_drain();
        SELSIG_OK
    })
}

/// The device was lost: `ibv_get_async_event` gave `IBV_EVENT_DEVICE_FATAL`. Poll the CQ
/// dry and hand those completions to the tracker first (the device wrote them before it
/// failed); then this retires every outstanding work request as `SELSIG_DEVICE_LOST`
/// (collect them with `selsig_tracker_poll_retired`: libmlx5 makes no completion for them,
/// not even flushes) and refuses every later post with `SELSIG_ERR_DEVICE_LOST`. `*n` is
/// how many it retired (0 when called again).
///
/// # Safety
///
/// `tracker` is a live tracker; `n` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_device_lost(
    tracker: *mut selsig_tracker,
    n: *mut u64,
) -> selsig_result {
    boundary(|| {
        let t = arg!(tracker);
        let n = arg!(n);
        *n = t.inner.device_lost();
        SELSIG_OK
    })
}

/// Registers a marker, even while draining or in the error state: the caller posts a
/// signaled zero-length RDMA WRITE with `wr_id` `*wr_id`; its completion (a flush after
/// an error) confirms everything before it.
///
/// # Safety
///
/// `tracker` is a live tracker; `wr_id` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_post_marker(
    tracker: *mut selsig_tracker,
    wr_id: *mut u64,
) -> selsig_result {
    boundary(|| {
        let t = arg!(tracker);
        let wr_id = arg!(wr_id);
        let now = t.now();
        match t.inner.post_marker(now) {
            Ok(seq) => {
                *wr_id = t.inner.wr_id(seq);
                SELSIG_OK
            }
            Err(e) => post_error(&e),
        }
    })
}

/// Hands back the work requests from the one posted with `wr_id` on (`bad_wr->wr_id` of a
/// failed `ibv_post_send`: it and every later one were not posted): they are forgotten,
/// and their cookies written to `cookies`, in posting order, their number to `*n`.
/// `cookies` must have room for every work request registered from there on
/// (`SELSIG_ERR_BUFFER_TOO_SMALL` otherwise, with `*n` the room needed, and nothing
/// handed back).
///
/// # Safety
///
/// `tracker` is a live tracker; `cookies` has room for `max` (NULL when `max` is 0); `n`
/// is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_rollback(
    tracker: *mut selsig_tracker,
    wr_id: u64,
    cookies: *mut u64,
    max: usize,
    n: *mut usize,
) -> selsig_result {
    boundary(|| {
        let t = arg!(tracker);
        let cookies = slice_mut!(cookies, max);
        let n = arg!(n);
        *n = 0;
        let Some(from) = t.inner.seq_of(wr_id) else {
            return SELSIG_ERR_NOT_OUTSTANDING;
        };
        let next = t.inner.next_seq();
        let first = t.inner.first_outstanding();
        if from < first || from > next {
            return SELSIG_ERR_NOT_OUTSTANDING;
        }
        // At most this many (markers among them are not handed back).
        let needed = usize::try_from(next.0 - from.0).unwrap_or(usize::MAX);
        if needed > cookies.len() {
            *n = needed;
            return SELSIG_ERR_BUFFER_TOO_SMALL;
        }
        match t.inner.rollback(from) {
            Ok(back) => {
                for (slot, cookie) in cookies.iter_mut().zip(back) {
                    *slot = cookie;
                    *n += 1;
                }
                SELSIG_OK
            }
            Err(RollbackError::NotOutstanding { .. }) => SELSIG_ERR_NOT_OUTSTANDING,
            Err(_) => SELSIG_ERR_INVALID,
        }
    })
}

/// Work requests posted and not retired yet (`*outstanding`), and how many more may be
/// registered now (`*available`, the lesser of free send-queue slots and CQ credits);
/// either pointer may be NULL.
///
/// # Safety
///
/// `tracker` is a live tracker; the others NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_room(
    tracker: *const selsig_tracker,
    outstanding: *mut u32,
    available: *mut u32,
) -> selsig_result {
    boundary(|| {
        let t = arg_ref!(tracker);
        if !outstanding.is_null() {
            // SAFETY: not NULL, writable (the caller's contract).
            unsafe { *outstanding = t.inner.outstanding() };
        }
        if !available.is_null() {
            // SAFETY: not NULL, writable (the caller's contract).
            unsafe { *available = t.inner.available() };
        }
        SELSIG_OK
    })
}

/// The tracker's state: `SELSIG_STATE_READY`, `_DRAINING` or `_ERROR`.
///
/// # Safety
///
/// `tracker` is a live tracker; `state` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_state(
    tracker: *const selsig_tracker,
    state: *mut u32,
) -> selsig_result {
    boundary(|| {
        let t = arg_ref!(tracker);
        *arg!(state) = match t.inner.state() {
            QueueState::Ready => SELSIG_STATE_READY,
            QueueState::Draining => SELSIG_STATE_DRAINING,
            QueueState::DeviceLost => SELSIG_STATE_DEVICE_LOST,
            _ => SELSIG_STATE_ERROR,
        };
        SELSIG_OK
    })
}

/// When `SELSIG_POLICY_ADAPTIVE` wants the unsignaled tail confirmed: `*ns` nanoseconds
/// from now (0: now; call `selsig_tracker_confirm_all`), or -1 when nothing is due.
///
/// # Safety
///
/// `tracker` is a live tracker; `ns` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_next_deadline(
    tracker: *const selsig_tracker,
    ns: *mut i64,
) -> selsig_result {
    boundary(|| {
        let t = arg_ref!(tracker);
        *arg!(ns) = match t.inner.next_deadline() {
            None => -1,
            Some(at) => {
                let left = at.saturating_duration_since(t.now());
                i64::try_from(left.as_nanos()).unwrap_or(i64::MAX)
            }
        };
        SELSIG_OK
    })
}

/// The tracker's counters.
///
/// # Safety
///
/// `tracker` is a live tracker; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_stats(
    tracker: *const selsig_tracker,
    out: *mut selsig_stats,
) -> selsig_result {
    boundary(|| {
        let s = arg_ref!(tracker).inner.stats();
        *arg!(out) = selsig_stats {
            posted: s.posted,
            signaled: s.signaled,
            markers: s.markers,
            cqes: s.cqes,
            rejected_cqes: s.rejected_cqes,
            completed: s.completed,
            failed: s.failed,
            flushed: s.flushed,
        };
        SELSIG_OK
    })
}

/// The sequence number a `wr_id` this tracker handed out carries (for logs), or
/// `SELSIG_ERR_NOT_A_SEND` when it lacks the tag.
///
/// # Safety
///
/// `tracker` is a live tracker; `seq` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn selsig_tracker_seq_of(
    tracker: *const selsig_tracker,
    wr_id: u64,
    seq: *mut u64,
) -> selsig_result {
    boundary(|| {
        let t = arg_ref!(tracker);
        let seq = arg!(seq);
        match t.inner.seq_of(wr_id) {
            Some(Seq(s)) => {
                *seq = s;
                SELSIG_OK
            }
            None => SELSIG_ERR_NOT_A_SEND,
        }
    })
}

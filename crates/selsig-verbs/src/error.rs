//! Errno mapping: what a failed verb (a post, a modify, a destroy, the device list)
//! returned, turned into selsig's errors; and the report of a failed destroy, which a
//! `Drop` cannot return.

use std::fmt;
use std::io;

use selsig::{PostFailure, PostWrError, ProviderError, QpState};

/// `ibv_get_device_list` failed: without the kernel's RDMA subsystem it says ENOSYS.
pub(crate) fn no_device_list() -> ProviderError {
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENOSYS) {
        ProviderError::NoDevice(
            "no RDMA device: this kernel has no RDMA support (ibv_get_device_list: function \
             not implemented); use --provider soft, or a machine with an RNIC or Soft-RoCE \
             (modprobe rdma_rxe)"
                .to_string(),
        )
    } else {
        ProviderError::Os {
            verb: "ibv_get_device_list",
            source: e,
        }
    }
}

pub(crate) fn os(verb: &'static str) -> ProviderError {
    ProviderError::Os {
        verb,
        source: io::Error::last_os_error(),
    }
}

/// Reports a failed destroy on stderr, if stderr takes it: a `Drop` goes on either way
/// (`eprintln!` would panic on a closed pipe).
pub(crate) fn report(what: fmt::Arguments<'_>) {
    report_to(&mut io::stderr(), what);
}

fn report_to(out: &mut impl io::Write, what: fmt::Arguments<'_>) {
    let _ = writeln!(out, "selsig-verbs: {what}");
}

/// The error of a destroy verb's return code: an errno, or a provider's negated one.
pub(crate) fn destroy_error(rc: i32) -> io::Error {
    io::Error::from_raw_os_error(rc.saturating_abs())
}

/// Which queue a failed post was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queue {
    Send,
    Recv,
}

/// What `ibv_post_send` / `ibv_post_recv` returned, `rc`, with `bad_wr` as it left it in a
/// list of `len` work requests starting at `base`. Call it right after the post: a provider
/// that returns -1 sets `errno`.
pub(crate) fn post_result<T>(
    rc: i32,
    bad: *const T,
    base: *const T,
    len: usize,
    queue: Queue,
    state: impl FnOnce() -> QpState,
) -> Result<(), PostWrError> {
    if rc == 0 {
        return Ok(());
    }
    let errno = io::Error::last_os_error().raw_os_error();
    // The position of `bad_wr` from the addresses alone (nothing is read through it).
    let offset = (!bad.is_null()).then(|| {
        (bad as isize).wrapping_sub(base as isize) / std::mem::size_of::<T>().max(1) as isize
    });
    Err(post_error(rc, errno, offset, len, queue, state))
}

/// The error of a failed `ibv_wr_complete` (`rc`, the errno it returned) on a batch of `len`
/// work requests, none of them posted: the first is named, as a provider's `bad_wr` at the
/// start of a list would be, and the errno read as `ibv_post_send`'s (`ENOMEM` / `ENOSPC`:
/// a full queue, or a state error below RTS; `EINVAL`: a state error, or an invalid work
/// request).
pub(crate) fn batch_error(rc: i32, len: usize, state: impl FnOnce() -> QpState) -> PostWrError {
    let errno = io::Error::last_os_error().raw_os_error();
    post_error(rc, errno, Some(0), len, Queue::Send, state)
}

/// The errno of a verb that failed with `rc`: the errno itself (rxe, mlx5), its negation
/// (siw, erdma, bnxt_re), or -1 with the errno in `errno` (read right after the call);
/// EINVAL where none is given.
pub(crate) fn errno_of(rc: i32, errno: Option<i32>) -> i32 {
    match rc {
        1.. => rc,
        ..-1 => rc.saturating_neg(),
        _ => errno.filter(|&e| e > 0).unwrap_or(libc::EINVAL),
    }
}

/// The error of a failed `ibv_post_send` / `ibv_post_recv`: `rc` is what the provider
/// returned (rxe and mlx5 return the errno; others may return -1 and set `errno`, read
/// right after the call), `bad` the position of `bad_wr` in the list of `len` work
/// requests (`None` when the provider left it null: a send batch was taken whole, a
/// receive batch not at all), `state` queries the QP's state (only for `EINVAL`, and
/// `ENOMEM` from a send queue).
fn post_error(
    rc: i32,
    errno: Option<i32>,
    bad: Option<isize>,
    len: usize,
    queue: Queue,
    state: impl FnOnce() -> QpState,
) -> PostWrError {
    let code = errno_of(rc, errno);
    if bad.is_none() && queue == Queue::Send {
        // Every provider but rxe names the work request that failed. rxe leaves `bad_wr`
        // null when it took every work request and then its doorbell `write()` failed
        // (`rxe_post_send`): they are in its queue and run with the next doorbell (even
        // one rung after RTS, when the kernel refused this one for the state). Taken as
        // posted, so no buffer comes back while the NIC may still read it.
        return PostWrError {
            index: len,
            failure: PostFailure::AfterPosting,
            source: Some(io::Error::from_raw_os_error(code)),
        };
    }
    let index = bad.map_or(0, |i| i.clamp(0, len as isize - 1) as usize);
    let failure = match code {
        // libmlx5 from rdma-core 40 answers a post before RTS with ENOMEM too
        // (`qp_state_max_gs`, semantics 33): not full, and never to be.
        libc::ENOMEM if queue == Queue::Send => match state() {
            s @ (QpState::Reset | QpState::Init | QpState::Rtr) => PostFailure::State(s),
            _ => PostFailure::Full,
        },
        libc::ENOMEM | libc::ENOSPC => PostFailure::Full,
        libc::EINVAL => {
            // A send queue takes work requests from RTS on (and, flushing them, in the
            // error states); a receive queue from INIT on.
            let state = state();
            let refused = match queue {
                Queue::Send => matches!(state, QpState::Reset | QpState::Init | QpState::Rtr),
                Queue::Recv => state == QpState::Reset,
            };
            if refused {
                PostFailure::State(state)
            } else {
                PostFailure::Invalid("rejected by the provider (EINVAL)")
            }
        }
        _ => PostFailure::Other,
    };
    PostWrError {
        index,
        failure,
        source: Some(io::Error::from_raw_os_error(code)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys;

    /// Standard error as a closed pipe: every write fails with EPIPE.
    struct ClosedPipe;

    impl io::Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    /// A failed destroy is reported where it can be, and a `Drop` goes on when it cannot
    /// (`eprintln!` panics on a closed pipe); a provider's negated errno reads as the errno.
    #[test]
    fn a_failed_destroy_is_reported_without_panicking() {
        let mut out = Vec::new();
        report_to(
            &mut out,
            format_args!("ibv_destroy_cq failed: {}", destroy_error(16)),
        );
        let busy = io::Error::from_raw_os_error(16).to_string();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("selsig-verbs: ibv_destroy_cq failed: {busy}\n")
        );
        report_to(&mut ClosedPipe, format_args!("ibv_dealloc_pd failed"));
        assert_eq!(destroy_error(-16).to_string(), busy);
    }

    fn errno_of(e: &PostWrError) -> Option<i32> {
        e.source.as_ref().and_then(io::Error::raw_os_error)
    }

    #[test]
    fn post_errors_take_the_errno_from_the_return_code_or_errno() {
        let never = || -> QpState { panic!("the state is only queried for EINVAL") };
        // rxe and mlx5 return the errno itself.
        let e = post_error(
            libc::ENOMEM,
            Some(libc::EAGAIN),
            Some(3),
            8,
            Queue::Send,
            || QpState::Rts,
        );
        assert_eq!(
            (e.index, e.failure, errno_of(&e)),
            (3, PostFailure::Full, Some(libc::ENOMEM))
        );
        // Others return -1 and set errno: the same for sends and receives.
        for queue in [Queue::Send, Queue::Recv] {
            let e = post_error(-1, Some(libc::ENOMEM), Some(0), 2, queue, || QpState::Rts);
            assert_eq!(
                (e.failure, errno_of(&e)),
                (PostFailure::Full, Some(libc::ENOMEM))
            );
            // ENOSPC is a full queue too.
            let e = post_error(-1, Some(libc::ENOSPC), Some(0), 2, queue, never);
            assert_eq!(
                (e.failure, errno_of(&e)),
                (PostFailure::Full, Some(libc::ENOSPC))
            );
            let e = post_error(-1, Some(libc::EIO), Some(0), 2, queue, never);
            assert_eq!(
                (e.index, e.failure, errno_of(&e)),
                (0, PostFailure::Other, Some(libc::EIO))
            );
            // -1 without an errno: EINVAL, judged by the state.
            let e = post_error(-1, Some(0), Some(0), 2, queue, || QpState::Rts);
            assert_eq!(errno_of(&e), Some(libc::EINVAL));
            assert!(matches!(e.failure, PostFailure::Invalid(_)), "{e:?}");
            // Others (siw, erdma, bnxt_re) return the errno negated; errno is stale then.
            let e = post_error(-libc::ENOMEM, Some(libc::EAGAIN), Some(1), 2, queue, || {
                QpState::Rts
            });
            assert_eq!(
                (e.index, e.failure, errno_of(&e)),
                (1, PostFailure::Full, Some(libc::ENOMEM))
            );
        }
    }

    #[test]
    fn post_results_find_bad_wr_by_its_address() {
        let list = [sys::ibv_sge::default(); 4];
        let base = list.as_ptr();
        assert!(post_result(0, std::ptr::null(), base, 4, Queue::Send, || QpState::Rts).is_ok());
        let e = post_result(
            libc::ENOMEM,
            base.wrapping_add(2),
            base,
            4,
            Queue::Send,
            || QpState::Rts,
        )
        .unwrap_err();
        assert_eq!((e.index, e.failure), (2, PostFailure::Full));
        // A null `bad_wr`: a receive batch was refused whole (rxe in RESET), a send batch
        // was taken whole before the provider failed (rxe's doorbell).
        let e = post_result(libc::EINVAL, std::ptr::null(), base, 4, Queue::Recv, || {
            QpState::Reset
        })
        .unwrap_err();
        assert_eq!(
            (e.index, e.failure),
            (0, PostFailure::State(QpState::Reset))
        );
        let e = post_result(libc::EINVAL, std::ptr::null(), base, 4, Queue::Send, || {
            panic!("a batch taken whole is no state error")
        })
        .unwrap_err();
        assert_eq!(
            (e.index, e.failure, errno_of(&e)),
            (4, PostFailure::AfterPosting, Some(libc::EINVAL))
        );
    }

    /// A batch `ibv_wr_complete` refused is refused from its first work request: a full
    /// queue (rxe's ENOSPC, libmlx5's ENOMEM), or below RTS a state error (libmlx5's
    /// EINVAL from `mlx5_send_wr_complete_error`).
    #[test]
    fn a_refused_batch_is_refused_from_its_first_work_request() {
        for rc in [libc::ENOSPC, libc::ENOMEM] {
            let e = batch_error(rc, 5, || QpState::Rts);
            assert_eq!((e.index, e.failure), (0, PostFailure::Full));
            assert_eq!(errno_of(&e), Some(rc));
        }
        let e = batch_error(libc::EINVAL, 5, || QpState::Init);
        assert_eq!((e.index, e.failure), (0, PostFailure::State(QpState::Init)));
        let e = batch_error(libc::EINVAL, 5, || QpState::Rts);
        assert_eq!(e.index, 0);
        assert!(matches!(e.failure, PostFailure::Invalid(_)), "{e:?}");
    }

    #[test]
    fn post_errors_name_the_bad_work_request_within_the_list() {
        let at = |bad| post_error(libc::ENOMEM, None, bad, 4, Queue::Send, || QpState::Rts).index;
        assert_eq!(
            [at(None), at(Some(0)), at(Some(2)), at(Some(3))],
            [4, 0, 2, 3]
        );
        // A pointer outside the list is not trusted beyond it.
        assert_eq!([at(Some(-1)), at(Some(9))], [0, 3]);
    }

    /// libmlx5 (rdma-core 40 and later) refuses a send before RTS with ENOMEM
    /// (`qp_state_max_gs`): a state error, not a full queue. From RTS on, and on a receive
    /// queue, ENOMEM is a full queue.
    #[test]
    fn enomem_from_a_send_queue_below_rts_is_a_state_error() {
        let send =
            |state| post_error(libc::ENOMEM, None, Some(0), 1, Queue::Send, || state).failure;
        for state in [QpState::Reset, QpState::Init, QpState::Rtr] {
            assert_eq!(send(state), PostFailure::State(state));
        }
        for state in [QpState::Rts, QpState::Err, QpState::Sqd] {
            assert_eq!(send(state), PostFailure::Full, "{state:?}");
        }
        let recv = post_error(libc::ENOMEM, None, Some(0), 1, Queue::Recv, || {
            panic!("a receive queue's ENOMEM is a full queue whatever the state")
        });
        assert_eq!(recv.failure, PostFailure::Full);
    }

    #[test]
    fn einval_is_a_state_error_where_the_queue_takes_no_work_requests() {
        let send =
            |state| post_error(libc::EINVAL, None, Some(0), 1, Queue::Send, || state).failure;
        let recv = |state| post_error(libc::EINVAL, None, None, 1, Queue::Recv, || state).failure;
        for state in [QpState::Reset, QpState::Init, QpState::Rtr] {
            assert_eq!(send(state), PostFailure::State(state));
        }
        assert!(matches!(send(QpState::Rts), PostFailure::Invalid(_)));
        assert_eq!(recv(QpState::Reset), PostFailure::State(QpState::Reset));
        for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
            assert!(matches!(recv(state), PostFailure::Invalid(_)), "{state:?}");
        }
    }
}

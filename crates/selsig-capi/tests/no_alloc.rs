//! Zero heap allocations per work request in libselsig's batch calls: a million work
//! requests posted with `selsig_tracker_post_batch`, their completions handed over with
//! `selsig_tracker_handle_wcs` as `ibv_poll_cq` would write them, the cookies collected
//! with `selsig_tracker_poll_completed` (and `selsig_tracker_poll_retired` for any that did
//! not complete): nothing allocated once the tracker is made. A global
//! allocator counts. (One test in this binary: the count is process-wide.)

use selsig_testkit::alloc::{Counting, allocations};
use std::ptr;

use selsig_capi::*;
use selsig_verbs::sys::ibv_wc;

#[global_allocator]
static GLOBAL: Counting = Counting;

const DEPTH: usize = 256;
const WRS: u64 = 1_000_000;

struct Buffers {
    cookies: Vec<u64>,
    posted: Vec<selsig_posted>,
    wcs: Vec<ibv_wc>,
    retired: Vec<selsig_retired>,
    completed: Vec<u64>,
}

/// `WRS` work requests in batches of up to 32, as a C program would make the calls.
fn stream(t: *mut selsig_tracker, b: &mut Buffers) -> u64 {
    let (mut next, mut sum) = (0u64, 0u64);
    while next < WRS {
        let want = (WRS - next).min(32) as usize;
        for (i, c) in b.cookies[..want].iter_mut().enumerate() {
            *c = next + i as u64;
        }
        let mut n = 0;
        // SAFETY: a live tracker; the arrays have `want` elements.
        let rc = unsafe {
            selsig_tracker_post_batch(
                t,
                b.cookies.as_ptr(),
                want,
                0,
                b.posted.as_mut_ptr(),
                &mut n,
            )
        };
        assert!(
            matches!(
                rc,
                selsig_result::SELSIG_OK
                    | selsig_result::SELSIG_ERR_SQ_FULL
                    | selsig_result::SELSIG_ERR_CQ_FULL
            ),
            "{rc:?}"
        );
        next += n as u64;
        let mut k = 0;
        for p in &b.posted[..n] {
            if p.send_flags != 0 {
                b.wcs[k] = ibv_wc {
                    wr_id: p.wr_id,
                    ..ibv_wc::default()
                };
                k += 1;
            }
        }
        let mut handled = 0;
        // SAFETY: a live tracker; `k` completions.
        let rc = unsafe { selsig_tracker_handle_wcs(t, b.wcs.as_ptr(), k, &mut handled) };
        assert_eq!(rc, selsig_result::SELSIG_OK);
        loop {
            let mut got = 0;
            // SAFETY: a live tracker; room for DEPTH.
            let rc = unsafe {
                selsig_tracker_poll_completed(t, b.completed.as_mut_ptr(), DEPTH, &mut got)
            };
            assert_eq!(rc, selsig_result::SELSIG_OK);
            sum = b.completed[..got]
                .iter()
                .fold(sum, |s, c| s.wrapping_add(*c));
            if got < DEPTH {
                break;
            }
        }
        loop {
            let mut got = 0;
            // SAFETY: a live tracker; room for DEPTH.
            let rc =
                unsafe { selsig_tracker_poll_retired(t, b.retired.as_mut_ptr(), DEPTH, &mut got) };
            assert_eq!(rc, selsig_result::SELSIG_OK);
            if got == 0 {
                break;
            }
            sum = b.retired[..got]
                .iter()
                .fold(sum, |s, r| s.wrapping_add(r.cookie));
        }
    }
    sum
}

#[test]
fn a_million_work_requests_through_the_c_api_allocate_nothing() {
    for every in [1u32, 64] {
        let mut config = std::mem::MaybeUninit::<selsig_config>::uninit();
        // SAFETY: writable.
        assert_eq!(
            unsafe { selsig_config_init(config.as_mut_ptr(), DEPTH as u32, DEPTH as u32) },
            selsig_result::SELSIG_OK
        );
        // SAFETY: initialized just above.
        let mut config = unsafe { config.assume_init() };
        config.interval = every;
        let mut t = ptr::null_mut();
        // SAFETY: a valid config, a writable pointer.
        assert_eq!(
            unsafe { selsig_tracker_create(&config, &mut t) },
            selsig_result::SELSIG_OK
        );
        let mut b = Buffers {
            cookies: vec![0; DEPTH],
            posted: vec![selsig_posted::default(); DEPTH],
            wcs: vec![ibv_wc::default(); DEPTH],
            retired: vec![selsig_retired::default(); DEPTH],
            completed: vec![0; DEPTH],
        };
        stream(t, &mut b);
        let before = allocations();
        let sum = stream(t, &mut b);
        let allocations = allocations() - before;
        assert_eq!(sum, WRS * (WRS - 1) / 2, "every cookie back once");
        assert_eq!(
            allocations, 0,
            "every {every}: {allocations} allocations for {WRS} work requests"
        );
        // SAFETY: made above, freed once.
        unsafe { selsig_tracker_destroy(t) };
    }
}

//! CPU time from `getrusage`, for the tests and benches that measure what waiting or
//! posting costs.

use std::time::Duration;

/// User plus system CPU time so far of `who` (`libc::RUSAGE_SELF`: the process, every
/// thread; `libc::RUSAGE_THREAD`: the calling thread).
///
/// # Panics
///
/// If `getrusage` fails (it does not for these two targets).
pub fn cpu_time(who: libc::c_int) -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a valid, writable `rusage`; the caller names a valid target.
    let rc = unsafe { libc::getrusage(who, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    // SAFETY: getrusage succeeded, so it filled `usage`.
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The process's CPU time so far, every thread.
pub fn process_cpu() -> Duration {
    cpu_time(libc::RUSAGE_SELF)
}

/// The calling thread's CPU time so far.
pub fn thread_cpu() -> Duration {
    cpu_time(libc::RUSAGE_THREAD)
}

//! What the bench reads of the host it runs on: the page and cache line perftest mode steps
//! by, the yardsticks (memcpy, the round trip of a cache line between two threads), the
//! threads' waits for a CPU, and the posting thread's CPU time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::bench::units::gbit;
use crate::common::pattern;

/// Time the memcpy reference copies, per size.
const MEMCPY_TIME: Duration = Duration::from_millis(200);
/// The thread-to-thread yardstick ([`round_trip_ns`]) times at most this many round trips
const ROUND_TRIPS: u64 = 20_000;
/// ... and for at most about this long.
const ROUND_TRIP_TIME: Duration = Duration::from_millis(20);
/// The pause before [`round_trip_ns`] measures: the soft NIC's thread spins for a while
/// after its last work before it sleeps, and would take a CPU from the two threads.
const ROUND_TRIP_IDLE: Duration = Duration::from_millis(5);

/// The host's memory as perftest sees it: the page (its cycle buffer, which addresses step
/// through) and the L1 data cache line (its smallest address step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub page: u64,
    pub line: u64,
}

impl Geometry {
    /// What perftest reads: `sysconf(_SC_PAGESIZE)` (4096 if it has none), and
    /// `sysconf(_SC_LEVEL1_DCACHE_LINESIZE)`, else sysfs's `coherency_line_size` of cpu0,
    /// else 64.
    pub(crate) fn host() -> Self {
        // SAFETY: `sysconf` takes any name, reads no memory of ours, and answers -1 for
        // names it does not know.
        let (page, line) = unsafe {
            (
                libc::sysconf(libc::_SC_PAGESIZE),
                libc::sysconf(libc::_SC_LEVEL1_DCACHE_LINESIZE),
            )
        };
        let line = match line {
            0 => std::fs::read_to_string(
                "/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size",
            )
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0),
            n => n,
        };
        let positive =
            |n: libc::c_long, or: u64| u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(or);
        Geometry {
            page: positive(page, 4096),
            line: positive(line, 64),
        }
    }
}

/// Gigabits per second one core copies `size`-byte messages between two arrays of
/// `buffers` slots, slot after slot (the soft NIC's work, without the NIC).
pub(crate) fn memcpy_gbit(size: usize, buffers: usize) -> f64 {
    let buffers = buffers.max(1);
    let src = pattern(1, size * buffers);
    let mut dst = vec![0u8; size * buffers];
    let mut copied = 0u64;
    let start = Instant::now();
    while start.elapsed() < MEMCPY_TIME {
        for i in 0..buffers {
            let at = i * size;
            dst[at..at + size].copy_from_slice(std::hint::black_box(&src[at..at + size]));
        }
        std::hint::black_box(&mut dst);
        copied += (size * buffers) as u64;
    }
    gbit(copied as f64, start.elapsed().as_secs_f64())
}

/// A value on a cache line of its own.
#[repr(align(128))]
struct Line(AtomicU64);

/// Nanoseconds a round trip of a cache line between this thread and another takes: this
/// thread stores a number, the other, spinning, stores it back on another line, and this
/// one waits for it ([`ROUND_TRIPS`] times, or for about [`ROUND_TRIP_TIME`], the first
/// trip untimed). That is the soft NIC's cost of a completion (or a doorbell) crossing
/// from one core to another, which the host's placement of the two CPUs sets. With one
/// CPU for both threads each trip waits for the scheduler, and the figure says so. It
/// first waits [`ROUND_TRIP_IDLE`], for the soft NIC's thread to go to sleep. `None` if the
/// other thread cannot be started.
pub(crate) fn round_trip_ns() -> Option<f64> {
    const STOP: u64 = u64::MAX;
    std::thread::sleep(ROUND_TRIP_IDLE);
    let (ping, pong) = (Line(AtomicU64::new(0)), Line(AtomicU64::new(0)));
    std::thread::scope(|scope| {
        let answer = std::thread::Builder::new().spawn_scoped(scope, || {
            let mut seen = 0;
            loop {
                let n = ping.0.load(Ordering::Acquire);
                if n == STOP {
                    return;
                }
                if n != seen {
                    seen = n;
                    pong.0.store(n, Ordering::Release);
                }
                std::hint::spin_loop();
            }
        });
        answer.ok()?;
        let trip = |n: u64| {
            ping.0.store(n, Ordering::Release);
            while pong.0.load(Ordering::Acquire) != n {
                std::hint::spin_loop();
            }
        };
        // Until the other thread runs.
        trip(1);
        let start = Instant::now();
        let mut trips = 0;
        while trips < ROUND_TRIPS && (trips % 16 != 0 || start.elapsed() < ROUND_TRIP_TIME) {
            trips += 1;
            trip(trips + 1);
        }
        let ns = start.elapsed().as_nanos() as f64 / trips as f64;
        ping.0.store(STOP, Ordering::Release);
        Some(ns)
    })
}

/// The time each thread of this process (by thread id) has spent ready to run but waiting
/// for a CPU, in nanoseconds (the second field of `/proc/self/task/TID/schedstat`); `None`
/// where the kernel reports none: no such files, or files of zeros (a kernel that keeps
/// no scheduler statistics writes `0 0 0`, where the first field, the time on a CPU,
/// cannot be 0 for the thread reading it).
pub(crate) fn run_waits() -> Option<HashMap<u32, u64>> {
    let threads = std::fs::read_dir("/proc/self/task").ok()?.flatten();
    waits_of(threads.filter_map(|entry| {
        let tid = entry.file_name().to_str()?.parse().ok()?;
        // A thread that ended meanwhile has no file any more: it is left out.
        let text = std::fs::read_to_string(entry.path().join("schedstat")).ok()?;
        Some((tid, text))
    }))
}

/// [`run_waits`] of the threads' `schedstat` texts.
fn waits_of(threads: impl Iterator<Item = (u32, String)>) -> Option<HashMap<u32, u64>> {
    let mut waits = HashMap::new();
    let mut ran = false;
    for (tid, text) in threads {
        let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
        if let (Some(Some(on_cpu)), Some(Some(wait))) = (fields.next(), fields.next()) {
            ran |= on_cpu > 0;
            waits.insert(tid, wait);
        }
    }
    ran.then_some(waits)
}

/// The waiting for a CPU between two readings of [`run_waits`], every thread's added up (a
/// thread started in between counts from 0, one that ended in between not at all).
pub(crate) fn waited(before: &HashMap<u32, u64>, after: &HashMap<u32, u64>) -> Duration {
    let since = |(tid, wait): (&u32, &u64)| wait.saturating_sub(*before.get(tid).unwrap_or(&0));
    Duration::from_nanos(after.iter().map(since).sum())
}

/// CPU time this thread has used.
pub(crate) fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scheduler statistics: the second field of each thread's file; none where the kernel
    /// keeps none (files of zeros) or writes something else.
    #[test]
    fn waits_are_read_where_the_kernel_keeps_them() {
        let of = |files: &[(u32, &str)]| {
            waits_of(files.iter().map(|&(tid, text)| (tid, text.to_string())))
        };
        let w = of(&[(7, "5000 300 2\n"), (8, "0 0 0\n")]).unwrap();
        assert_eq!((w[&7], w[&8]), (300, 0));
        assert_eq!(of(&[(7, "0 0 0\n"), (8, "0 0 0\n")]), None);
        assert_eq!(of(&[(7, "garbage\n")]), None);
        assert_eq!(of(&[]), None);
    }

    /// perftest mode takes the host's page and cache line, as perftest does; a page is a
    /// power of two, a line too, smaller than the page.
    #[test]
    fn the_host_geometry_is_read() {
        let g = Geometry::host();
        assert!(g.page.is_power_of_two() && g.page >= 4096, "{g:?}");
        assert!(g.line.is_power_of_two() && g.line < g.page, "{g:?}");
    }

    /// The yardstick measures a time, and stops soon after its time limit, even where the
    /// other thread waits for a CPU (tests run side by side).
    #[test]
    fn a_round_trip_between_threads_is_timed() {
        let start = Instant::now();
        let ns = round_trip_ns().expect("a thread");
        let took = start.elapsed();
        assert!(ns.is_finite() && ns > 0.0, "{ns}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
}

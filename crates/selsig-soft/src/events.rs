//! Completion events of a soft CQ, as a verbs completion channel gives them: armed for one
//! event at a time (`ibv_req_notify_cq`), the event made by a completion added after the
//! arm, and an `eventfd` that a reactor watches.
//!
//! The arm records the producer index the poller sees; the NIC thread, on every turn of
//! its loop and again behind the `SeqCst` fence it passes before it sleeps, makes the
//! event when the CQ is armed and its producer index has moved past that. Of "the NIC
//! added a completion, then (behind the fence) looked" and "the poller armed, then (behind
//! its fence) polled again", one side sees the other's write (Dekker's pattern; `loom`
//! checks it in `loom_tests`), so a completion is either found by the poll after the arm
//! or makes an event; a busy NIC sees the arm on one of its next turns. The NIC's hot
//! path pays two plain loads per CQ and turn, no fence.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};

use crate::sync::{AtomicBool, AtomicU64, Ordering, fence};

/// A CQ's arm and its eventfd (made at the first arm).
#[derive(Debug)]
pub(crate) struct CqEvents {
    armed: AtomicBool,
    /// The CQ's producer index as the poller saw it when it armed: completions up to it
    /// make no event.
    armed_at: AtomicU64,
    fd: OnceLock<OwnedFd>,
}

impl CqEvents {
    pub(crate) fn new() -> Self {
        CqEvents {
            armed: AtomicBool::new(false),
            armed_at: AtomicU64::new(0),
            fd: OnceLock::new(),
        }
    }

    /// The eventfd, made non-blocking on first use.
    fn fd(&self) -> io::Result<&OwnedFd> {
        if let Some(fd) = self.fd.get() {
            return Ok(fd);
        }
        let made = rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        // Another thread may have made one first: theirs is kept, this one closed.
        Ok(self.fd.get_or_init(|| made))
    }

    /// The poller: arms for one event, for a completion past `producer` (the producer
    /// index it sees). The fence orders the arm before the poll that must follow it.
    pub(crate) fn arm(&self, producer: u64) -> io::Result<()> {
        self.fd()?;
        self.armed_at.store(producer, Ordering::Relaxed);
        self.armed.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// The descriptor a reactor watches (readable while an event is pending).
    pub(crate) fn raw_fd(&self) -> io::Result<RawFd> {
        Ok(self.fd()?.as_raw_fd())
    }

    /// Takes the pending events without waiting; how many.
    pub(crate) fn take(&self) -> io::Result<u32> {
        let fd = self.fd()?;
        let mut count = [0u8; 8];
        match rustix::io::read(fd, &mut count) {
            Ok(8) => Ok(u32::try_from(u64::from_ne_bytes(count)).unwrap_or(u32::MAX)),
            Ok(n) => Err(io::Error::other(format!(
                "an eventfd read gave {n} bytes, not 8"
            ))),
            Err(rustix::io::Errno::AGAIN) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Sleeps until an event is pending or `timeout` passes, then takes the events.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> io::Result<u32> {
        let fd = self.fd()?;
        let end = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        loop {
            let left = end.map(|end| end.saturating_duration_since(std::time::Instant::now()));
            let spec = left.map(|left| Timespec {
                tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(left.subsec_nanos()),
            });
            let mut fds = [PollFd::new(fd, PollFlags::IN)];
            match rustix::event::poll(&mut fds, spec.as_ref()) {
                Ok(0) => return Ok(0),
                Ok(_) => match self.take()? {
                    // Taken by another waiter: wait on.
                    0 if left.is_none_or(|left| !left.is_zero()) => continue,
                    n => return Ok(n),
                },
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The NIC: whether to make an event now (the CQ armed, and completions added past
    /// the arm's producer index, `producer` being the CQ's). Disarms when it says yes: one
    /// event per arm.
    pub(crate) fn due(&self, producer: u64) -> bool {
        self.armed.load(Ordering::Acquire)
            && self.armed_at.load(Ordering::Relaxed) != producer
            && self.armed.swap(false, Ordering::AcqRel)
    }

    /// The NIC: makes the event [`due`](Self::due) said. A failed write (the counter at its
    /// maximum, which takes 2^64 - 2 events nobody took) loses nothing: the event is
    /// pending already.
    pub(crate) fn signal(&self) {
        if let Some(fd) = self.fd.get() {
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_arm_and_only_for_completions_after_the_look() -> io::Result<()> {
        let ev = CqEvents::new();
        // Not armed: completions make no event.
        assert!(!ev.due(1));
        ev.arm(1)?;
        // Armed, but nothing new since the arm.
        assert!(!ev.due(1));
        assert!(ev.due(2));
        ev.signal();
        // Disarmed by the event: the next completion makes none.
        assert!(!ev.due(3));
        assert_eq!(ev.take()?, 1);
        assert_eq!(ev.take()?, 0);
        Ok(())
    }

    #[test]
    fn a_wait_ends_with_the_event_or_the_time() -> io::Result<()> {
        let ev = CqEvents::new();
        let start = std::time::Instant::now();
        assert_eq!(ev.wait(Some(Duration::from_millis(30)))?, 0);
        assert!(start.elapsed() >= Duration::from_millis(30));
        ev.arm(0)?;
        assert!(ev.due(1));
        ev.signal();
        assert_eq!(ev.wait(None)?, 1);
        Ok(())
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// The race: the NIC adds a completion and looks (on its next turn, without a fence,
    /// and before it sleeps, behind one) while the poller arms and polls again. In every
    /// interleaving the poller sees the completion or gets the event.
    #[test]
    fn a_completion_is_polled_after_the_arm_or_makes_an_event() {
        loom::model(|| {
            let ev = Arc::new(CqEvents {
                armed: AtomicBool::new(false),
                armed_at: AtomicU64::new(0),
                fd: OnceLock::new(),
            });
            let producer = Arc::new(AtomicU64::new(0));
            let nic = {
                let (ev, producer) = (Arc::clone(&ev), Arc::clone(&producer));
                loom::thread::spawn(move || {
                    producer.store(1, Ordering::Release);
                    let turn = ev.due(1);
                    fence(Ordering::SeqCst);
                    turn || ev.due(1)
                })
            };
            // The poller's arm without the eventfd (loom runs no syscalls).
            let seen = producer.load(Ordering::Acquire);
            ev.armed_at.store(seen, Ordering::Relaxed);
            ev.armed.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let polled = producer.load(Ordering::Acquire) == 1;
            let event = nic.join().expect("the NIC's thread");
            assert!(polled || event);
            // And no event for a completion the poller had seen before it armed.
            assert!(!(seen == 1 && event));
        });
    }
}

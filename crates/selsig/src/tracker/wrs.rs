//! What the tracker holds of its work requests, outstanding and retired, until they are
//! handed back: kept column by column, so that the work request no completion names, the
//! common one, costs its slot and nothing else.
//!
//! - `slots`: each work request's [`Slot`], at its sequence number modulo the slots' count
//!   (a power of two): the caller's payload and whether it was signaled, or a marker;
//! - `signaled`: the outstanding signaled work requests' sequence numbers and reasons
//!   (markers are those whose reason is [`SignalReason::Marker`]);
//! - `stamps`: the instants of posting, one per run of work requests posted at one
//!   instant (a batch), for the confirmation lag and the `Adaptive` policy (0 while the
//!   tracker does not read the clock);
//! - `segments`: the outcomes of the retired work requests, one per completion handled
//!   (merged where they say the same): `before` for each, `this` for the last.
//!
//! Sequence numbers `head..retired_end` are retired and not handed back yet,
//! `retired_end..next` outstanding.

use std::collections::VecDeque;

use super::types::{Outcome, SignalReason};

/// One work request in the store.
#[derive(Debug)]
enum Slot<T> {
    /// Handed back, or never used.
    Empty,
    Marker,
    Unsignaled(T),
    Signaled(T),
}

impl<T> Slot<T> {
    #[inline(always)]
    fn take(&mut self) -> Slot<T> {
        std::mem::replace(self, Slot::Empty)
    }
}

/// Bytes the store holds for each work request with a `u64` payload: its slot.
#[cfg(test)]
pub(super) const SLOT_BYTES_U64: usize = std::mem::size_of::<Slot<u64>>();

/// Bytes more for each outstanding signaled work request (and marker).
#[cfg(test)]
pub(super) const PER_SIGNALED_BYTES: usize = std::mem::size_of::<Sig>();

/// Bytes more for each instant work requests were posted at (a batch).
#[cfg(test)]
pub(super) const PER_INSTANT_BYTES: usize = std::mem::size_of::<Stamp>();

/// A signaled work request.
#[derive(Debug, Clone, Copy)]
struct Sig {
    seq: u64,
    reason: SignalReason,
}

/// Work requests from `seq` on (to the next stamp's) were posted at `ns`.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    seq: u64,
    ns: u64,
}

/// The retired work requests up to `end` (exclusive, from the previous segment's end) had
/// the outcome `before`, but the last, `end - 1`, which had `this`.
#[derive(Debug, Clone, Copy)]
struct Segment {
    end: u64,
    before: Outcome,
    this: Outcome,
}

/// One retired work request taken from the store.
pub(super) struct Taken<T> {
    pub seq: u64,
    /// `None` for a marker.
    pub payload: Option<T>,
    pub outcome: Outcome,
    pub signaled: bool,
}

#[derive(Debug)]
pub(super) struct Wrs<T> {
    slots: Vec<Slot<T>>,
    /// `slots.len() - 1`.
    mask: u64,
    signaled: VecDeque<Sig>,
    stamps: VecDeque<Stamp>,
    segments: VecDeque<Segment>,
    head: u64,
    retired_end: u64,
    next: u64,
    /// Markers among the outstanding work requests.
    markers: u32,
    /// The instant of the last stamp, if there is one.
    last_stamp: Option<u64>,
}

impl<T> Wrs<T> {
    /// Room for `capacity` outstanding work requests (markers included) without
    /// allocating; `None` if it cannot be allocated.
    pub fn new(capacity: usize, first_seq: u64) -> Option<Self> {
        let len = capacity.checked_next_power_of_two()?;
        let mut wrs = Wrs {
            slots: Vec::new(),
            mask: len as u64 - 1,
            signaled: VecDeque::new(),
            stamps: VecDeque::new(),
            segments: VecDeque::new(),
            head: first_seq,
            retired_end: first_seq,
            next: first_seq,
            markers: 0,
            last_stamp: None,
        };
        // A stamp per outstanding work request at most (each posted at an instant of its
        // own), and one before them that covers retired ones; outcome segments beyond a
        // few come only with errors.
        let ok = wrs.slots.try_reserve_exact(len).is_ok()
            && wrs.signaled.try_reserve_exact(capacity).is_ok()
            && wrs.stamps.try_reserve_exact(capacity + 1).is_ok()
            && wrs.segments.try_reserve_exact(4).is_ok();
        if !ok {
            return None;
        }
        wrs.slots.resize_with(len, || Slot::Empty);
        Some(wrs)
    }

    #[inline(always)]
    fn slot(&mut self, seq: u64) -> &mut Slot<T> {
        &mut self.slots[(seq & self.mask) as usize]
    }

    // ----- where things stand ----------------------------------------------------------

    /// The sequence number the next work request gets.
    #[inline]
    pub fn next(&self) -> u64 {
        self.next
    }

    /// The first outstanding sequence number (`next` when none is).
    #[inline]
    pub fn retired_end(&self) -> u64 {
        self.retired_end
    }

    #[inline]
    pub fn outstanding(&self) -> u64 {
        self.next - self.retired_end
    }

    /// Retired work requests not handed back yet, markers included.
    #[inline]
    pub fn pending(&self) -> u64 {
        self.retired_end - self.head
    }

    pub fn signaled_outstanding(&self) -> usize {
        self.signaled.len()
    }

    /// The earliest outstanding signaled work request.
    #[inline]
    pub fn earliest_signaled(&self) -> Option<u64> {
        self.signaled.front().map(|s| s.seq)
    }

    /// Whether outstanding work request `seq` was signaled.
    pub fn is_signaled(&self, seq: u64) -> bool {
        !matches!(self.slots[(seq & self.mask) as usize], Slot::Unsignaled(_))
    }

    /// The last outstanding signaled work request's sequence number.
    pub fn last_signaled(&self) -> Option<u64> {
        self.signaled.back().map(|s| s.seq)
    }

    /// When outstanding work request `seq` was posted (0 where the clock was not read).
    pub fn posted_ns(&self, seq: u64) -> u64 {
        let stamp = self.stamps.iter().rev().find(|s| s.seq <= seq);
        stamp.map_or(0, |s| s.ns)
    }

    // ----- posting ---------------------------------------------------------------------

    /// Registers the next work request, the caller's, signaled for `signal` or not.
    #[inline(always)]
    pub fn push(&mut self, payload: T, signal: Option<SignalReason>) {
        let seq = self.next;
        if seq - self.head > self.mask {
            self.grow();
        }
        let slot = &mut self.slots[(seq & self.mask) as usize];
        match signal {
            None => *slot = Slot::Unsignaled(payload),
            Some(reason) => {
                *slot = Slot::Signaled(payload);
                self.signaled.push_back(Sig { seq, reason });
            }
        }
        self.next = seq + 1;
    }

    /// Registers the next work request, a marker (signaled, with no payload).
    pub fn push_marker(&mut self) {
        let seq = self.next;
        if seq - self.head > self.mask {
            self.grow();
        }
        *self.slot(seq) = Slot::Marker;
        self.markers += 1;
        self.signaled.push_back(Sig {
            seq,
            reason: SignalReason::Marker,
        });
        self.next = seq + 1;
    }

    /// [`push`](Self::push) for up to `k` of `payloads`, unsignaled, each sequence number
    /// handed to `f` once registered; how many it took.
    #[inline(always)]
    pub fn push_run(
        &mut self,
        payloads: &mut impl Iterator<Item = T>,
        k: usize,
        mut f: impl FnMut(u64),
    ) -> usize {
        /// Sets `next` past what was registered, also when `f` unwinds.
        struct Next<'a>(&'a mut u64, u64);
        impl Drop for Next<'_> {
            fn drop(&mut self) {
                *self.0 = self.1;
            }
        }
        while self.next + k as u64 - self.head > self.mask + 1 {
            self.grow();
        }
        let (start, mask) = (self.next, self.mask);
        let mut next = Next(&mut self.next, start);
        for payload in payloads.take(k) {
            let seq = next.1;
            self.slots[(seq & mask) as usize] = Slot::Unsignaled(payload);
            next.1 = seq + 1;
            f(seq);
        }
        (next.1 - start) as usize
    }

    /// Twice the slots, for work requests retired and not handed back beyond the room made
    /// at creation.
    #[cold]
    fn grow(&mut self) {
        let len = self.slots.len() * 2;
        let mask = len as u64 - 1;
        let mut slots = Vec::with_capacity(len);
        slots.resize_with(len, || Slot::Empty);
        for seq in self.head..self.next {
            slots[(seq & mask) as usize] = self.slot(seq).take();
        }
        (self.slots, self.mask) = (slots, mask);
    }

    /// The work requests from the next one on are posted at `ns`.
    #[inline(always)]
    pub fn stamp(&mut self, ns: u64) {
        if self.last_stamp != Some(ns) {
            self.stamps.push_back(Stamp { seq: self.next, ns });
            self.last_stamp = Some(ns);
        }
    }

    /// Forgets the work requests from `from` on (outstanding: the caller checked): each
    /// signaled one's reason goes to `unsignal`; returns how many of them were the
    /// caller's, whose payloads [`take_back`](Self::take_back) then hands back.
    pub fn truncate(&mut self, from: u64, mut unsignal: impl FnMut(SignalReason)) -> usize {
        let mut markers = 0u64;
        while self.signaled.back().is_some_and(|s| s.seq >= from) {
            if let Some(s) = self.signaled.pop_back() {
                markers += u64::from(s.reason == SignalReason::Marker);
                unsignal(s.reason);
            }
        }
        while self.stamps.back().is_some_and(|s| s.seq >= from) {
            self.stamps.pop_back();
        }
        self.last_stamp = self.stamps.back().map(|s| s.ns);
        self.markers -= markers as u32;
        let removed = self.next - from;
        self.next = from;
        (removed - markers) as usize
    }

    /// The payloads of the `n` work requests of the caller's that
    /// [`truncate`](Self::truncate) cut off, in posting order; those not taken from the
    /// iterator are dropped with it.
    pub fn take_back(&mut self, n: usize) -> TakeBack<'_, T> {
        TakeBack {
            seq: self.next,
            mask: self.mask,
            slots: &mut self.slots,
            left: n,
        }
    }

    // ----- retiring --------------------------------------------------------------------

    /// Retires the outstanding work requests up to `seq`: `this` for `seq`, `before` for
    /// the others. Where `lags`, each run of the caller's work requests posted at one
    /// instant goes to `lag` with its instant and length. Returns how many of the caller's
    /// work requests it retired and whether `seq` is one.
    #[inline(always)]
    pub fn retire(
        &mut self,
        seq: u64,
        (before, this): (Outcome, Outcome),
        lags: bool,
        lag: impl FnMut(u64, u64),
    ) -> (u64, bool) {
        let first = self.retired_end;
        let count = seq + 1 - first;
        if lags {
            self.lags(first, seq, lag);
        }
        let (mut markers, mut own_marker) = (0u64, false);
        while let Some(s) = self.signaled.front().copied().filter(|s| s.seq <= seq) {
            self.signaled.pop_front();
            if s.reason == SignalReason::Marker {
                markers += 1;
                own_marker = s.seq == seq;
            }
        }
        self.markers -= markers as u32;
        while self.stamps.len() > 1 && self.stamps[1].seq <= seq + 1 {
            self.stamps.pop_front();
        }
        // The segments of work requests all taken already go (the last stays: it may
        // merge with this one).
        while self.segments.len() > 1 && self.segments[0].end <= self.head {
            self.segments.pop_front();
        }
        let completed = Outcome::Completed;
        match self.segments.back_mut() {
            Some(last)
                if (before, this) == (completed, completed)
                    && (last.before, last.this) == (completed, completed) =>
            {
                last.end = seq + 1;
            }
            _ => self.segments.push_back(Segment {
                end: seq + 1,
                before,
                this,
            }),
        }
        self.retired_end = seq + 1;
        (count - markers, !own_marker)
    }

    /// Hands `lag` each run of the caller's work requests among `first..=last` posted at
    /// one instant: the instant and how many.
    #[inline(always)]
    fn lags(&self, first: u64, last: u64, mut lag: impl FnMut(u64, u64)) {
        // Most often one instant covers them all, and none is a marker.
        if let Some(stamp) = self.stamps.front()
            && self.markers == 0
            && stamp.seq <= first
            && self.stamps.get(1).is_none_or(|next| next.seq > last)
        {
            lag(stamp.ns, last + 1 - first);
            return;
        }
        let mut stamps = self.stamps.iter().peekable();
        while let Some(stamp) = stamps.next() {
            let end = stamps.peek().map_or(self.next, |s| s.seq).min(last + 1);
            let start = stamp.seq.max(first);
            if start >= end {
                if stamp.seq > last {
                    break;
                }
                continue;
            }
            let markers = match self.markers {
                0 => 0,
                _ => self
                    .signaled
                    .iter()
                    .filter(|s| s.reason == SignalReason::Marker && (start..end).contains(&s.seq))
                    .count() as u64,
            };
            let n = end - start - markers;
            if n > 0 {
                lag(stamp.ns, n);
            }
        }
    }

    /// Retires every outstanding work request with `outcome` at once (the device was
    /// lost); how many of the caller's.
    pub fn retire_all(&mut self, outcome: Outcome) -> u64 {
        let count = self.outstanding();
        if count == 0 {
            return 0;
        }
        let user = count - u64::from(self.markers);
        self.segments.push_back(Segment {
            end: self.next,
            before: outcome,
            this: outcome,
        });
        self.markers = 0;
        self.signaled.clear();
        self.stamps.clear();
        self.last_stamp = None;
        self.retired_end = self.next;
        user
    }

    // ----- handing back ----------------------------------------------------------------

    /// The segment of the next retired work request to take (those before it, all taken,
    /// are dropped by the next [`take`](Self::take)).
    #[inline]
    fn segment(&self) -> Option<&Segment> {
        self.segments.iter().find(|s| s.end > self.head)
    }

    /// The next retired work request, in posting order.
    #[inline]
    pub fn take(&mut self) -> Option<Taken<T>> {
        let seq = self.head;
        while self.segments.front().is_some_and(|s| s.end <= seq) {
            self.segments.pop_front();
        }
        if seq == self.retired_end {
            return None;
        }
        let segment = *self.segments.front()?;
        let outcome = match seq + 1 == segment.end {
            true => {
                self.segments.pop_front();
                segment.this
            }
            false => segment.before,
        };
        self.head = seq + 1;
        let (payload, signaled) = match self.slot(seq).take() {
            Slot::Unsignaled(payload) => (Some(payload), false),
            Slot::Signaled(payload) => (Some(payload), true),
            Slot::Marker => (None, true),
            Slot::Empty => (None, false),
        };
        Some(Taken {
            seq,
            payload,
            outcome,
            signaled,
        })
    }

    /// The next retired work request's outcome and whether it is a marker, without taking
    /// it.
    #[inline]
    pub fn peek(&self) -> Option<(Outcome, bool)> {
        if self.head == self.retired_end {
            return None;
        }
        let segment = self.segment()?;
        let outcome = match self.head + 1 == segment.end {
            true => segment.this,
            false => segment.before,
        };
        let slot = &self.slots[(self.head & self.mask) as usize];
        Some((outcome, matches!(slot, Slot::Marker)))
    }

    /// How many retired work requests from the head on have the outcome of the first's
    /// (which it returns): those [`take_plain`](Self::take_plain) may take without looking
    /// at each's outcome.
    #[inline]
    pub fn plain(&self) -> (u64, Outcome) {
        let Some(segment) = self.segment() else {
            return (0, Outcome::Completed);
        };
        let end = match segment.before == segment.this {
            true => segment.end,
            false => segment.end - 1,
        };
        (end.saturating_sub(self.head), segment.before)
    }

    /// Takes the next `n` work requests, of a [`plain`](Self::plain) run, handing `f`
    /// each of the caller's payloads with its sequence number and whether it was
    /// signaled. If `f` unwinds, the ones it had are taken and the rest stay.
    #[inline(always)]
    pub fn take_plain(&mut self, n: u64, mut f: impl FnMut(u64, T, bool)) {
        /// Sets the head past what was taken, also when `f` unwinds.
        struct Head<'a>(&'a mut u64, u64);
        impl Drop for Head<'_> {
            fn drop(&mut self) {
                *self.0 = self.1;
            }
        }
        let mask = self.mask;
        let start = self.head;
        let mut head = Head(&mut self.head, start);
        for seq in start..start + n {
            head.1 = seq + 1;
            match self.slots[(seq & mask) as usize].take() {
                Slot::Unsignaled(payload) => f(seq, payload, false),
                Slot::Signaled(payload) => f(seq, payload, true),
                Slot::Marker | Slot::Empty => {}
            }
        }
    }
}

/// The payloads [`Wrs::take_back`] hands back.
pub(super) struct TakeBack<'a, T> {
    slots: &'a mut [Slot<T>],
    mask: u64,
    /// The next slot to look at.
    seq: u64,
    /// Payloads left to hand back.
    left: usize,
}

impl<T> Iterator for TakeBack<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        while self.left > 0 {
            let slot = self.slots[(self.seq & self.mask) as usize].take();
            self.seq += 1;
            if let Slot::Unsignaled(payload) | Slot::Signaled(payload) = slot {
                self.left -= 1;
                return Some(payload);
            }
        }
        None
    }
}

impl<T> Drop for TakeBack<'_, T> {
    fn drop(&mut self) {
        // Dropped now, as a rollback's payloads not taken were before.
        for _ in self.by_ref() {}
    }
}

//! Sleeping while a wait finds nothing to poll: on the completion events of the CQs it
//! waits on, so that a wait for a completion that does not come uses no CPU.

use std::time::Duration;

use anyhow::Result;
use selsig::{CompletionQueue, CqError, Device};

use super::runner::Runner;

/// The longest sleep on one CQ's event while a completion may also come to other CQs: one
/// there is found at the latest this late (the sleep ends, and the wait polls them all
/// again). Sleeping on all their events at once would take `poll(2)` on the descriptors
/// [`CompletionQueue::event_fd`] gives, raw ones, and borrowing one is `unsafe`, which this
/// crate forbids; a wake every 10 ms costs well under 1 % of a core.
const SLICE: Duration = Duration::from_millis(10);

/// What a wait knows of its CQs' events: which CQs it armed since it last slept, and
/// whether they give events at all.
#[derive(Debug)]
pub(super) struct Sleeper {
    armed: Option<Vec<usize>>,
    events: bool,
}

impl Sleeper {
    pub fn new() -> Self {
        Sleeper {
            armed: None,
            events: true,
        }
    }
}

impl<D: Device> Runner<'_, D> {
    /// A round of polls found nothing; a completion can come only to `cqs` (indices into
    /// the run's CQs, the one to sleep on first), and the wait gives up in `left`.
    ///
    /// The waiter's order: an idle round that finds these CQs not armed arms them and
    /// returns, for the caller to poll again (a completion that came before the arm need
    /// not make an event: that poll finds it); the next idle round sleeps until the first
    /// CQ's event or `left` passes (at most [`SLICE`] when there are others), then takes
    /// the events pending on the others, and the caller polls again. Polls that find
    /// completions in between leave the arms as they are: each still waits for its CQ's
    /// next completion, or a completion since used it and its event is pending (only a
    /// sleep takes events), which ends the sleep at once, or, on another CQ than the one
    /// slept on, at the end of the slice.
    ///
    /// CQs without events ([`CqError::NoEvents`]) make it yield instead, as the waits did
    /// before there were events.
    pub fn sleep_idle(&self, s: &mut Sleeper, cqs: &[usize], left: Duration) -> Result<()> {
        let Some((&first, others)) = cqs.split_first() else {
            return Ok(());
        };
        if !s.events {
            std::thread::yield_now();
            return Ok(());
        }
        if s.armed.as_deref() != Some(cqs) {
            for &cq in cqs {
                match self.cqs[cq].req_notify() {
                    Ok(()) => {}
                    Err(CqError::NoEvents) => {
                        s.events = false;
                        std::thread::yield_now();
                        return Ok(());
                    }
                    Err(e) => return Err(self.event_error(cq, e)),
                }
            }
            s.armed = Some(cqs.to_vec());
            return Ok(());
        }
        let slice = match others.is_empty() {
            true => left,
            false => left.min(SLICE),
        };
        s.armed = None;
        self.cqs[first]
            .wait_event(Some(slice))
            .map_err(|e| self.event_error(first, e))?;
        for &cq in others {
            self.cqs[cq]
                .take_events()
                .map_err(|e| self.event_error(cq, e))?;
        }
        Ok(())
    }

    fn event_error(&self, cq: usize, e: CqError) -> anyhow::Error {
        anyhow::Error::new(e).context(format!(
            "cannot wait for the completion events of cq {:?}",
            self.sc.cqs[cq].name
        ))
    }
}

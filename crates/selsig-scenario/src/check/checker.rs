//! What every phase of the checker shares: the file as read, how an error names its place
//! in the text, the checks of names and access flags, and the format's limits.

use std::ops::Range;

use selsig::Access;

use crate::error::ScenarioError;
use crate::format::File;

/// Largest region a scenario may register.
pub(crate) const MAX_REGION: u64 = 64 << 20;
/// The most entries of a post's `list`, and the most `max_send_sge` a QP may ask for:
/// rxe's (`RXE_MAX_SGE`).
pub(crate) const MAX_SGE: u32 = 32;
/// Most work requests one post step may post (or receives one recv step).
pub(crate) const MAX_COUNT: u64 = 1 << 20;
/// Most work requests and receives a scenario may post in all (the trace keeps an event
/// or more for each: about 450 bytes a work request).
pub(crate) const MAX_TOTAL: u64 = 1 << 21;
/// Most memory all regions of a scenario may take together.
pub(crate) const MAX_REGIONS_TOTAL: u64 = 1 << 30;
/// Most queue pairs (each with its peer) a scenario may create.
pub(crate) const MAX_QPS: usize = 64;

/// A place in the file: a byte range of the text, or `None` for the whole file.
pub(super) type Span = Option<Range<usize>>;

/// The file as read, and how an error names its place in the text.
pub(super) struct Checker<'a> {
    pub raw: &'a File,
    pub at: &'a dyn Fn(Span, String) -> ScenarioError,
}

impl Checker<'_> {
    pub fn err(&self, span: Span, message: String) -> ScenarioError {
        (self.at)(span, message)
    }

    pub fn name_ok(&self, name: &str, span: Span, what: &str) -> Result<(), ScenarioError> {
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && name.len() <= 32;
        if ok {
            Ok(())
        } else {
            Err(self.err(
                span,
                format!("{what} name {name:?}: use 1 to 32 letters, digits, '_' or '-'"),
            ))
        }
    }

    /// The access flags `names` give; `what` names the list in an error.
    pub fn access(
        &self,
        names: &[String],
        span: Span,
        what: &str,
    ) -> Result<Access, ScenarioError> {
        let mut a = Access::empty();
        for n in names {
            a |= match n.as_str() {
                "local_write" => Access::LOCAL_WRITE,
                "remote_write" => Access::REMOTE_WRITE,
                "remote_read" => Access::REMOTE_READ,
                "remote_atomic" => Access::REMOTE_ATOMIC,
                o => {
                    return Err(self.err(span, format!(
                        "{what}: unknown access {o:?}: expected local_write, remote_write, remote_read or remote_atomic"
                    )));
                }
            };
        }
        Ok(a)
    }
}

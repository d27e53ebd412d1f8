//! Scenario files: a send-queue story in TOML (see docs/scenarios.md), parsed and checked
//! before anything runs. Every error names the file, the line and the problem.
//!
//! The phases, in order: the file's shape (`format`: serde), then the sections, each
//! checked against what came before: the description and device, the CQs (`cqs`), the QPs
//! and their own CQs (`qps`), whether each CQ holds its completions, the regions
//! (`regions`), the steps (`steps`, `post`; the receive queues as the steps leave them:
//! `bounds`), then `[differs]` and `[expect]` (`expect`). The first error found is the one
//! reported.

use std::path::Path;

use crate::error::ScenarioError;
use crate::format::{File, PollStep};
use crate::model::{Action, Qp, Region, Scenario};

mod bounds;
mod checker;
mod cqs;
mod expect;
mod post;
mod qps;
mod regions;
mod steps;
#[cfg(test)]
mod tests;

use checker::{Checker, Span};
use steps::{Here, Steps};

/// Reads and checks a scenario file: the [`Scenario`], or the first problem, with the
/// file's path, the line and the column of the entry at fault.
///
/// `-` is standard input (named `<stdin>` in errors, and `stdin` the scenario), as for most
/// tools that read a file. The scenario is named after the file, without its extension. A
/// file larger than 4 MiB, which no scenario is, is refused unread.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    use std::io::Read as _;
    // `-` is standard input, as for most tools that read a file.
    let stdin = path == Path::new("-");
    let file = if stdin {
        "<stdin>".to_string()
    } else {
        path.display().to_string()
    };
    let error = |message: String| ScenarioError {
        file: file.clone(),
        line: 0,
        column: 0,
        message,
    };
    // Read up to one byte past the limit: a file larger than any scenario (or a device
    // that never ends, as /dev/zero) is refused, not read until memory runs out. A pipe
    // (`selsig run <(generate)`) is read as a file is.
    let mut text = String::new();
    let read = if stdin {
        std::io::stdin()
            .lock()
            .take(MAX_FILE + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_FILE + 1).read_to_string(&mut text))
    };
    read.map_err(|e| error(format!("cannot read the scenario: {e}")))?;
    if text.len() as u64 > MAX_FILE {
        return Err(error(format!(
            "larger than {} MiB: not a scenario",
            MAX_FILE >> 20
        )));
    }
    if stdin {
        return parse(&file, "stdin", &text);
    }
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.clone());
    parse(&file, &name, &text)
}

/// The largest scenario file read. Scenarios are a few kilobytes; counts, not lines,
/// make long runs.
const MAX_FILE: u64 = 4 << 20;

/// Parses and checks scenario text: the [`Scenario`] (called `name`), or the first
/// problem; `file` names the text in errors (`file:line:column: problem`).
pub fn parse(file: &str, name: &str, text: &str) -> Result<Scenario, ScenarioError> {
    let at = |span: Span, message: String| {
        let (line, column) = span.map_or((0, 0), |s| line_col(text, s.start));
        ScenarioError {
            file: file.to_string(),
            line,
            column,
            message,
        }
    };
    let raw: File = toml::from_str(text).map_err(|e| at(e.span(), e.message().to_string()))?;
    Checker { raw: &raw, at: &at }.check(name)
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

impl Checker<'_> {
    /// Checks the file, section after section.
    fn check(&self, name: &str) -> Result<Scenario, ScenarioError> {
        let raw = self.raw;
        if raw.description.get_ref().trim().is_empty() {
            return Err(self.err(
                Some(raw.description.span()),
                "description is empty: say what the scenario shows".into(),
            ));
        }
        let personality = match &raw.device.personality {
            None => None,
            Some(p) => Some(p.get_ref().parse().map_err(|e: String| {
                self.err(Some(p.span()), format!("device.personality: {e}"))
            })?),
        };
        let post_api =
            match &raw.device.post_api {
                None => None,
                Some(p) => Some(p.get_ref().parse().map_err(|e: String| {
                    self.err(Some(p.span()), format!("device.post_api: {e}"))
                })?),
            };
        // CQs: declared ones, then one per QP side that names none.
        let mut cqs = self.declared_cqs()?;
        let qps = self.qps(&mut cqs)?;
        self.cqs_used(&cqs, &qps)?;
        let regions = self.regions()?;
        let (steps, deregistered) = self.steps(&qps, &regions)?;
        let differs = self.differs()?;
        let (expect, expect_rxe) = self.expect(&qps, &regions, &deregistered, &differs)?;
        Ok(Scenario {
            name: name.to_string(),
            description: raw.description.get_ref().clone(),
            personality,
            post_api,
            cqs,
            qps,
            regions,
            steps,
            expect,
            expect_rxe,
            differs,
        })
    }

    /// The steps, each checked against what the steps before it did; also returns the step
    /// that deregistered each region, if one did.
    fn steps(
        &self,
        qps: &[Qp],
        regions: &[Region],
    ) -> Result<(Vec<Action>, Vec<Option<usize>>), ScenarioError> {
        let raw = self.raw;
        if raw.step.is_empty() {
            return Err(self.err(None, "a scenario needs at least one [[step]]".into()));
        }
        let mut steps = Vec::new();
        // What earlier steps did: the step that deregistered each region, and what each
        // peer's receive queue may hold at most.
        let mut state = Steps::new(self, qps, regions);
        for (n, s) in raw.step.iter().enumerate() {
            let span = Some(s.span());
            let s = s.get_ref();
            let set = [
                s.post.is_some(),
                s.recv.is_some(),
                s.poll.is_some(),
                s.confirm.is_some(),
                s.drain.is_some(),
                s.dereg.is_some(),
                s.to_error.is_some(),
                s.device_fatal.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if set != 1 {
                return Err(self.err(span, format!(
                    "step {}: give exactly one of post, recv, poll, confirm, drain, dereg, to_error, device_fatal ({set} given)",
                    n + 1
                )));
            }
            let at = Here { n, span };
            let kind = match (&s.poll, &s.drain) {
                (Some(PollStep::Word(w)), _) if w == "idle" => "poll_idle",
                (Some(_), _) => "poll",
                (None, Some(_)) => "drain",
                _ if s.post.is_some() => "post",
                _ if s.recv.is_some() => "recv",
                _ if s.confirm.is_some() => "confirm",
                _ if s.dereg.is_some() => "dereg",
                _ if s.to_error.is_some() => "to_error",
                _ => "device_fatal",
            };
            state.after_loss(&at, kind)?;
            let action = if let Some(p) = &s.post {
                state.post(&at, p)?
            } else if let Some(r) = &s.recv {
                state.recv(&at, r)?
            } else if let Some(p) = &s.poll {
                state.poll(&at, p)?
            } else if let Some(q) = &s.confirm {
                state.confirm(&at, q)?
            } else if let Some(q) = &s.drain {
                state.drain(&at, q)?
            } else if let Some(r) = &s.dereg {
                state.dereg(&at, r)?
            } else if let Some(q) = &s.to_error {
                state.error_state(&at, q)?
            } else if let Some(yes) = s.device_fatal {
                state.device_fatal(&at, yes)?
            } else {
                unreachable!("exactly one field is set")
            };
            steps.push(action);
        }
        Ok((steps, state.deregistered))
    }
}

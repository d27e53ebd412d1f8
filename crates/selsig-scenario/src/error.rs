//! The two errors: a scenario the checker refuses ([`ScenarioError`]), and a run that could
//! not start or stopped at a step ([`RunError`]).

use std::fmt;

/// A scenario error: where and what.
#[derive(Debug)]
#[non_exhaustive]
pub struct ScenarioError {
    /// The file, as the caller named it (`<stdin>` for standard input).
    pub file: String,
    /// The line of the problem, from 1; 0 when the error is about the whole file (it cannot
    /// be read, or lacks something).
    pub line: usize,
    /// The column (in characters), from 1; 0 when `line` is 0.
    pub column: usize,
    /// The problem.
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            // About the whole file (it cannot be read, or lacks something).
            return write!(f, "{}: {}", self.file, self.message);
        }
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )
    }
}

impl std::error::Error for ScenarioError {}

/// Why a run could not start (a protection domain, CQ, QP or region the device refused),
/// or where it stopped (the step, then what went wrong).
///
/// It displays its outermost context (`step 3 (poll)`); [`source`](std::error::Error::source)
/// goes down the chain of causes, and the alternate form (`{:#}`) shows them all, joined
/// by `": "`, as `selsig run` prints them.
pub struct RunError(anyhow::Error);

impl RunError {
    pub(crate) fn new(e: anyhow::Error) -> Self {
        RunError(e)
    }
}

impl fmt::Debug for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match f.alternate() {
            true => write!(f, "{:#}", self.0),
            false => write!(f, "{}", self.0),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The outermost error's cause: the next context down the chain.
        self.0.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_error_shows_its_chain_as_anyhow_does() {
        let inner = anyhow::anyhow!("only 0 of 1 completions arrived").context("step 1 (poll)");
        let want = format!(
            "{:#}",
            anyhow::anyhow!("only 0 of 1 completions arrived")
                .context("step 1 (poll)")
                .context("scenario x.toml")
        );
        let e = RunError::new(inner);
        assert_eq!(e.to_string(), "step 1 (poll)");
        assert_eq!(
            format!("{e:#}"),
            "step 1 (poll): only 0 of 1 completions arrived"
        );
        // Wrapped by a caller that adds its own context, the chain is the same.
        let wrapped = anyhow::Error::new(e).context("scenario x.toml");
        assert_eq!(format!("{wrapped:#}"), want);
    }
}

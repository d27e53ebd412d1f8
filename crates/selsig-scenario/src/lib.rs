//! selsig's scenarios: a send-queue story written in TOML, checked before anything runs,
//! then run on any [`selsig::Device`] (the software NIC of `selsig-soft`, rdma-core's
//! libibverbs through `selsig-verbs`, or a provider of your own), giving a canonical trace
//! (JSON lines with no timing and no addresses, the same on every run and on every
//! conforming provider) and the result of the scenario's expectations.
//!
//! `selsig run FILE` is this crate on the command line. The format and the trace are
//! documented in the repository's docs/scenarios.md; the shipped scenarios are in
//! scenarios/.
//!
//! The calls, in order:
//! - [`load`] (a file, `-` for standard input) or [`parse`] (text) check a scenario
//!   and give a [`Scenario`], or a [`ScenarioError`] that names the file, line and column;
//! - [`run()`] runs it on a device with [`RunOptions`] and gives a [`RunResult`]: the trace
//!   ([`Event`]s, [`RunResult::trace_text`]), the expectations that failed and what was
//!   checked, or the step that failed ([`RunError`]).
//!
//! ```
//! use selsig_scenario::{RunOptions, parse};
//! use selsig_soft::{Personality, SoftConfig, SoftDevice};
//!
//! let scenario = parse("two.toml", "two", r#"
//! description = "two WRITEs, the second signaled"
//! [[qp]]
//! name = "a"
//! policy = "every:2"
//! [[region]]
//! name = "src"
//! size = 128
//! fill = "pattern"
//! [[region]]
//! name = "dst"
//! size = 128
//! access = ["local_write", "remote_write"]
//! [[step]]
//! post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 2 }
//! [[step]]
//! poll = "idle"
//! [expect]
//! outcomes = { a = ["1-2 completed"] }
//! "#)?;
//! let device = SoftDevice::open(SoftConfig::with_personality(Personality::Mlx5))?;
//! let result = selsig_scenario::run(&scenario, &device, &RunOptions::new())?;
//! assert!(result.passed(), "{:?} {:?}", result.failures, result.error);
//! assert!(result.trace_text().starts_with("{\"event\":\"step\",\"n\":1,\"kind\":\"post\"}\n"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bytes;
mod campaign;
mod check;
mod error;
mod format;
mod generate;
mod model;
mod races;
mod remote;
mod run;
mod trace;

pub use bytes::{Fnv1a64, fill_pattern, fnv1a64};
pub use campaign::{Violation, check_run, compare_traces, shrink};
pub use check::{load, parse};
pub use error::{RunError, ScenarioError};
pub use generate::{GenOptions, Generated, generate};
pub use model::Scenario;
pub use races::Race;
pub use remote::RemoteSide;
pub use run::{InjectFatal, RunOptions, RunResult, run, run_remote};
/// The software NIC's personality a scenario names (`[device] personality`).
pub use selsig_soft::Personality;
pub use trace::Event;

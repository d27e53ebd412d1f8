//! The limits that several commands share: what `selsig bench` and `selsig demo` may ask of
//! `selsig serve`, and what a server takes from one client. Refers to no other file.

use std::time::Duration;

/// The most memory `selsig bench --region` registers on each side (the soft provider also
/// copies as much for its memcpy yardstick); the largest target region a server registers
/// for one client.
pub const MAX_REGION: u64 = 4 << 30;

/// The most WRITEs one demo runs (and a server accepts from one client): the demo keeps and
/// checks every one.
pub const MAX_WRS: u32 = 1 << 20;

/// The longest run a client may announce (`selsig bench -D` takes no longer point).
pub const MAX_RUN: Duration = Duration::from_secs(24 * 3600);

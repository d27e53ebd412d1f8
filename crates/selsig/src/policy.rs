//! Signaling policies: which work requests ask for a completion.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Decides which work requests are posted with `IBV_SEND_SIGNALED`.
///
/// Whatever the policy, the tracker also signals a work request when the caller asks for
/// it and when leaving it unsignaled could deadlock the queue (see
/// [`SendTracker`](crate::SendTracker)), so `Never` still signals before the queue fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Signal the `n`-th work request after the previous signaled one: at most `n - 1`
    /// unsignaled work requests in a row. `Every(1)` signals everything.
    Every(u32),
    /// Signal every work request (the same as `Every(1)`).
    Always,
    /// Signal only when forced (by the caller, or to keep the queue from deadlocking).
    Never,
    /// Bound both the completion rate and the confirmation lag: signal when the run of
    /// unsignaled work requests would reach `max_unsignaled`, or when the oldest work
    /// request of that run was posted `max_lag` or longer ago. `max_lag` bounds when the
    /// signal is posted behind the oldest: the confirmation lag measured
    /// ([`Stats::lag_ns`](crate::Stats::lag_ns)) adds the signaled work request's execution
    /// and the time until its completion is polled. The policy is consulted at
    /// each post: a caller that may not post again before the lag bound comes due confirms
    /// the run at [`SendTracker::next_deadline`](crate::SendTracker::next_deadline)
    /// (`SignaledQueue::tick`), or the bound grows by the wait for the next post. A
    /// `max_lag` of zero signals every work request.
    Adaptive {
        /// Signal at the latest every `max_unsignaled`-th work request: at most
        /// `max_unsignaled - 1` unsignaled in a row.
        max_unsignaled: u32,
        /// Signal when the oldest unsignaled work request of the run is this old.
        max_lag: Duration,
    },
}

impl Policy {
    /// The policy perftest's `--cq-mod n` applies: signal every `n`-th work request.
    pub const fn every(n: u32) -> Policy {
        Policy::Every(n)
    }

    /// Checks the policy's parameters.
    pub fn validate(&self) -> Result<(), PolicyError> {
        match *self {
            Policy::Every(0) => Err(PolicyError::ZeroInterval),
            Policy::Adaptive {
                max_unsignaled: 0, ..
            } => Err(PolicyError::ZeroInterval),
            Policy::Adaptive { max_lag, .. } if max_lag.as_nanos() > u128::from(u64::MAX) => {
                Err(PolicyError::LagTooLong(max_lag))
            }
            _ => Ok(()),
        }
    }

    /// The longest run of work requests the policy allows between signals, if bounded.
    pub const fn interval(&self) -> Option<u32> {
        match *self {
            Policy::Every(n) => Some(n),
            Policy::Always => Some(1),
            Policy::Never => None,
            Policy::Adaptive { max_unsignaled, .. } => Some(max_unsignaled),
        }
    }
}

impl Default for Policy {
    /// `Every(4)`: the seed example's policy.
    fn default() -> Self {
        Policy::Every(4)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Every(n) => write!(f, "every:{n}"),
            Policy::Always => f.write_str("always"),
            Policy::Never => f.write_str("never"),
            Policy::Adaptive {
                max_unsignaled,
                max_lag,
            } => write!(f, "adaptive:{max_unsignaled},{}", DisplayDuration(*max_lag)),
        }
    }
}

/// Why a policy is invalid or could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// An interval or budget of zero work requests.
    #[error("the signal interval must be at least 1")]
    ZeroInterval,
    /// The text is not one of the known forms.
    #[error(
        "unknown policy {0:?}: expected every:N, always, never or adaptive:N,LAG (e.g. adaptive:64,50us)"
    )]
    Unknown(String),
    /// A number could not be read.
    #[error("invalid number {text:?} in policy: {reason}")]
    Number {
        /// The text that is not a number.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A duration could not be read.
    #[error(
        "invalid duration {0:?} in policy: expected a number followed by ns, us, ms or s (e.g. 50us)"
    )]
    Duration(String),
    /// An adaptive policy's `max_lag` beyond what the tracker's nanosecond clock counts.
    #[error("max_lag {0:?} is longer than 2^64 ns (about 584 years)")]
    LagTooLong(Duration),
}

impl FromStr for Policy {
    type Err = PolicyError;

    /// Parses `every:N`, `always`, `never`, `adaptive:N,LAG` (`LAG` such as `50us`, `2ms`),
    /// or `adaptive:max_unsignaled=N,max_lag=LAG`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (name, args) = match s.split_once(':') {
            Some((name, args)) => (name.trim(), Some(args.trim())),
            None => (s, None),
        };
        let policy = match (name.to_ascii_lowercase().as_str(), args) {
            ("always", None) => Policy::Always,
            ("never", None) => Policy::Never,
            ("every", Some(n)) => Policy::Every(parse_u32(n)?),
            ("adaptive", Some(args)) => {
                let mut max_unsignaled = None;
                let mut max_lag = None;
                for (i, part) in args.split(',').map(str::trim).enumerate() {
                    match (i, part.split_once('=')) {
                        (_, Some(("max_unsignaled" | "budget", v))) if max_unsignaled.is_none() => {
                            max_unsignaled = Some(parse_u32(v.trim())?)
                        }
                        (_, Some(("max_lag" | "lag", v))) if max_lag.is_none() => {
                            max_lag = Some(parse_duration(v.trim())?)
                        }
                        (0, None) => max_unsignaled = Some(parse_u32(part)?),
                        (1, None) if max_lag.is_none() => max_lag = Some(parse_duration(part)?),
                        // Unknown keys, a value given twice, a third value.
                        _ => return Err(PolicyError::Unknown(s.to_string())),
                    }
                }
                match (max_unsignaled, max_lag) {
                    (Some(max_unsignaled), Some(max_lag)) => Policy::Adaptive {
                        max_unsignaled,
                        max_lag,
                    },
                    _ => return Err(PolicyError::Unknown(s.to_string())),
                }
            }
            _ => return Err(PolicyError::Unknown(s.to_string())),
        };
        policy.validate()?;
        Ok(policy)
    }
}

fn parse_u32(text: &str) -> Result<u32, PolicyError> {
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        // (`u32::from_str` would take a sign.)
        return Err(PolicyError::Number {
            text: text.to_string(),
            reason: "not a decimal number".to_string(),
        });
    }
    text.parse::<u32>().map_err(|e| PolicyError::Number {
        text: text.to_string(),
        reason: e.to_string(),
    })
}

/// Parses `123ns`, `50us`, `2ms`, `1s` (also `µs`); a bare number is not accepted.
pub fn parse_duration(text: &str) -> Result<Duration, PolicyError> {
    let bad = || PolicyError::Duration(text.to_string());
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .filter(|&i| i > 0)
        .ok_or_else(bad)?;
    let (num, unit) = text.split_at(split);
    let of: fn(u64) -> Duration = match unit.trim() {
        "ns" => Duration::from_nanos,
        "us" | "µs" => Duration::from_micros,
        "ms" => Duration::from_millis,
        "s" => Duration::from_secs,
        _ => return Err(bad()),
    };
    let n: u64 = num
        .parse()
        .map_err(|e: std::num::ParseIntError| PolicyError::Number {
            text: num.to_string(),
            reason: e.to_string(),
        })?;
    let lag = of(n);
    if lag.as_nanos() > u128::from(u64::MAX) {
        return Err(PolicyError::LagTooLong(lag));
    }
    Ok(lag)
}

/// Formats a duration the way [`parse_duration`] reads it, in the largest exact unit.
struct DisplayDuration(Duration);

impl fmt::Display for DisplayDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        for (unit, per) in [("s", 1_000_000_000u128), ("ms", 1_000_000), ("us", 1_000)] {
            if ns >= per && ns.is_multiple_of(per) {
                return write!(f, "{}{unit}", ns / per);
            }
        }
        write!(f, "{ns}ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!("every:4".parse(), Ok(Policy::Every(4)));
        assert_eq!(" always ".parse(), Ok(Policy::Always));
        assert_eq!("never".parse(), Ok(Policy::Never));
        let adaptive = Policy::Adaptive {
            max_unsignaled: 64,
            max_lag: Duration::from_micros(50),
        };
        assert_eq!("adaptive:64,50us".parse(), Ok(adaptive));
        assert_eq!(
            "adaptive:max_lag=50us,max_unsignaled=64".parse(),
            Ok(adaptive)
        );
        assert_eq!("adaptive:budget=64,lag=50000ns".parse(), Ok(adaptive));
        assert_eq!("adaptive:64,50µs".parse(), Ok(adaptive));
        // Names in any case.
        assert_eq!("ALWAYS".parse(), Ok(Policy::Always));
        assert_eq!("Every:4".parse(), Ok(Policy::Every(4)));
    }

    #[test]
    fn the_default_and_the_intervals() {
        assert_eq!(Policy::default(), Policy::Every(4));
        assert_eq!(Policy::Every(7).interval(), Some(7));
        assert_eq!(Policy::Always.interval(), Some(1));
        assert_eq!(Policy::Never.interval(), None);
        let adaptive = Policy::Adaptive {
            max_unsignaled: 3,
            max_lag: Duration::from_micros(1),
        };
        assert_eq!(adaptive.interval(), Some(3));
    }

    #[test]
    fn display_round_trips() {
        for p in [
            Policy::Every(7),
            Policy::Always,
            Policy::Never,
            Policy::Adaptive {
                max_unsignaled: 3,
                max_lag: Duration::from_millis(2),
            },
            Policy::Adaptive {
                max_unsignaled: 3,
                max_lag: Duration::from_nanos(1500),
            },
        ] {
            assert_eq!(p.to_string().parse(), Ok(p), "{p}");
        }
        let zero = Policy::Adaptive {
            max_unsignaled: 1,
            max_lag: Duration::ZERO,
        };
        assert_eq!(zero.to_string(), "adaptive:1,0ns");
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        assert_eq!("every:0".parse::<Policy>(), Err(PolicyError::ZeroInterval));
        let e = "every:x".parse::<Policy>().unwrap_err().to_string();
        assert!(e.contains("\"x\""), "{e}");
        let e = "sometimes".parse::<Policy>().unwrap_err().to_string();
        assert!(e.contains("sometimes") && e.contains("every:N"), "{e}");
        let e = "adaptive:4,50".parse::<Policy>().unwrap_err().to_string();
        assert!(e.contains("\"50\"") && e.contains("us"), "{e}");
        assert!("adaptive:4".parse::<Policy>().is_err());
        assert!("every".parse::<Policy>().is_err());
        assert!("always:3".parse::<Policy>().is_err());
        // A number beyond 64 bits, a lag beyond the clock: said as such.
        let e = parse_duration("99999999999999999999s")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"99999999999999999999\"") && e.contains("too large"),
            "{e}"
        );
        assert_eq!(
            parse_duration("18446744073709551615s"),
            Err(PolicyError::LagTooLong(Duration::from_secs(u64::MAX)))
        );
        let e = "adaptive:4,100000000000000s".parse::<Policy>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "max_lag 100000000000000s is longer than 2^64 ns (about 584 years)"
        );
        // A sign, a value given twice, a third value.
        let e = "every:+5".parse::<Policy>().unwrap_err().to_string();
        assert!(e.contains("\"+5\""), "{e}");
        assert!(
            "adaptive:budget=1,budget=2,lag=1us"
                .parse::<Policy>()
                .is_err()
        );
        assert!("adaptive:4,lag=1us,max_lag=2us".parse::<Policy>().is_err());
        assert!("adaptive:4,1us,2us".parse::<Policy>().is_err());
        // A bare lag after a named one (it would take the second place of the budget).
        assert!("adaptive:lag=1us,2us,budget=4".parse::<Policy>().is_err());
        // An adaptive budget of zero, as text and as a value.
        assert_eq!(
            "adaptive:0,1us".parse::<Policy>(),
            Err(PolicyError::ZeroInterval)
        );
        let zero = Policy::Adaptive {
            max_unsignaled: 0,
            max_lag: Duration::from_micros(1),
        };
        assert_eq!(zero.validate(), Err(PolicyError::ZeroInterval));
        // A unit with no number is a bad duration, not a bad number.
        assert_eq!(
            parse_duration("us"),
            Err(PolicyError::Duration("us".into()))
        );
    }

    #[test]
    fn a_lag_beyond_the_nanosecond_clock_is_refused() {
        // What the text form can give at most is fine and reads back.
        let longest = Policy::Adaptive {
            max_unsignaled: 8,
            max_lag: Duration::from_nanos(u64::MAX),
        };
        assert_eq!(longest.validate(), Ok(()));
        assert_eq!(longest.to_string().parse::<Policy>(), Ok(longest));
        let beyond = Policy::Adaptive {
            max_unsignaled: 8,
            max_lag: Duration::MAX,
        };
        assert_eq!(
            beyond.validate(),
            Err(PolicyError::LagTooLong(Duration::MAX))
        );
    }
}

//! What every subcommand shares: the provider and device options, opening the device,
//! sizes, patterns.

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use selsig::{Device, ProviderError};
use selsig_soft::{Personality, SoftConfig, SoftDevice};

/// The providers selsig runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProviderKind {
    /// The software RDMA NIC in this process (no hardware needed).
    Soft,
    /// rdma-core's libibverbs: real RNICs and the kernel's Soft-RoCE (rxe).
    Verbs,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Soft => "soft",
            ProviderKind::Verbs => "verbs",
        }
    }
}

/// The soft NIC's personalities, as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PersonalityArg {
    /// Slots freed when a completion is polled (mlx5).
    Mlx5,
    /// Slots freed when a work request executes (kernel Soft-RoCE).
    Rxe,
}

impl From<PersonalityArg> for Personality {
    fn from(p: PersonalityArg) -> Personality {
        match p {
            PersonalityArg::Mlx5 => Personality::Mlx5,
            PersonalityArg::Rxe => Personality::Rxe,
        }
    }
}

/// Where to run: provider, device, personality.
#[derive(Debug, Clone, Args)]
pub struct ProviderArgs {
    /// The provider (`serve` and `--connect` need verbs: the soft NIC connects queue pairs
    /// of one process only).
    #[arg(long, value_enum, default_value_t = ProviderKind::Soft)]
    pub provider: ProviderKind,
    /// The device (verbs: an RDMA device name such as mlx5_0 or rxe0, default the first;
    /// soft: the name given to the software device, default soft0).
    #[arg(long, short = 'd', value_parser = parse_device)]
    pub device: Option<String>,
    /// The software NIC's personality (soft provider only; default mlx5; `run`: the
    /// scenario's, if it names one).
    #[arg(long, value_enum)]
    pub personality: Option<PersonalityArg>,
    /// The GID index for RoCE (verbs provider only; perftest's -x). Default on an Ethernet
    /// (RoCE) port: its RoCE v2 GID with an IPv4 address, else one with a global IPv6
    /// address, else its first RoCE v2 GID, else 0; none on InfiniBand (LID routing). See
    /// `show_gids` or `ibv_devinfo -v`.
    #[arg(allow_negative_numbers = true, long = "gid-index", short = 'x')]
    pub gid_index: Option<u8>,
    /// The device's port (perftest's -i), 1 to 255; default 1, the soft NIC's only one.
    #[arg(
        allow_negative_numbers = true,
        long = "ib-port",
        short = 'i',
        value_parser = clap::value_parser!(u8).range(1..),
        value_name = "PORT"
    )]
    pub ib_port: Option<u8>,
    /// How batches are posted: legacy (ibv_post_send: those before a refused work request
    /// are posted) or extended (ibv_wr_start ... ibv_wr_complete: a batch whole or not at
    /// all; the soft NIC takes batches the same way); default legacy (`run`: the
    /// scenario's, if it names one).
    #[arg(long, value_name = "API")]
    pub post_api: Option<selsig::PostApi>,
}

/// What was opened, for reports.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub provider: ProviderKind,
    pub device: String,
    /// `Some` on the soft provider.
    pub personality: Option<Personality>,
    pub gid_index: Option<u8>,
    /// The device behaves like the kernel's Soft-RoCE: verbs on an rxe device, or the soft
    /// NIC's rxe personality.
    pub rxe: bool,
    /// The port queue pairs connect through.
    pub port: u8,
    /// What makes the device fail on purpose: the soft provider's.
    pub faults: Option<selsig_soft::SoftFaults>,
}

/// Work that runs on any device.
pub trait OnDevice {
    type Output;
    fn run<D: Device>(self, dev: &D, info: &DeviceInfo) -> Result<Self::Output>;
}

/// The context of an error the options caused (a GID index or port the device does not
/// have): the command exits with code 2, as for other bad options.
#[derive(Debug)]
pub struct BadOption(pub &'static str);

impl std::error::Error for BadOption {}

impl std::fmt::Display for BadOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Opens the device the options name and runs `task` on it.
pub fn with_device<T: OnDevice>(args: &ProviderArgs, task: T) -> Result<T::Output> {
    match args.provider {
        ProviderKind::Soft => {
            let personality = args
                .personality
                .map_or(Personality::Mlx5, Personality::from);
            let mut config = SoftConfig::with_personality(personality);
            config.post_api = args.post_api.unwrap_or_default();
            if let Some(name) = &args.device {
                config.name = name.clone();
            }
            if args.gid_index.is_some() {
                return Err(anyhow::Error::new(BadOption(
                    "--gid-index is for the verbs provider (the soft NIC has no GIDs)",
                )));
            }
            if args.ib_port.is_some_and(|p| p != 1) {
                return Err(anyhow::Error::new(BadOption(
                    "--ib-port: the soft NIC has port 1 only",
                )));
            }
            let dev = SoftDevice::open(config).context("cannot open the software device")?;
            let info = DeviceInfo {
                provider: ProviderKind::Soft,
                device: dev.name().to_string(),
                personality: Some(personality),
                gid_index: None,
                rxe: personality == Personality::Rxe,
                port: 1,
                faults: Some(dev.faults()),
            };
            task.run(&dev, &info)
        }
        ProviderKind::Verbs => {
            if args.personality.is_some() {
                return Err(anyhow::Error::new(BadOption(
                    "--personality is for the soft provider; the verbs provider has the device's own",
                )));
            }
            let options = selsig_verbs::VerbsOptions {
                device: args.device.clone(),
                port: args.ib_port,
                gid_index: args.gid_index,
            };
            let dev = selsig_verbs::VerbsDevice::open(&options).map_err(|e| {
                const WHAT: &str = "cannot open the RDMA device";
                // A device name, GID index or port the host does not have. (A host
                // with no device at all is a failure, not bad input: NoDevice.)
                if matches!(e, ProviderError::Invalid { .. }) {
                    anyhow::Error::new(e).context(BadOption(WHAT))
                } else {
                    anyhow::Error::new(e).context(WHAT)
                }
            })?;
            let dev = dev
                .with_post_api(args.post_api.unwrap_or_default())
                .context("cannot post through --post-api extended on this device")?;
            let info = DeviceInfo {
                provider: ProviderKind::Verbs,
                device: dev.name().to_string(),
                personality: None,
                gid_index: dev.gid_index(),
                rxe: dev.is_rxe(),
                port: dev.port(),
                faults: None,
            };
            task.run(&dev, &info)
        }
    }
}

/// The size of the CQ for a send queue of `--tx-depth depth` (and one receive slot): the
/// device may round the send queue up to twice `depth`, and every work request can complete
/// with an error, so two entries per slot, plus the receive queue's one and a marker's.
pub fn cq_entries(depth: u32) -> Result<u32> {
    depth
        .checked_mul(2)
        .and_then(|n| n.checked_add(2))
        .with_context(|| {
            format!(
                "--tx-depth {depth} is too large: its completion queue would need more than {} entries",
                u32::MAX
            )
        })
}

/// A device name: not empty, and no control characters (it is printed, and written into
/// the bench's SVG, where XML allows none of them).
fn parse_device(text: &str) -> std::result::Result<String, String> {
    let name = not_blank(text, "a device name cannot be empty")?;
    match name.chars().any(char::is_control) {
        true => Err("a device name cannot hold control characters".to_string()),
        false => Ok(name),
    }
}

/// `selsig serve`'s address for `--connect`: not empty, and a port (if any) a number.
pub fn parse_host(text: &str) -> std::result::Result<String, String> {
    let host = not_blank(text, "no host given (HOST or HOST:PORT of selsig serve)")?;
    crate::net::host_and_port(&host).map_err(|e| e.to_string())?;
    Ok(host)
}

/// `text`, unless it is empty or only spaces (then `why`).
fn not_blank(text: &str, why: &str) -> std::result::Result<String, String> {
    match text.trim().is_empty() {
        true => Err(why.to_string()),
        false => Ok(text.to_string()),
    }
}

/// Parses a byte count: `64`, `4K`, `4KiB`, `1M`, `64KiB` (K, M, G are binary, as in
/// perftest), a fraction or an exponent that comes to whole bytes (`1.5K`, `1e3`).
///
/// The `parse-size` crate reads the units, but it rounds (`1.3` to 1, `1e-1` to 0) and
/// reads more than a number (`1_000`, `1 e-1`): the number is read here, exactly, as
/// digits with an optional fraction and exponent, then the unit.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let config = parse_size::Config::new().with_binary();
    let invalid = |e: &dyn std::fmt::Display| {
        format!("invalid size {text:?}: {e} (examples: 64, 4K, 1.5K, 64KiB, 1M)")
    };
    let (number, unit) = split_number(text.trim())
        .ok_or_else(|| invalid(&"not a number (digits, a fraction, an exponent) and a unit"))?;
    let unit = if unit.is_empty() {
        1
    } else {
        config.parse_size(format!("1{unit}")).map_err(|_| {
            invalid(&format!(
                "unknown unit {unit:?} (B, or K, M, G, T, P, E alone or with B or iB: all binary)"
            ))
        })?
    };
    match exact_bytes(number, unit) {
        Exact::Whole(n) => u64::try_from(n).map_err(|_| invalid(&"2^64 bytes or more")),
        Exact::Fraction(exact) => Err(invalid(&format!("{exact} is not a whole number of bytes"))),
        Exact::TooLarge => Err(invalid(&"2^64 bytes or more")),
    }
}

/// `text` as its number (digits, with a fraction, `.5` or `5.` too, and an exponent) and its
/// unit (letters, after optional blanks); `None` for anything else.
fn split_number(text: &str) -> Option<(&str, &str)> {
    let b = text.as_bytes();
    let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let int = digits(0);
    let mut end = int;
    if b.get(end) == Some(&b'.') {
        end += 1 + digits(end + 1);
    }
    if end == 0 || (end == 1 && int == 0) {
        return None;
    }
    // An exponent, not a unit (`1E` is an exbibyte): `e` or `E` then digits, signed or not.
    if matches!(b.get(end), Some(b'e' | b'E')) {
        let sign = usize::from(matches!(b.get(end + 1), Some(b'+' | b'-')));
        let exp = digits((end + 1 + sign).min(b.len()));
        if exp > 0 {
            end += 1 + sign + exp;
        }
    }
    let (number, unit) = text.split_at(end);
    let unit = unit.trim_start();
    unit.bytes()
        .all(|c| c.is_ascii_alphabetic())
        .then_some((number, unit))
}

/// The exact number of bytes of a number read by [`split_number`] times `unit`.
#[derive(Debug, PartialEq, Eq)]
enum Exact {
    Whole(u128),
    /// Not whole: the exact value written out.
    Fraction(String),
    TooLarge,
}

fn exact_bytes(number: &str, unit: u64) -> Exact {
    let (mantissa, exponent) = match number.find(['e', 'E']) {
        Some(at) => (&number[..at], &number[at + 1..]),
        None => (number, "0"),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Exact::Whole(0);
    }
    let trimmed = digits.trim_end_matches('0');
    let zeros = (digits.len() - trimmed.len()) as i128;
    // value = trimmed × unit × 10^scale; an exponent beyond i64 is beyond any size.
    let exponent: i128 = match exponent.parse::<i64>() {
        Ok(e) => e.into(),
        Err(_) if exponent.starts_with('-') => i128::from(i64::MIN),
        Err(_) => i128::from(i64::MAX),
    };
    let scale = exponent - frac.len() as i128 + zeros;
    let Some(value) = trimmed
        .parse::<u128>()
        .ok()
        .and_then(|m| m.checked_mul(u128::from(unit)))
    else {
        return Exact::TooLarge;
    };
    if scale >= 0 {
        return u32::try_from(scale)
            .ok()
            .and_then(|s| 10u128.checked_pow(s))
            .and_then(|p| value.checked_mul(p))
            .map_or(Exact::TooLarge, Exact::Whole);
    }
    let places = u32::try_from(-scale).unwrap_or(u32::MAX);
    let Some(divisor) = 10u128.checked_pow(places) else {
        // More places than a u128 has digits: a fraction of a byte.
        return Exact::Fraction(match unit {
            1 => number.to_string(),
            _ => format!("{number} × {unit}"),
        });
    };
    if value % divisor == 0 {
        return Exact::Whole(value / divisor);
    }
    let fraction = format!("{:0width$}", value % divisor, width = places as usize);
    Exact::Fraction(format!(
        "{}.{}",
        value / divisor,
        fraction.trim_end_matches('0')
    ))
}

/// The bytes work request `wr` (1-based) writes: never 0, and different for every work
/// request (see [`Pattern`]). `pattern(0, ..)` is a scenario's `fill = "pattern"`: byte `i`
/// is `(7i mod 251) + 1`.
pub fn pattern(wr: u64, len: usize) -> Vec<u8> {
    let p = Pattern::new(wr);
    (0..len).map(|i| p.byte(i)).collect()
}

/// The pattern of one work request: byte `i` is `(d + 7i) mod 251 + 1`, where `d` is digit
/// `i mod 8` of the work request's number in base 251. So the first bytes spell the
/// number: 3 bytes tell apart the work requests below 251^3 (15.8 million), 8 bytes those
/// below 251^8 (1.5 × 10^19); and patterns neither repeat every 251 work requests nor are
/// each other's shifted by a few bytes, as those of a plain `(31 wr + 7i) mod 251` were.
#[derive(Debug, Clone, Copy)]
pub struct Pattern {
    digits: [u8; 8],
}

impl Pattern {
    pub fn new(wr: u64) -> Self {
        let mut digits = [0u8; 8];
        let mut rest = wr;
        for d in &mut digits {
            *d = (rest % 251) as u8;
            rest /= 251;
        }
        Pattern { digits }
    }

    /// Byte `i`.
    pub fn byte(&self, i: usize) -> u8 {
        ((u64::from(self.digits[i % 8]) + 7 * (i as u64 % 251)) % 251) as u8 + 1
    }
}

/// `a–b` or `a` for a range of work-request numbers.
pub fn span(first: u64, last: u64) -> String {
    if first == last {
        format!("WR{first}")
    } else {
        format!("WR{first}–WR{last}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary_like_perftest() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        let e = parse_size("lots").unwrap_err();
        assert!(e.contains("\"lots\"") && e.contains("4K"), "{e}");
        assert!(parse_size("-1").is_err());
        // The largest: 2^64 - 1; 2^64 itself (16 EiB) is one too many.
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        for text in ["16E", "18446744073709551616", "1e30"] {
            let e = parse_size(text).unwrap_err();
            assert!(e.contains("2^64 bytes or more"), "{text}: {e}");
        }
    }

    #[test]
    fn a_fraction_must_come_to_whole_bytes() {
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("0.5KiB"), Ok(512));
        assert_eq!(parse_size("2.0"), Ok(2));
        for text in ["1.3", "100.7", "0.4", "1.0001K"] {
            let e = parse_size(text).unwrap_err();
            assert!(
                e.contains(&format!("{text:?}")) && e.contains("whole number of bytes"),
                "{e}"
            );
        }
    }

    #[test]
    fn an_exponent_must_come_to_whole_bytes_and_the_error_gives_the_exact_value() {
        assert_eq!(parse_size("1e3"), Ok(1000));
        assert_eq!(parse_size("15e-1K"), Ok(1536));
        assert_eq!(parse_size("2.5E1"), Ok(25));
        assert_eq!(parse_size("1000e-3"), Ok(1));
        assert_eq!(parse_size("0e-5"), Ok(0));
        assert_eq!(parse_size("2.25K"), Ok(2304));
        // A unit, not an exponent: an exbibyte.
        assert_eq!(parse_size("1E"), Ok(1 << 60));
        for (text, exact) in [
            ("1e-1", "0.1"),
            ("15e-1", "1.5"),
            ("13e-1", "1.3"),
            ("1e-3K", "1.024"),
            ("1.3e-1K", "133.12"),
            ("1.3", "1.3"),
        ] {
            let e = parse_size(text).unwrap_err();
            assert!(
                e.contains(&format!("{text:?}: {exact} is not a whole number of bytes")),
                "{text}: {e}"
            );
        }
        let e = parse_size("1e-99").unwrap_err();
        assert!(e.contains(": 1e-99 is not a whole number of bytes"), "{e}");
        // Exponents at the ends of 64 bits: refused, without overflow.
        for text in [
            "1e-9223372036854775808",
            "1.5e-9223372036854775808",
            "1e-99999999999999999999",
        ] {
            let e = parse_size(text).unwrap_err();
            assert!(e.contains("is not a whole number of bytes"), "{text}: {e}");
        }
        assert_eq!(parse_size("0e-9223372036854775808"), Ok(0));
        for text in ["1e30", "1e9223372036854775807", "99999999999999999999"] {
            assert!(parse_size(text).is_err(), "{text}");
        }
    }

    #[test]
    fn a_size_is_a_number_and_a_unit_and_nothing_the_parser_would_round() {
        // What the parse-size crate reads past (and rounds): refused.
        for text in [
            "1 e-1", "1_.5", "1_0.5", "1e_-1", "1_e-1K", "2 5e-1", "1e+-1", "3e+-1K", "15e+-1",
            "1_000",
        ] {
            assert!(parse_size(text).is_err(), "{text}: {:?}", parse_size(text));
        }
        let e = parse_size("00012e-1").unwrap_err();
        assert!(e.contains("1.2 is not a whole number"), "{e}");
        assert_eq!(parse_size("0010e-1"), Ok(1));
        assert_eq!(parse_size("1e-0"), Ok(1));
        assert_eq!(parse_size("1E3"), Ok(1000));
        assert_eq!(parse_size("1EiB"), Ok(1 << 60));
        assert_eq!(parse_size("2.5e1K"), Ok(25 * 1024));
        assert_eq!(parse_size(" 4 KiB "), Ok(4096));
        assert_eq!(parse_size("1e+3"), Ok(1000));
        // A fraction with no digit before the point, as the docs allow.
        assert_eq!(parse_size(".5K"), Ok(512));
        assert_eq!(parse_size("5.K"), Ok(5120));
        let e = parse_size(".5").unwrap_err();
        assert!(e.contains(": 0.5 is not a whole number of bytes"), "{e}");
        let e = parse_size("1e-99K").unwrap_err();
        assert!(
            e.contains(": 1e-99 × 1024 is not a whole number of bytes"),
            "{e}"
        );
        // What is not a number and a unit says so; an unknown unit is named.
        for text in ["2 5", "1e2 3", "-1", "lots", "", "K", ".", ".K"] {
            let e = parse_size(text).unwrap_err();
            assert!(e.contains(": not a number (digits"), "{text:?}: {e}");
        }
        let e = parse_size("4Q").unwrap_err();
        assert!(e.contains(": unknown unit \"Q\""), "{e}");
    }

    #[test]
    fn patterns_differ_between_work_requests_and_have_no_zero() {
        assert_ne!(pattern(1, 64), pattern(2, 64));
        assert!(pattern(7, 4096).iter().all(|&b| b != 0));
        assert!(pattern(u64::MAX, 4096).iter().all(|&b| b != 0));
        // A scenario's fill.
        assert!(
            pattern(0, 600)
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (7 * i % 251) as u8 + 1)
        );
        assert_eq!(pattern(0, 600), selsig_scenario::fill_pattern(600));
        // Every work request a demo or a server may check (up to 2^20), 3 bytes each:
        // no two alike, so a WRITE that lands in another's slot is seen.
        let mut seen = std::collections::HashSet::new();
        for wr in 1..=1u64 << 20 {
            assert!(seen.insert(pattern(wr, 3)), "WRITE {wr}");
        }
        // Not periodic in the number (it was: every 251), and not another's shifted.
        assert_ne!(pattern(1, 64), pattern(252, 64));
        // The eighth byte spells the eighth digit.
        assert_ne!(pattern(1, 8), pattern(1 + 251u64.pow(7), 8));
        let long: Vec<Vec<u8>> = (1..=300).map(|wr| pattern(wr, 512)).collect();
        for (a, pa) in long.iter().enumerate() {
            for pb in &long {
                for shift in 1..250 {
                    assert_ne!(
                        &pa[shift..shift + 64],
                        &pb[..64],
                        "WRITE {} by {shift}",
                        a + 1
                    );
                }
            }
        }
    }
}

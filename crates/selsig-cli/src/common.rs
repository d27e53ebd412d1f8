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
    #[arg(long, short = 'd')]
    pub device: Option<String>,
    /// The software NIC's personality (soft provider only; default mlx5; `run`: the
    /// scenario's, if it names one).
    #[arg(long, value_enum)]
    pub personality: Option<PersonalityArg>,
    /// The GID index for RoCE (verbs provider only; perftest's -x). Default on an Ethernet
    /// (RoCE) port: its RoCE v2 GID with an IPv4 address, else one with a global IPv6
    /// address, else its first RoCE v2 GID, else 0; none on InfiniBand (LID routing). See
    /// `show_gids` or `ibv_devinfo -v`.
    #[arg(long = "gid-index", short = 'x')]
    pub gid_index: Option<u8>,
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
}

/// Work that runs on any device.
pub trait OnDevice {
    type Output;
    fn run<D: Device>(self, dev: &D, info: &DeviceInfo) -> Result<Self::Output>;
}

/// Opens the device the options name and runs `task` on it.
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

pub fn with_device<T: OnDevice>(args: &ProviderArgs, task: T) -> Result<T::Output> {
    match args.provider {
        ProviderKind::Soft => {
            let personality = args
                .personality
                .map_or(Personality::Mlx5, Personality::from);
            let mut config = SoftConfig::with_personality(personality);
            if let Some(name) = &args.device {
                config.name = name.clone();
            }
            if args.gid_index.is_some() {
                return Err(anyhow::Error::new(BadOption(
                    "--gid-index is for the verbs provider (the soft NIC has no GIDs)",
                )));
            }
            let dev = SoftDevice::open(config).context("cannot open the software device")?;
            let info = DeviceInfo {
                provider: ProviderKind::Soft,
                device: dev.name().to_string(),
                personality: Some(personality),
                gid_index: None,
                rxe: personality == Personality::Rxe,
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
                port: None,
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
            let info = DeviceInfo {
                provider: ProviderKind::Verbs,
                device: dev.name().to_string(),
                personality: None,
                gid_index: dev.gid_index(),
                rxe: dev.name().starts_with("rxe"),
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

/// Parses a byte count: `64`, `4K`, `4KiB`, `1M`, `64KiB` (K, M, G are binary, as in
/// perftest).
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let config = parse_size::Config::new().with_binary();
    let invalid = |e: &dyn std::fmt::Display| {
        format!("invalid size {text:?}: {e} (examples: 64, 4K, 1.5K, 64KiB, 1M)")
    };
    let trimmed = text.trim();
    let size = config.parse_size(trimmed).map_err(|e| invalid(&e))?;
    // A fraction must come to whole bytes (1.5K is 1536): the parser would round 1.3 to 1.
    let number_len = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(number_len);
    if number.contains('.') {
        let unit = if unit.trim().is_empty() {
            1
        } else {
            config
                .parse_size(format!("1{unit}"))
                .map_err(|e| invalid(&e))?
        };
        let exact = number.parse::<f64>().map_err(|e| invalid(&e))? * unit as f64;
        if exact.fract() != 0.0 {
            return Err(invalid(&format!("{exact} is not a whole number of bytes")));
        }
    }
    Ok(size)
}

/// The bytes work request `wr` (1-based) writes: recognisable and different for every
/// work request and offset.
pub fn pattern(wr: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern_byte(wr, i)).collect()
}

/// Byte `i` of [`pattern`]`(wr, ..)`.
pub fn pattern_byte(wr: u64, i: usize) -> u8 {
    (wr.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8 + 1
}

/// FNV-1a, 64 bits: the memory digest of traces (stable, no dependency).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
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
    fn patterns_differ_between_work_requests_and_have_no_zero() {
        assert_ne!(pattern(1, 64), pattern(2, 64));
        assert!(pattern(7, 4096).iter().all(|&b| b != 0));
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}

//! The units of the bench's figures: Gb/s, perftest's MB, and the short figures of the table
//! (nanoseconds, sizes, rates).

/// perftest's MB: 2^20 bytes.
pub(crate) const MIB: f64 = 1_048_576.0;

/// Gigabits (10^9 bits) per second of `bytes` moved in `seconds`.
pub(crate) fn gbit(bytes: f64, seconds: f64) -> f64 {
    bytes * 8.0 / seconds / 1e9
}

/// Nanoseconds as a short human figure: 850ns, 12.3us, 4.56ms; the unit is the one the
/// figure, rounded, is below 1000 of.
pub(crate) fn human_ns(ns: f64) -> String {
    if ns.round() < 1e3 {
        format!("{ns:.0}ns")
    } else if (ns / 1e2).round() < 1e4 {
        format!("{:.1}us", ns / 1e3)
    } else if (ns / 1e4).round() < 1e5 {
        format!("{:.2}ms", ns / 1e6)
    } else {
        format!("{:.2}s", ns / 1e9)
    }
}

pub(crate) fn human_size(size: u64) -> String {
    if size >= 1 << 30 && size.is_multiple_of(1 << 30) {
        format!("{}GiB", size >> 30)
    } else if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{}MiB", size >> 20)
    } else if size >= 1 << 10 && size.is_multiple_of(1 << 10) {
        format!("{}KiB", size >> 10)
    } else {
        format!("{size}B")
    }
}

/// Completions per 1000 WRITEs: one decimal, or three significant digits below 0.1 (an
/// interval of thousands completes a few hundredths of a completion per 1000).
pub(crate) fn per_1000(x: f64) -> String {
    fixed_or_significant(x, 1)
}

/// Two decimals, or three significant digits below 0.01 (large WRITEs: 16 MiB ones run at
/// about 0.0002 M WR/s).
pub(crate) fn rate(x: f64) -> String {
    fixed_or_significant(x, 2)
}

/// `x` with `decimals` decimals, or three significant digits below `10^-decimals`.
fn fixed_or_significant(x: f64, decimals: usize) -> String {
    let three = |x: f64| (2.0 - x.log10().floor()) as usize;
    let least = 10f64.powi(decimals as i32).recip();
    if x >= least || x <= 0.0 || !x.is_finite() {
        return format!("{x:.decimals$}");
    }
    // Rounded to three significant digits, the figure may reach the next power of ten
    // (0.0009996 is 0.00100): the digits are counted from the rounded figure.
    let digits = three(x);
    let rounded: f64 = format!("{x:.digits$}").parse().unwrap_or(x);
    if rounded >= least {
        format!("{x:.decimals$}")
    } else {
        let digits = three(rounded);
        format!("{x:.digits$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_printed_in_human_units() {
        assert_eq!(human_ns(850.0), "850ns");
        assert_eq!(human_ns(12_345.0), "12.3us");
        assert_eq!(human_ns(4_560_000.0), "4.56ms");
        // The unit is chosen after rounding: never "1000ns" or "1000.0us".
        assert_eq!(human_ns(999.4), "999ns");
        assert_eq!(human_ns(999.7), "1.0us");
        assert_eq!(human_ns(999_940.0), "999.9us");
        assert_eq!(human_ns(999_960.0), "1.00ms");
        assert_eq!(human_ns(999_996_000.0), "1.00s");
        assert_eq!(human_size(64), "64B");
        assert_eq!(human_size(4096), "4KiB");
        assert_eq!(human_size(1 << 20), "1MiB");
        assert_eq!(human_size(1000), "1000B");
        // M WR/s: two decimals, three significant digits for large WRITEs' small rates.
        assert_eq!(rate(54.104), "54.10");
        assert_eq!(rate(0.2), "0.20");
        assert_eq!(rate(0.01), "0.01");
        assert_eq!(rate(0.00234), "0.00234");
        assert_eq!(rate(0.000_2), "0.000200");
        assert_eq!(rate(0.0), "0.00");
        // Rounding up to the next power of ten keeps three significant digits.
        assert_eq!(rate(0.009996), "0.01");
        assert_eq!(rate(0.0009996), "0.00100");
        assert_eq!(human_size(3 << 19), "1536KiB");
        assert_eq!(human_size(3 << 20), "3MiB");
        assert_eq!(gbit(125e6, 1.0), 1.0);
        assert_eq!(gbit(1e9, 2.0), 4.0);
    }
}

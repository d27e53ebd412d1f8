//! `selsig bench --svg`: throughput and confirmation lag against the signal interval, one
//! line per message size; the adaptive policy's points are drawn as triangles at its
//! largest run.

use anyhow::{Result, anyhow};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::bench::report::{Point, Report};
use crate::bench::units::human_size;

const WIDTH: u32 = 1000;
/// Height of one panel.
const PANEL: u32 = 370;
/// One color per message size (colorblind-safe: Okabe and Ito's, without their yellow,
/// which is faint on white).
const COLORS: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(230, 159, 0),
    RGBColor(0, 0, 0),
];

/// The point marker of a series; once the colors run out, the next sizes take the next
/// shape, so that no two sizes of a chart look alike (up to `COLORS.len()` times the
/// shapes; triangles are the adaptive policy's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Circle,
    Square,
    Cross,
}

const SHAPES: [Shape; 3] = [Shape::Circle, Shape::Square, Shape::Cross];

/// The color and the marker of the `i`-th size.
fn style(i: usize) -> (RGBAColor, Shape) {
    (
        COLORS[i % COLORS.len()].to_rgba(),
        SHAPES[(i / COLORS.len()) % SHAPES.len()],
    )
}

type LogChart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, LogCoord<f64>>>;

/// The markers of a series' points.
fn draw_markers<'a, DB: DrawingBackend + 'a>(
    chart: &mut LogChart<'a, DB>,
    points: &[(f64, f64)],
    shape: Shape,
    c: RGBAColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let points = points.iter().copied();
    match shape {
        Shape::Circle => chart.draw_series(points.map(|at| Circle::new(at, 3, c.filled())))?,
        Shape::Square => chart.draw_series(
            points.map(|at| EmptyElement::at(at) + Rectangle::new([(-3, -3), (3, 3)], c.filled())),
        )?,
        Shape::Cross => chart.draw_series(points.map(|at| Cross::new(at, 4, c.stroke_width(2))))?,
    };
    Ok(())
}

/// A legend's marker at pixel `at` of its area.
fn draw_legend_marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    at: (i32, i32),
    shape: Shape,
    c: RGBAColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    match shape {
        Shape::Circle => area.draw(&Circle::new(at, 3, c.filled())),
        Shape::Square => area.draw(&Rectangle::new(
            [(at.0 - 3, at.1 - 3), (at.0 + 3, at.1 + 3)],
            c.filled(),
        )),
        Shape::Cross => area.draw(&Cross::new(at, 4, c.stroke_width(2))),
    }
}

/// The x position of a point: log2 of its interval (of the adaptive policy's largest run).
fn x_of(p: &Point) -> Option<f64> {
    let n = match (p.interval, p.policy.strip_prefix("adaptive:")) {
        (Some(n), _) => n,
        (None, Some(rest)) => rest.split(',').next()?.parse().ok()?,
        _ => return None,
    };
    Some(f64::from(n).log2())
}

/// Renders the chart as an SVG document.
pub fn render(report: &Report) -> Result<String> {
    let mut svg = String::new();
    draw(report, &mut svg).map_err(|e| anyhow!("cannot draw the chart: {e}"))?;
    Ok(svg)
}

type DrawResult<'a> = Result<(), Box<dyn std::error::Error + 'a>>;

const AXIS: &str = "signal interval (WRITEs per completion)";

/// The width of the column right of each panel's plot that holds its legend, which so
/// never hides a line.
const LEGEND_WIDTH: u32 = 110;

/// Splits a panel into its plot and its legend column.
fn split_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> (
    DrawingArea<DB, plotters::coord::Shift>,
    DrawingArea<DB, plotters::coord::Shift>,
) {
    let (width, _) = area.dim_in_pixel();
    area.split_horizontally(width.saturating_sub(LEGEND_WIDTH))
}

/// The legend of a panel: a line of each size's color and its name, top-aligned with the
/// plot (below its caption).
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    sizes: &[u64],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (top, step) = (46, 20);
    // As many lines as the panel holds; the last says how many more there are.
    let (_, height) = area.dim_in_pixel();
    let room = ((height as i32 - top - 12) / step).max(1) as usize;
    let (shown, more) = match sizes.len() > room {
        true => (room - 1, sizes.len() - (room - 1)),
        false => (sizes.len(), 0),
    };
    let lines = (shown + usize::from(more > 0)) as i32;
    area.draw(&Rectangle::new(
        [
            (4, top - 12),
            (LEGEND_WIDTH as i32 - 8, top - 12 + step * lines + 8),
        ],
        BLACK.stroke_width(1),
    ))?;
    let font = ("sans-serif", 13).into_font();
    for (i, &size) in sizes.iter().take(shown).enumerate() {
        let y = top + step * i as i32;
        let (c, shape) = style(i);
        area.draw(&PathElement::new(vec![(12, y), (32, y)], c.stroke_width(2)))?;
        draw_legend_marker(area, (22, y), shape, c)?;
        area.draw(&Text::new(size_label(size), (40, y - 7), font.clone()))?;
    }
    if more > 0 {
        let y = top + step * shown as i32;
        area.draw(&Text::new(format!("+{more} more"), (12, y - 7), font))?;
    }
    Ok(())
}

/// The x range: log2 of the largest interval, with a margin.
/// From the smallest interval drawn to the largest (log2), at least one doubling wide.
fn x_range(report: &Report) -> std::ops::Range<f64> {
    let xs = || report.points.iter().filter_map(x_of);
    let x_max = xs().fold(0.0, f64::max).max(1.0);
    let x_min = xs().fold(f64::INFINITY, f64::min).min(x_max - 1.0).max(0.0);
    x_min - 0.2..x_max + 0.2
}

/// The x labels: one per power of two in the range.
fn x_labels(xr: &std::ops::Range<f64>) -> usize {
    (xr.end - xr.start).round() as usize + 1
}

fn interval_label(v: &f64) -> String {
    format!("{}", 2f64.powf(*v).round())
}

/// A log range that holds every value (with a margin), from and to powers of ten (a log
/// axis is labeled at powers of ten: values within one decade would get no label), or a
/// default for none.
fn log_bounds(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo.is_finite() {
        let decade = |v: f64, round: fn(f64) -> f64| 10f64.powf(round(v.log10()));
        // A hair beyond the powers of ten, so that rounding cannot leave them out of the
        // range and their labels off the axis (0.1 computed as just above 0.1).
        decade(lo / 1.5, f64::floor) / 1.001..decade(hi * 1.5, f64::ceil) * 1.001
    } else {
        0.001..1.0
    }
}

fn draw<'a>(report: &Report, svg: &'a mut String) -> DrawResult<'a> {
    // A panel for each figure some point has (perftest mode measures no lag; only the soft
    // provider reports the NIC's times).
    let lag = report.points.iter().any(|p| p.lag.is_some());
    let nic = report.points.iter().any(|p| p.nic_to_app.is_some());
    let panels = 1 + u32::from(lag) + u32::from(nic);
    let root = SVGBackend::with_string(svg, (WIDTH, PANEL * panels + 40)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "selsig bench: RDMA WRITE on {}, {} provider ({}), send queue depth {}",
        report.settings.queue_pairs(),
        report.provider,
        report.device,
        report.settings.tx_depth
    );
    let root = root.titled(&title, ("sans-serif", 18))?;
    let areas = root.split_evenly((panels as usize, 1));
    let sizes = sizes(report);
    let xr = x_range(report);

    // Throughput, log scale: the same ratio is the same slope for every size.
    let (plot, legend) = split_panel(&areas[0]);
    let mut chart = ChartBuilder::on(&plot)
        .caption("Throughput (log scale)", ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(
            xr.clone(),
            log_bounds(report.points.iter().map(|p| p.gbit_per_sec)).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc(AXIS)
        .y_desc("Gb/s")
        .x_labels(x_labels(&xr))
        .x_label_formatter(&interval_label)
        .y_labels(6)
        .light_line_style(RGBColor(238, 238, 238))
        .draw()?;
    for (i, &size) in sizes.iter().enumerate() {
        let (c, shape) = style(i);
        let line = series(report, size, |p| p.gbit_per_sec);
        chart.draw_series(LineSeries::new(line.clone(), c.stroke_width(2)))?;
        draw_markers(&mut chart, &line, shape, c)?;
        chart.draw_series(
            adaptive(report, size, |p| p.gbit_per_sec)
                .map(|(x, y)| TriangleMarker::new((x, y), 6, c.filled())),
        )?;
    }

    draw_legend(&legend, &sizes)?;

    let us = |ns: u64| ns as f64 / 1e3;
    let mut next = areas[1..].iter();
    if let (true, Some(area)) = (lag, next.next()) {
        percentile_panel(
            area,
            report,
            "Confirmation lag: post to the application learning of it",
            |p| p.lag.as_ref().map(|q| (us(q.p50_ns), us(q.p99_ns))),
        )?;
    }
    if let (true, Some(area)) = (nic, next.next()) {
        percentile_panel(
            area,
            report,
            "Learned later: the NIC finishing a WRITE to the application learning of it",
            |p| p.nic_to_app.as_ref().map(|q| (us(q.p50_ns), us(q.p99_ns))),
        )?;
    }
    root.present()?;
    Ok(())
}

/// A panel of p50 (solid, filled marks) and p99 (dashed, hollow marks) microseconds, log
/// scale; adaptive points as a filled triangle at p50 and an outlined one at p99.
fn percentile_panel<'a, DB: DrawingBackend + 'a>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    report: &Report,
    caption: &str,
    of: impl Fn(&Point) -> Option<(f64, f64)>,
) -> DrawResult<'a> {
    let xr = x_range(report);
    let bounds = log_bounds(
        report
            .points
            .iter()
            .filter_map(&of)
            .flat_map(|(a, b)| [a, b]),
    );
    let (plot, legend) = split_panel(area);
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            format!("{caption} (p50 solid, p99 dashed and hollow, adaptive: triangles)"),
            ("sans-serif", 15),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(xr.clone(), bounds.log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(AXIS)
        .y_desc("microseconds (log scale)")
        .x_labels(x_labels(&xr))
        .x_label_formatter(&interval_label)
        .y_labels(6)
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, &size) in sizes(report).iter().enumerate() {
        let (c, shape) = style(i);
        let p50 = series_opt(report, size, |p| of(p).map(|v| v.0));
        let p99 = series_opt(report, size, |p| of(p).map(|v| v.1));
        chart
            .draw_series(LineSeries::new(p50.clone(), c.stroke_width(2)))
            .map_err(|e| e.to_string())?;
        draw_markers(&mut chart, &p50, shape, c).map_err(|e| e.to_string())?;
        // Each p99 also gets a hollow mark: a line through a single point (one interval
        // of a size) draws nothing.
        chart
            .draw_series(p99.iter().map(|&at| Circle::new(at, 3, c.stroke_width(1))))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(DashedLineSeries::new(p99, 6, 4, c.stroke_width(1)))
            .map_err(|e| e.to_string())?;
        let adaptive: Vec<(f64, (f64, f64))> = report
            .points
            .iter()
            .filter(|p| p.size == size && p.interval.is_none())
            .filter_map(|p| Some((x_of(p)?, of(p)?)))
            .collect();
        chart
            .draw_series(
                adaptive
                    .iter()
                    .map(|&(x, (p50, _))| TriangleMarker::new((x, p50), 6, c.filled())),
            )
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(
                // A triangle's outline (plotters' triangle markers are always filled).
                adaptive.iter().map(|&(x, (_, p99))| {
                    EmptyElement::at((x, p99))
                        + PathElement::new(
                            vec![(0, -6), (5, 3), (-5, 3), (0, -6)],
                            c.stroke_width(1),
                        )
                }),
            )
            .map_err(|e| e.to_string())?;
    }
    draw_legend(&legend, &sizes(report)).map_err(|e| e.to_string())?;
    Ok(())
}

fn sizes(report: &Report) -> Vec<u64> {
    let mut sizes: Vec<u64> = Vec::new();
    for p in &report.points {
        if !sizes.contains(&p.size) {
            sizes.push(p.size);
        }
    }
    sizes
}

/// A size as the table writes it.
fn size_label(size: u64) -> String {
    human_size(size)
}

/// The `every:N` points of one size.
fn series(report: &Report, size: u64, y: impl Fn(&Point) -> f64) -> Vec<(f64, f64)> {
    series_opt(report, size, |p| Some(y(p)))
}

/// The `every:N` points of one size that have a `y`, by interval (`-e` may name them in
/// any order).
fn series_opt(report: &Report, size: u64, y: impl Fn(&Point) -> Option<f64>) -> Vec<(f64, f64)> {
    let mut line: Vec<(f64, f64)> = report
        .points
        .iter()
        .filter(|p| p.size == size && p.interval.is_some())
        .filter_map(|p| Some((x_of(p)?, y(p)?)))
        .collect();
    line.sort_by(|a, b| a.0.total_cmp(&b.0));
    line
}

/// The adaptive points of one size.
fn adaptive<'r>(
    report: &'r Report,
    size: u64,
    y: impl Fn(&Point) -> f64 + 'r,
) -> impl Iterator<Item = (f64, f64)> + 'r {
    report
        .points
        .iter()
        .filter(move |p| p.size == size && p.interval.is_none())
        .filter_map(move |p| Some((x_of(p)?, y(p))))
}

#[cfg(test)]
mod tests {
    use super::{log_bounds, render};
    use crate::bench::report::Percentiles;
    use crate::bench::report::tests::{percentiles, report_of};

    #[test]
    fn log_bounds_run_from_a_power_of_ten_below_to_one_above_with_a_margin() {
        let nan = f64::NAN;
        let inf = f64::INFINITY;
        // The values, then the powers of ten the range runs between (each a hair outside,
        // x1.001, so that its label is drawn). A value is given half a decade (x1.5) of
        // room first, so that it is not drawn on the edge; what a log axis cannot show is
        // left out.
        let cases: [(&[f64], f64, f64); 6] = [
            (&[0.35, 2.0, 378.0], 0.1, 1000.0),
            (&[1.0], 0.1, 10.0),
            (&[0.7, 6.6], 0.1, 10.0),
            (&[0.6, 6.7], 0.1, 100.0),
            (&[1.6, 2.0], 1.0, 10.0),
            (&[0.0, -5.0, nan, inf, 20.0], 10.0, 100.0),
        ];
        let close = |a: f64, b: f64| (a - b).abs() <= b * 1e-9;
        for (values, lo, hi) in cases {
            let r = log_bounds(values.iter().copied());
            let ok = close(r.start, lo / 1.001) && close(r.end, hi * 1.001);
            assert!(ok, "{values:?}: {r:?}, not {lo}..{hi}");
            assert!(r.contains(&lo) && r.contains(&hi), "{values:?}: {r:?}");
        }
        // With nothing to show, a default range.
        assert_eq!(log_bounds([0.0, nan].into_iter()), 0.001..1.0);
        assert_eq!(log_bounds(std::iter::empty()), 0.001..1.0);
    }

    #[test]
    fn every_log_axis_has_two_labels_or_more() {
        // Throughput within one decade, below 1 Gb/s too (a loaded machine's 64 B points):
        // the powers of ten at the ends of the axis were left out by rounding.
        for (lo, hi) in [
            (0.2, 0.5),
            (0.12, 0.9),
            (2.0, 9.0),
            (0.012, 0.05),
            (20.0, 30.0),
        ] {
            let mut report = report_of(&[1.0, 1.0]);
            report.points[0].gbit_per_sec = lo;
            report.points[1].gbit_per_sec = hi;
            report.points[1].size = 64;
            let svg = render(&report).unwrap();
            let texts = svg_texts(&svg);
            let from = texts
                .iter()
                .position(|t| t.starts_with("Throughput"))
                .unwrap();
            let y: Vec<f64> = texts[from..]
                .iter()
                .skip_while(|t| !t.starts_with("signal interval"))
                .skip(1)
                .map_while(|t| t.parse::<f64>().ok())
                .collect();
            // The y labels, then the x labels 1 and 2 (intervals of the two points).
            let (y, x) = y.split_at(y.len() - 2);
            assert_eq!(x, [1.0, 2.0], "{lo}..{hi}: {texts:?}");
            // Powers of ten, from below the lowest value to above the highest.
            assert!(y.len() >= 2, "{lo}..{hi}: {y:?}");
            assert!(y[0] <= lo && y[y.len() - 1] >= hi, "{lo}..{hi}: {y:?}");
            assert!(
                y.windows(2).all(|w| (w[1] / w[0] - 10.0).abs() < 1e-9),
                "{y:?}"
            );
        }
    }

    #[test]
    fn the_chart_draws_each_figure_against_the_interval_it_names() {
        // One size, every 1, 4 and 16, and adaptive at 4: throughput 1, 2 and 4 Gb/s (3
        // adaptive), lag p50 100, 200 and 400 µs with p99 eight times as long.
        let mut report = report_of(&[1.0; 4]);
        for (i, p) in report.points.iter_mut().enumerate() {
            let interval = [1u32, 4, 16, 4][i];
            p.size = 64;
            p.interval = (i < 3).then_some(interval);
            p.policy = match i {
                3 => "adaptive:4,50us".to_string(),
                _ => format!("every:{interval}"),
            };
            p.gbit_per_sec = [1.0, 2.0, 4.0, 3.0][i];
            let p50 = [100_000, 200_000, 400_000, 150_000][i];
            p.lag = Some(Percentiles {
                count: 1000,
                p50_ns: p50,
                p99_ns: 8 * p50,
                max_ns: 8 * p50,
                mean_ns: p50 as f64,
            });
        }
        let svg = render(&report).unwrap();
        let texts = svg_texts(&svg);
        let at = |title: &str| texts.iter().position(|t| t.starts_with(title)).unwrap();
        let (throughput, lag) = (at("Throughput"), at("Confirmation lag"));
        let numbers =
            |panel: &[&str]| -> Vec<f64> { panel.iter().filter_map(|t| t.parse().ok()).collect() };
        // Each panel's axes: its unit, the intervals 1 to 16 (not their logarithms, and
        // the largest not cut off), below y labels that span the figures.
        for (panel, unit, lo, hi) in [
            (&texts[throughput..lag], "Gb/s", 1.0, 4.0),
            (&texts[lag..], "microseconds (log scale)", 100.0, 3200.0),
        ] {
            assert!(panel.contains(&unit), "{unit}: {panel:?}");
            let numbers = numbers(panel);
            let (y, x) = numbers.split_at(numbers.len() - 5);
            assert_eq!(x, [1.0, 2.0, 4.0, 8.0, 16.0], "{unit}: {panel:?}");
            let (min, max) = (y[0], y[y.len() - 1]);
            assert!(min <= lo && max >= hi && max < 100.0 * hi, "{unit}: {y:?}");
        }
        // The lines join the every:N points only (the adaptive one is a triangle), left
        // to right; p99 (dashed) above p50 (solid).
        let points = |style: &str| -> Vec<Vec<(i64, i64)>> {
            svg.split("<polyline")
                .skip(1)
                // The element itself, not the ones drawn after it.
                .map(|e| &e[..e.find("/>").unwrap()])
                .filter(|e| e.contains(style))
                .map(svg_points)
                .collect()
        };
        let lines: Vec<_> = points(r##"stroke="#0072B2" stroke-width="2""##)
            .into_iter()
            .filter(|l| l.len() > 2)
            .collect();
        assert_eq!(lines.len(), 2, "throughput and lag p50: {lines:?}");
        for line in &lines {
            assert_eq!(line.len(), 3, "{line:?}");
            assert!(line.windows(2).all(|w| w[0].0 < w[1].0), "{line:?}");
        }
        let p50_top = lines[1].iter().map(|p| p.1).min().unwrap();
        let dashes = points(r##"stroke="#0072B2" stroke-width="1""##);
        assert!(!dashes.is_empty());
        assert!(
            dashes.iter().flatten().all(|p| p.1 < p50_top),
            "p99 {dashes:?} not above p50 {:?}",
            lines[1]
        );
        assert_eq!(
            svg.matches("<polygon").count(),
            2,
            "an adaptive triangle a panel"
        );
    }

    /// The interval axis runs from the smallest interval drawn to the largest, a label per
    /// power of two: a sweep of long intervals does not leave most of the plot empty.
    #[test]
    fn the_interval_axis_starts_at_the_smallest_interval() {
        for (intervals, labels) in [
            (&[64u32, 128][..], &["64", "128"][..]),
            (&[16, 32, 64, 128], &["16", "32", "64", "128"]),
            (&[1, 4], &["1", "2", "4"]),
            (&[64], &["32", "64"]),
        ] {
            let mut report = report_of(&vec![1.0; intervals.len()]);
            for (p, &n) in report.points.iter_mut().zip(intervals) {
                p.size = 64;
                p.interval = Some(n);
                p.policy = format!("every:{n}");
            }
            let svg = render(&report).unwrap();
            let texts = svg_texts(&svg);
            // The throughput panel's x labels: its whole numbers (its y labels have a
            // decimal), up to the next panel's title.
            let x: Vec<&str> = texts
                .iter()
                .skip_while(|t| !t.starts_with("Throughput"))
                .take_while(|t| !t.starts_with("Confirmation lag"))
                .copied()
                .filter(|t| t.parse::<u32>().is_ok())
                .collect();
            assert_eq!(x, labels, "{intervals:?}: {texts:?}");
        }
    }

    /// A size swept at one interval has no line to dash: its p99 still gets a mark, above
    /// its p50, in every panel of percentiles; so does an adaptive point's.
    #[test]
    fn a_lone_point_and_an_adaptive_one_show_their_p99() {
        let mut report = report_of(&[1.0, 1.0]);
        for (i, p) in report.points.iter_mut().enumerate() {
            p.size = 64;
            p.interval = (i == 0).then_some(1);
            p.policy = ["every:1", "adaptive:4,50us"][i].to_string();
            p.lag = Some(percentiles(100_000, 800_000, 900_000));
        }
        let svg = render(&report).unwrap();
        let lag = &svg[svg.find("Confirmation lag").unwrap()..];
        // (cx, cy) of the panel's filled or hollow circles (the legend's is filled).
        let circles = |filled: bool| -> Vec<(f64, f64)> {
            lag.split("<circle")
                .skip(1)
                .map(|e| &e[..e.find("/>").unwrap()])
                .filter(|e| e.contains(r#"fill="none""#) != filled)
                .map(|e| {
                    let attr = |name: &str| -> f64 {
                        let v = e.split(&format!("{name}=\"")).nth(1).unwrap();
                        v[..v.find('"').unwrap()].parse().unwrap()
                    };
                    (attr("cx"), attr("cy"))
                })
                .collect()
        };
        let (filled, p99) = (circles(true), circles(false));
        assert_eq!(p99.len(), 1, "{lag}");
        let p50 = filled
            .iter()
            .find(|c| c.0 == p99[0].0)
            .expect("p50 below p99");
        assert!(p99[0].1 < p50.1, "p99 at {:?} above p50 at {p50:?}", p99[0]);
        // The adaptive point: a filled triangle at p50, an outline (a closed path of
        // four points, the first one again) above it at p99.
        let filled: Vec<Vec<(i64, i64)>> = lag.split("<polygon").skip(1).map(svg_points).collect();
        assert_eq!(filled.len(), 1, "adaptive p50: {lag}");
        let outline: Vec<Vec<(i64, i64)>> = lag
            .split("<polyline")
            .skip(1)
            .map(svg_points)
            .filter(|p| p.len() == 4 && p[0] == p[3])
            .collect();
        assert_eq!(outline.len(), 1, "adaptive p99: {lag}");
        let top = |p: &[(i64, i64)]| p.iter().map(|q| q.1).min().unwrap();
        assert!(
            top(&outline[0]) < top(&filled[0]),
            "{outline:?} above {filled:?}"
        );
    }

    /// The pixels of the `points` attribute of an SVG element (from its text on).
    fn svg_points(element: &str) -> Vec<(i64, i64)> {
        let list = element.split("points=\"").nth(1).unwrap();
        list[..list.find('"').unwrap()]
            .split_whitespace()
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect()
    }

    /// The texts of an SVG document, in order.
    fn svg_texts(svg: &str) -> Vec<&str> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>').map(|(_, rest)| rest))
            .filter_map(|t| t.split_once("</text>").map(|(text, _)| text.trim()))
            .collect()
    }
}

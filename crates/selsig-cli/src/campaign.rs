//! `selsig campaign`: generated scenarios run on a device, each checked for exactly one
//! outcome per work request in posting order, regions that hold what the outcomes say,
//! no hang, and, with `--against`, the same trace as the software NIC's. A failure is kept
//! with its traces and a shrunk reproduction.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use selsig::Device;
use selsig_scenario::{
    Event, GenOptions, Generated, RunOptions, RunResult, Scenario, check_run, compare_traces,
    generate, parse,
};
use selsig_soft::{Personality, SoftConfig, SoftDevice};
use serde::Serialize;

use crate::common::{self, DeviceInfo, OnDevice, PersonalityArg, ProviderArgs, ProviderKind};

/// Run generated scenarios on a device and check every one (see docs/campaign.md).
#[derive(Debug, Clone, clap::Args)]
pub struct CampaignArgs {
    /// The first scenario's seed; scenario k has seed SEED + k (`--seed SEED+k -n 1`
    /// makes it again).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How many scenarios.
    #[arg(short = 'n', long = "count", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub count: u64,
    /// The most queue pairs a scenario has (1 to 4).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=4))]
    pub qps: u32,
    /// The most steps a scenario has before those that retire everything (2 to 64).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub steps: u32,
    /// How many scenarios in a hundred contain a racy construct (0 to 100).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub racy: u32,
    /// Also run each race-free scenario on the software NIC with this personality and
    /// require the same trace: `soft:mlx5` or `soft:rxe`.
    #[arg(long, value_name = "soft:PERSONALITY", value_parser = parse_against)]
    pub against: Option<PersonalityArg>,
    /// Keep each failing scenario here: the file, its traces, a shrunk reproduction and
    /// what failed.
    #[arg(long, value_name = "DIR")]
    pub keep_failures: Option<PathBuf>,
    /// Write the summary as JSON to this file (`-`: stdout, instead of the table).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No progress bar (it shows only on a terminal anyway).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// How long a step may wait without a completion before the scenario fails (it
    /// bounds every scenario: no hang).
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
    #[command(flatten)]
    pub provider: ProviderArgs,
}

fn parse_against(text: &str) -> Result<PersonalityArg, String> {
    match text {
        "soft:mlx5" => Ok(PersonalityArg::Mlx5),
        "soft:rxe" => Ok(PersonalityArg::Rxe),
        _ => Err(format!(
            "{text:?}: the software NIC with a personality, soft:mlx5 or soft:rxe"
        )),
    }
}

/// A scenario that failed a check.
#[derive(Debug, Serialize)]
struct Failed {
    seed: u64,
    name: String,
    racy: bool,
    /// `invalid`, `setup`, `run`, `outcomes`, `memory` or `identity`.
    check: &'static str,
    detail: String,
    /// Where it was kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    kept: Option<String>,
}

/// What a campaign found.
#[derive(Debug, Default, Serialize)]
struct Summary {
    seed: u64,
    count: u64,
    provider: String,
    device: String,
    against: Option<String>,
    seconds: f64,
    race_free: u64,
    racy: u64,
    /// Work requests posted (markers aside), each checked for one outcome.
    work_requests: u64,
    /// Race-free scenarios whose regions were checked against the outcomes.
    memory_checked: u64,
    /// Race-free scenarios whose trace was compared with `--against`'s.
    traces_compared: u64,
    /// Steps flagged as racy, by race class.
    races: BTreeMap<&'static str, u64>,
    failures: Vec<Failed>,
}

/// Runs the campaign: whether every scenario passed, and what to print on stdout.
pub fn run(args: &CampaignArgs) -> Result<(bool, String)> {
    let start = Instant::now();
    let mut summary = Summary {
        seed: args.seed,
        count: args.count,
        provider: args.provider.provider.as_str().to_string(),
        against: args
            .against
            .map(|p| format!("soft:{}", Personality::from(p))),
        ..Summary::default()
    };
    if let Some(dir) = &args.keep_failures {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--keep-failures {}: cannot create it", dir.display()))?;
    }
    let bar = if std::io::stderr().is_terminal() && !args.quiet {
        ProgressBar::with_draw_target(Some(args.count), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} scenarios, {msg}")
            .context("the progress bar's template")?
            .progress_chars("=> "),
    );
    let mut next = 0;
    // The device is opened again after a scenario that made it fail (`device_fatal`).
    while next < args.count {
        next = common::with_device(
            &args.provider,
            Chunk {
                args,
                from: next,
                summary: &mut summary,
                bar: &bar,
            },
        )?;
    }
    bar.finish_and_clear();
    summary.seconds = start.elapsed().as_secs_f64();
    let text = report(args, &summary)?;
    Ok((summary.failures.is_empty(), text))
}

/// Scenarios from `from` on, on one device, until the campaign ends or a scenario made
/// the device fail.
struct Chunk<'a> {
    args: &'a CampaignArgs,
    from: u64,
    summary: &'a mut Summary,
    bar: &'a ProgressBar,
}

impl OnDevice for Chunk<'_> {
    /// Where the next chunk starts.
    type Output = u64;

    fn run<D: Device>(self, dev: &D, info: &DeviceInfo) -> Result<u64> {
        let args = self.args;
        let s = self.summary;
        s.device = match info.personality {
            Some(p) => format!("{} ({p})", info.device),
            None => info.device.clone(),
        };
        // Only the software NIC fails on purpose, and only the device under test's
        // failure is one a campaign can take.
        let fatal = info.faults.is_some() && args.against.is_none();
        let made = GenOptions::new()
            .qps(args.qps)
            .steps(args.steps)
            .racy_percent(args.racy)
            .device_fatal(fatal)
            .personality(info.personality)
            .post_api(args.provider.post_api);
        let mut options = RunOptions::new()
            .rxe(info.rxe)
            .gid_index(info.gid_index)
            .port(Some(info.port))
            .wait(Some(args.wait));
        if let Some(faults) = info.faults.clone() {
            options = options.inject_fatal(move || faults.inject_fatal());
        }
        let against = match args.against {
            Some(p) => {
                let mut config = SoftConfig::with_personality(p.into());
                config.post_api = args.provider.post_api.unwrap_or_default();
                Some(
                    SoftDevice::open(config)
                        .context("cannot open the software device for --against")?,
                )
            }
            None => None,
        };
        let against_options = RunOptions::new()
            .rxe(args.against == Some(PersonalityArg::Rxe))
            .wait(Some(args.wait));
        for k in self.from..args.count {
            let g = generate(args.seed.wrapping_add(k), &made);
            let mut one = One {
                g: &g,
                options: &options,
                s,
            };
            let fatal_run = g.text.contains("device_fatal = true");
            match &against {
                Some(a) => one.check(dev, Some((a, &against_options)), args)?,
                None => one.check::<D, SoftDevice>(dev, None, args)?,
            }
            self.bar.inc(1);
            self.bar.set_message(format!("{} failed", s.failures.len()));
            if fatal_run && info.provider == ProviderKind::Soft {
                return Ok(k + 1);
            }
        }
        Ok(args.count)
    }
}

/// One generated scenario, run and checked.
struct One<'a> {
    g: &'a Generated,
    options: &'a RunOptions,
    s: &'a mut Summary,
}

impl One<'_> {
    fn check<D: Device, A: Device>(
        &mut self,
        dev: &D,
        against: Option<(&A, &RunOptions)>,
        args: &CampaignArgs,
    ) -> Result<()> {
        let g = self.g;
        let racy = !g.racy.is_empty();
        if racy {
            self.s.racy += 1;
        } else {
            self.s.race_free += 1;
        }
        let sc = match parse(&g.name, &g.name, &g.text) {
            Ok(sc) => sc,
            Err(e) => return self.failed("invalid", e.to_string(), None, None, args, dev),
        };
        let races = sc.races();
        for r in &races {
            *self.s.races.entry(r.class).or_default() += 1;
        }
        let result = match selsig_scenario::run(&sc, dev, self.options) {
            Ok(r) => r,
            Err(e) => return self.failed("setup", format!("{e:#}"), None, None, args, dev),
        };
        self.s.work_requests += result
            .trace
            .iter()
            .filter(|e| matches!(e, Event::Post { marker: false, .. }))
            .count() as u64;
        if let Some(e) = &result.error {
            let detail = format!("{e:#}");
            return self.failed("run", detail, Some(&result), None, args, dev);
        }
        if let Some(v) = check_run(&sc, &result).into_iter().next() {
            return self.failed(v.check, v.detail, Some(&result), None, args, dev);
        }
        if racy || !races.is_empty() {
            return Ok(());
        }
        self.s.memory_checked += 1;
        if let Some((a, options)) = against {
            self.s.traces_compared += 1;
            let theirs = selsig_scenario::run(&sc, a, options)
                .map_err(|e| anyhow::anyhow!("on --against: {e:#}"));
            let theirs = match theirs {
                Ok(t) => t,
                Err(e) => {
                    return self.failed(
                        "identity",
                        format!("{e:#}"),
                        Some(&result),
                        None,
                        args,
                        dev,
                    );
                }
            };
            if let Some(diff) = compare_traces(&result.trace, &theirs.trace) {
                return self.failed("identity", diff, Some(&result), Some(&theirs), args, dev);
            }
        }
        Ok(())
    }

    /// Records a failure, and keeps it (with a shrunk reproduction) where asked.
    fn failed<D: Device>(
        &mut self,
        check: &'static str,
        detail: String,
        result: Option<&RunResult>,
        theirs: Option<&RunResult>,
        args: &CampaignArgs,
        dev: &D,
    ) -> Result<()> {
        let g = self.g;
        let kept = match &args.keep_failures {
            Some(dir) => {
                let min = shrink(g, check, dev, self.options);
                Some(keep(dir, g, check, &detail, result, theirs, &min, args)?)
            }
            None => None,
        };
        self.s.failures.push(Failed {
            seed: g.seed,
            name: g.name.clone(),
            racy: !g.racy.is_empty(),
            check,
            detail,
            kept,
        });
        Ok(())
    }
}

/// How a run of `sc` on `dev` fails, if it does: the check's name and the words of what
/// failed, numbers and names aside (a failure shrunk must stay the same failure, not
/// become another of the same check: a hang for want of a `confirm` the shrinker dropped).
fn failure_of<D: Device>(sc: &Scenario, dev: &D, options: &RunOptions) -> Option<String> {
    let (check, detail) = match selsig_scenario::run(sc, dev, options) {
        Err(e) => ("setup", e.to_string()),
        Ok(r) => match &r.error {
            Some(e) => ("run", format!("{e:#}")),
            None => {
                let v = check_run(sc, &r).into_iter().next()?;
                (v.check, v.detail)
            }
        },
    };
    Some(format!("{check}: {}", shape(&detail)))
}

/// A failure's words: its first line, without its step, each word with a digit in it (a
/// number, a name such as q0, a digest) as `#`.
fn shape(detail: &str) -> String {
    let line = detail.lines().next().unwrap_or_default();
    let line = line.split_once("): ").map_or(line, |(_, rest)| rest);
    line.split_whitespace()
        .map(|w| match w.chars().any(|c| c.is_ascii_digit()) {
            true => "#",
            false => w,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The scenario shrunk while it fails the same check on the device under test (a
/// difference from `--against` is not shrunk: the file comes back whole).
fn shrink<D: Device>(g: &Generated, check: &str, dev: &D, options: &RunOptions) -> String {
    // A device that failed on purpose stays failed: tries on it would all fail alike.
    if matches!(check, "identity" | "invalid") || g.text.contains("device_fatal = true") {
        return g.text.clone();
    }
    // A step the shrinker breaks may wait for a completion that never comes: such tries
    // give up sooner than the campaign's runs.
    let options = options
        .clone()
        .wait(Some(SHRINK_WAIT.min(options.wait.unwrap_or(SHRINK_WAIT))));
    let options = &options;
    let Some(first) = parse(&g.name, &g.name, &g.text)
        .ok()
        .and_then(|sc| failure_of(&sc, dev, options))
    else {
        // It passed this time.
        return g.text.clone();
    };
    selsig_scenario::shrink(&g.text, 100, |text| {
        parse(&g.name, &g.name, text)
            .ok()
            .and_then(|sc| failure_of(&sc, dev, options))
            .as_ref()
            == Some(&first)
    })
}

/// How long a step of a shrinker's try may wait without a completion.
const SHRINK_WAIT: Duration = Duration::from_secs(3);

/// Writes a failure's files under `dir`; gives the scenario file's path.
#[allow(clippy::too_many_arguments)]
fn keep(
    dir: &Path,
    g: &Generated,
    check: &str,
    detail: &str,
    result: Option<&RunResult>,
    theirs: Option<&RunResult>,
    min: &str,
    args: &CampaignArgs,
) -> Result<String> {
    let write = |file: String, text: &str| {
        let path = dir.join(file);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    };
    let file = format!("{}.toml", g.name);
    write(file.clone(), &g.text)?;
    if let Some(r) = result {
        write(format!("{}.trace.jsonl", g.name), &r.trace_text())?;
    }
    if let Some(r) = theirs {
        write(format!("{}.against.jsonl", g.name), &r.trace_text())?;
    }
    write(format!("{}.min.toml", g.name), min)?;
    let again = format!(
        "selsig campaign --seed {} -n 1 --qps {} --steps {} --racy {}{} --wait {} --provider {}{}{}{}",
        g.seed,
        args.qps,
        args.steps,
        args.racy,
        match args.provider.post_api {
            Some(selsig::PostApi::Extended) => " --post-api extended",
            _ => "",
        },
        humantime::format_duration(args.wait),
        args.provider.provider.as_str(),
        args.provider.personality.map_or(String::new(), |p| format!(
            " --personality {}",
            Personality::from(p)
        )),
        args.provider
            .device
            .as_ref()
            .map_or(String::new(), |d| format!(" -d {d}")),
        args.against.map_or(String::new(), |p| format!(
            " --against soft:{}",
            Personality::from(p)
        )),
    );
    write(
        format!("{}.txt", g.name),
        &format!(
            "{} failed the {check} check:\n{detail}\n\nAgain: {again}\nShrunk: {}.min.toml (selsig run {}.min.toml; the whole file where nothing could go: a difference from --against, or a device failed on purpose)\n",
            g.name, g.name, g.name
        ),
    )?;
    Ok(dir.join(file).display().to_string())
}

/// The summary for stdout: a table, or the JSON for `--json -`.
fn report(args: &CampaignArgs, s: &Summary) -> Result<String> {
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(s).context("the summary as JSON")? + "\n";
        if path == Path::new("-") {
            return Ok(json);
        }
        std::fs::write(path, json).with_context(|| format!("--json {}", path.display()))?;
    }
    let failed_racy = s.failures.iter().filter(|f| f.racy).count() as u64;
    let failed_free = s.failures.len() as u64 - failed_racy;
    let mut t = format!(
        "campaign: seeds {} to {} on {} {}{}, {:.1} s\n\n",
        s.seed,
        s.seed.wrapping_add(s.count - 1),
        s.provider,
        s.device,
        s.against
            .as_ref()
            .map_or(String::new(), |a| format!(", against {a}")),
        s.seconds
    );
    t.push_str("             scenarios   passed   failed\n");
    t.push_str(&format!(
        "race-free   {:>9} {:>8} {:>8}\nracy        {:>9} {:>8} {:>8}\n\n",
        s.race_free,
        s.race_free - failed_free,
        failed_free,
        s.racy,
        s.racy - failed_racy,
        failed_racy
    ));
    t.push_str(&format!(
        "{} work requests, each checked for exactly one outcome in posting order; regions checked against the outcomes in {} scenarios; traces compared in {}\n",
        s.work_requests, s.memory_checked, s.traces_compared
    ));
    if !s.races.is_empty() {
        let classes: Vec<String> = s.races.iter().map(|(c, n)| format!("{c} {n}")).collect();
        t.push_str(&format!("racy steps flagged: {}\n", classes.join(", ")));
    }
    for f in &s.failures {
        t.push_str(&format!(
            "FAILED {} (seed {}, {}): {}{}\n",
            f.name,
            f.seed,
            f.check,
            f.detail.lines().next().unwrap_or_default(),
            f.kept
                .as_ref()
                .map_or(String::new(), |k| format!(" [kept: {k}]"))
        ));
    }
    Ok(t)
}

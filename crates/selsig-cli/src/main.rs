//! `selsig`: RDMA selective signaling from the command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `eprintln!` that never panics: a message to standard error is lost, not fatal, when
/// stderr is a closed pipe (`selsig serve 2>&1 | head -1`) or a full device. (`eprintln!`
/// panics there, which would stop `selsig serve` and turn a bad option's exit code 2 into
/// a panic's 101.)
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod bench;
mod campaign;
mod common;
mod demo;
mod limits;
mod net;
mod remote;

/// selsig: selective signaling for RDMA send queues, done right.
///
/// On an RC queue pair only signaled work requests produce a completion when they
/// succeed, and a completion confirms its work request and every earlier one. selsig
/// decides what to signal, keeps the send queue from deadlocking and the CQ from
/// overrunning, and hands every buffer back, in order, with its exact outcome.
#[derive(Debug, Parser)]
#[command(name = "selsig", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the seed example (8 RDMA WRITEs, every 4th signaled) and show what the NIC did.
    Demo(demo::DemoArgs),
    /// Run a scenario file and print its canonical trace (JSON lines) on stdout.
    Run(RunArgs),
    /// Hold a target region and queue pair for `selsig demo --connect` and `selsig bench
    /// --connect` from another process or host (needs --provider verbs)
    Serve(remote::ServeArgs),
    /// Measure throughput, completions, CPU time and confirmation lag against the signal
    /// interval and message size; with --cq-mod, what perftest's ib_write_bw measures.
    Bench(bench::BenchArgs),
    /// Generate scenarios from a seed, run them on a device and check each: one outcome
    /// per work request, memory as the outcomes say, no hang, the same trace as the
    /// software NIC's (--against).
    Campaign(campaign::CampaignArgs),
}

/// Run a scenario file (see docs/scenarios.md) and print its canonical trace.
#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The scenario file (TOML); `-` reads it from standard input.
    #[arg(value_name = "SCENARIO")]
    file: PathBuf,
    /// Write the trace to this file instead of stdout (`-`: stdout, even with --quiet).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Print only the summary line (and the failures).
    #[arg(long, short = 'q')]
    quiet: bool,
    /// The queue pair's peer and the region its WRITEs go to are those of `selsig serve`
    /// on HOST or HOST:PORT (verbs provider): a scenario of one queue pair that WRITEs to
    /// one region (see docs/scenarios.md).
    #[arg(long, value_name = "HOST", value_parser = common::parse_host)]
    connect: Option<String>,
    /// How --connect connects the queue pairs: tcp or rdma (rdma_cm), as for demo.
    #[arg(long, value_enum, default_value_t = remote::Cm::Tcp, requires = "connect", value_name = "HOW")]
    cm: remote::Cm,
    #[command(flatten)]
    provider: common::ProviderArgs,
}

/// How a run ended: exit code 1 for a failed check, 2 for bad input.
pub enum Failure {
    /// The input (options, scenario file) is invalid.
    Input(anyhow::Error),
    /// The run went wrong or a verification failed.
    Run(anyhow::Error),
}

impl Failure {
    /// A failed run, or bad input where the error says the options caused it.
    fn of_run(e: anyhow::Error) -> Failure {
        if e.downcast_ref::<common::BadOption>().is_some() {
            Failure::Input(e)
        } else {
            Failure::Run(e)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => run_demo(&args),
        Command::Run(args) => run_scenario(&args),
        Command::Bench(args) => run_bench(&args),
        Command::Campaign(args) => run_campaign(&args),
        Command::Serve(args) => remote::validate(&args)
            .map_err(Failure::Input)
            .and_then(|()| common::with_device(&args.provider, &args).map_err(Failure::of_run))
            .map(|ok| {
                if ok {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }),
    };
    match result {
        Ok(code) => code,
        Err(Failure::Input(e)) => {
            say!("error: {e:#}");
            ExitCode::from(2)
        }
        Err(Failure::Run(e)) => {
            say!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run_demo(args: &demo::DemoArgs) -> Result<ExitCode, Failure> {
    demo::validate(args).map_err(Failure::Input)?;
    let report = demo::demo(args).map_err(Failure::of_run)?;
    if args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| Failure::Run(e.into()))?;
        print_out(&(json + "\n"))?;
    } else {
        print_out(&demo::render(&report))?;
    }
    Ok(if report.remote_verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Writes `text` to standard output. A write that fails is an error (a full disk, say),
/// except a closed pipe: the reader stopped reading (`| head`), and the command goes on.
fn print_out(text: &str) -> Result<(), Failure> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::Run(
            anyhow::Error::new(e).context("cannot write to standard output"),
        )),
    }
}

/// A file named on the command line for a command's output: opened before the command
/// runs, so that a long run does not end in "cannot write"; its old contents are replaced
/// only by [`write_outputs`], once every output of the command is written, and a file it
/// created is removed again if the command fails, or a signal stops it.
struct OutputFile {
    /// The option that named it.
    option: &'static str,
    path: PathBuf,
    file: std::fs::File,
    /// The file this command created (the path, or the file a link to nothing named),
    /// removed unless written.
    created: Option<Created>,
    written: bool,
}

/// Files the command created and has neither written nor removed yet: outputs, and the
/// temporary files their texts are staged in.
static CREATED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// [`CREATED`], whose every change is one `Vec` operation (a poisoned lock is taken as it is).
fn created() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    CREATED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A path in [`CREATED`], taken out of it when dropped (the file itself is left alone).
struct Created(Option<PathBuf>);

impl Created {
    fn new(path: PathBuf) -> Self {
        created().push(path.clone());
        Created(Some(path))
    }

    fn path(&self) -> Option<&Path> {
        self.0.as_deref()
    }

    /// Takes the path out of `list` (the locked [`CREATED`]) now.
    fn forget(&mut self, list: &mut Vec<PathBuf>) {
        if let Some(path) = self.0.take()
            && let Some(i) = list.iter().position(|p| *p == path)
        {
            list.swap_remove(i);
        }
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if self.0.is_some() {
            self.forget(&mut created());
        }
    }
}

/// Whether `signal` is ignored (as `nohup` leaves SIGHUP, and a shell a background job's
/// SIGINT).
fn ignored(signal: std::ffi::c_int) -> bool {
    // SAFETY: with no new action, `sigaction` only writes the current one into `old`, a
    // zeroed `sigaction` (a valid value of that plain C struct).
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

/// From the first call on, a signal that stops the command (SIGINT, SIGTERM, SIGHUP, each
/// unless ignored) first removes the files in [`CREATED`], then stops it as it would have.
fn remove_created_on_signals() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    static WATCHING: std::sync::Once = std::sync::Once::new();
    WATCHING.call_once(|| {
        let watched: Vec<_> = [SIGINT, SIGTERM, SIGHUP]
            .into_iter()
            .filter(|&s| !ignored(s))
            .collect();
        // Without the watch (no thread, say), a signal stops the command as before.
        let Ok(mut signals) = signal_hook::iterator::Signals::new(watched) else {
            return;
        };
        let watch = move || {
            if let Some(signal) = signals.forever().next() {
                for path in created().iter() {
                    let _ = std::fs::remove_file(path);
                }
                // The signal's own action: the command ends, killed by it.
                let _ = signal_hook::low_level::emulate_default_handler(signal);
                std::process::exit(128 + signal);
            }
        };
        let _ = std::thread::Builder::new()
            .name("signals".into())
            .spawn(watch);
    });
}

impl OutputFile {
    /// Opens `path` (the value of `option`) for writing, leaving what it holds.
    fn open(option: &'static str, path: &Path) -> Result<Self, Failure> {
        use std::fs::OpenOptions;
        let cannot = |e: std::io::Error| {
            Failure::Input(anyhow::Error::new(e).context(format!(
                "{option} {}: cannot write the file",
                path.display()
            )))
        };
        // Files created are removed by a signal that stops the command from now on.
        remove_created_on_signals();
        // A new file is ours to remove; anything already there (a file, a FIFO, a link)
        // is opened as it is. (No lock is held while opening: a FIFO's open waits for a
        // reader, and a signal must still end the command meanwhile.)
        let (file, new) = match OpenOptions::new().write(true).create_new(true).open(path) {
            Ok(file) => (file, Some(path.to_path_buf())),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // A link to nothing: opening it creates the file it names, which is ours.
                let dangling = std::fs::metadata(path)
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
                // Not truncated: the old contents stay until the command succeeds.
                let file = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(path)
                    .map_err(cannot)?;
                let new = match dangling {
                    true => std::fs::canonicalize(path).ok(),
                    false => None,
                };
                (file, new)
            }
            Err(e) => return Err(cannot(e)),
        };
        Ok(OutputFile {
            option,
            path: path.to_path_buf(),
            file,
            created: new.map(Created::new),
            written: false,
        })
    }

    /// Whether this is the file `other` is (the same file named two ways, or through a
    /// link), where one text would replace the other: a device (a terminal, `/dev/null`)
    /// takes both.
    fn is(&self, other: &OutputFile) -> bool {
        use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
        match (self.file.metadata(), other.file.metadata()) {
            (Ok(a), Ok(b)) => {
                !a.file_type().is_char_device() && (a.dev(), a.ino()) == (b.dev(), b.ino())
            }
            _ => false,
        }
    }

    /// Whether this is the file or pipe standard output writes to (`/dev/stdout`, or the
    /// file standard output was redirected to). A terminal or `/dev/null` does not count:
    /// two texts written there in turn are what the user sees (or drops).
    fn is_stdout(&self) -> bool {
        let meta = self.file.metadata();
        meta.is_ok_and(|a| Self::std_stream(&a) == Some(StdStream::Out))
    }

    /// The standard stream (output first) that writes to the file or pipe of metadata `a`
    /// (an output file's), if one does.
    fn std_stream(a: &std::fs::Metadata) -> Option<StdStream> {
        use std::os::fd::{AsFd as _, BorrowedFd};
        use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
        let is = |fd: BorrowedFd<'_>| {
            let b = fd.try_clone_to_owned().map(std::fs::File::from);
            b.and_then(|f| f.metadata()).is_ok_and(|b| {
                !b.file_type().is_char_device() && (a.dev(), a.ino()) == (b.dev(), b.ino())
            })
        };
        if is(std::io::stdout().as_fd()) {
            Some(StdStream::Out)
        } else if is(std::io::stderr().as_fd()) {
            Some(StdStream::Err)
        } else {
            None
        }
    }

    fn cannot_write(&self, e: std::io::Error) -> Failure {
        Failure::Run(anyhow::Error::new(e).context(format!(
            "{} {}: cannot write the file",
            self.option,
            self.path.display()
        )))
    }

    /// Writes `text`: to a FIFO or device directly; for a regular file, into a temporary
    /// file beside it (links resolved, in [`CREATED`] until renamed), to replace the file;
    /// where the folder cannot take one, not yet: the file is written over in place, by
    /// [`write_outputs`], once everything else is staged.
    fn stage(&self, text: &str) -> Result<Staged, Failure> {
        use std::io::Write as _;
        let meta = self.file.metadata().map_err(|e| self.cannot_write(e))?;
        if !meta.is_file() {
            let mut file = &self.file;
            file.write_all(text.as_bytes())
                .and_then(|()| file.flush())
                .map_err(|e| self.cannot_write(e))?;
            return Ok(Staged::Written);
        }
        // The file standard output or error was sent to (`--trace /dev/stdout >> log`):
        // written where that stream writes (appended, with `>>`), never replaced, which
        // would lose what the file held and leave the stream writing to a file with no
        // name.
        if let Some(stream) = Self::std_stream(&meta) {
            let written = match stream {
                StdStream::Out => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(text.as_bytes()).and_then(|()| out.flush())
                }
                StdStream::Err => {
                    let mut err = std::io::stderr().lock();
                    err.write_all(text.as_bytes()).and_then(|()| err.flush())
                }
            };
            written.map_err(|e| self.cannot_write(e))?;
            return Ok(Staged::Written);
        }
        let target = std::fs::canonicalize(&self.path).map_err(|e| self.cannot_write(e))?;
        let dir = target.parent().unwrap_or(Path::new("."));
        let Ok(mut tmp) = tempfile::Builder::new()
            .prefix(".selsig-")
            .suffix(".tmp")
            .tempfile_in(dir)
        else {
            // A folder this user cannot add to: the file itself is written over, last.
            return Ok(Staged::InPlace);
        };
        let staged = Created::new(tmp.path().to_path_buf());
        tmp.write_all(text.as_bytes())
            .and_then(|()| tmp.flush())
            .and_then(|()| tmp.as_file().set_permissions(meta.permissions()))
            .map_err(|e| self.cannot_write(e))?;
        Ok(Staged::Temporary(tmp, target, staged))
    }

    /// What the file holds, to put back with [`overwrite`](Self::overwrite) if the command
    /// fails after writing over it: up to 64 MiB, and only what this user may read (`None`
    /// otherwise: such a file is left as the failure leaves it).
    fn old_contents(&self) -> Option<Vec<u8>> {
        const KEPT: u64 = 64 << 20;
        std::fs::metadata(&self.path)
            .ok()
            .filter(|m| m.len() <= KEPT)
            .and_then(|_| std::fs::read(&self.path).ok())
    }

    /// Writes `bytes` over the file itself, from its start, and cuts it there.
    fn overwrite(&self, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::{Seek as _, Write as _};
        let mut file = &self.file;
        file.set_len(0)?;
        file.seek(std::io::SeekFrom::Start(0))?;
        file.write_all(bytes)?;
        file.flush()
    }
}

/// How [`OutputFile::stage`] left an output.
enum Staged {
    /// Written where it goes: a FIFO, a device, a standard stream.
    Written,
    /// In a temporary file, to replace the file (its resolved path) once every output is
    /// staged.
    Temporary(tempfile::NamedTempFile, PathBuf, Created),
    /// To be written over in place (its folder cannot take a temporary file).
    InPlace,
}

/// A standard stream an output file turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StdStream {
    Out,
    Err,
}

/// Writes each text to its file, all or nothing as far as regular files go: each is
/// written to a temporary file beside it, and those replace the files only once every
/// text was written (FIFOs and devices take their text as it comes; a file whose folder
/// cannot take a temporary file is written over in place, after the others are staged).
fn write_outputs(mut outputs: Vec<(OutputFile, String)>) -> Result<(), Failure> {
    let mut staged = Vec::new();
    let mut in_place = Vec::new();
    for (file, text) in &outputs {
        match file.stage(text)? {
            Staged::Written => {}
            Staged::Temporary(tmp, target, created) => staged.push((file, (tmp, target, created))),
            Staged::InPlace => in_place.push((file, text)),
        }
    }
    // Files whose folder takes no temporary file are written over last: a failure to stage
    // another output leaves them as they were, and a failure from here on puts back what
    // each one written over held.
    let mut written_over = Vec::new();
    let put_back = |written_over: &[(&OutputFile, Option<Vec<u8>>)]| {
        for (file, old) in written_over {
            if let Some(old) = old {
                // Best effort: the failure is the error to report.
                let _ = file.overwrite(old);
            }
        }
    };
    for (file, text) in in_place {
        written_over.push((file, file.old_contents()));
        if let Err(e) = file.overwrite(text.as_bytes()) {
            put_back(&written_over);
            return Err(file.cannot_write(e));
        }
    }
    // The renames, under the lock of the created files: a signal waits for them, and then
    // finds neither the temporary files (renamed) nor the outputs (complete) to remove.
    // Nothing here takes the lock again (the `Created`s are forgotten first).
    let mut list = created();
    for (_, (_, _, temporary)) in &mut staged {
        temporary.forget(&mut list);
    }
    let mut result = Ok(());
    for (file, (tmp, target, _)) in staged {
        if let Err(e) = tmp.persist(&target) {
            // (Files already renamed stay replaced: a rename in a folder that took the
            // temporary file does not fail short of the disk going away.)
            put_back(&written_over);
            result = Err(file.cannot_write(e.error));
            break;
        }
    }
    if result.is_ok() {
        for (file, _) in &mut outputs {
            if let Some(output) = &mut file.created {
                output.forget(&mut list);
            }
            file.written = true;
        }
    }
    drop(list);
    result
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.written {
            return;
        }
        if let Some(path) = self.created.as_ref().and_then(Created::path) {
            // Best effort: the command already failed, and that error is the one to report.
            let _ = std::fs::remove_file(path);
        }
        // (Then `created` leaves the list.)
    }
}

fn run_bench(args: &bench::BenchArgs) -> Result<ExitCode, Failure> {
    // A sweep to run, or a past run's report (read before any output file is opened).
    let source = match &args.from_json {
        Some(path) => Err(bench::load_report(path).map_err(Failure::Input)?),
        None => Ok(bench::plan(args).map_err(Failure::Input)?),
    };
    let json_to_stdout = args.json.as_deref() == Some(Path::new("-"));
    let svg_to_stdout = args.svg.as_deref() == Some(Path::new("-"));
    if json_to_stdout && svg_to_stdout {
        return Err(Failure::Input(anyhow::anyhow!(
            "--json - and --svg -: both to standard output, where the JSON and the SVG would \
             be mixed"
        )));
    }
    let json_file = match &args.json {
        Some(path) if !json_to_stdout => Some(OutputFile::open("--json", path)?),
        _ => None,
    };
    let svg_file = match &args.svg {
        Some(path) if !svg_to_stdout => Some(OutputFile::open("--svg", path)?),
        _ => None,
    };
    // Standard output takes the table, or the other of the two: a file that is standard
    // output would mix with it (or, replaced, lose it).
    for (option, file) in [("--json", &json_file), ("--svg", &svg_file)] {
        if let Some(file) = file.as_ref().filter(|f| f.is_stdout()) {
            let taken_by = match (json_to_stdout, svg_to_stdout) {
                (true, _) => "--json -",
                (_, true) => "--svg -",
                _ => "the table",
            };
            return Err(Failure::Input(anyhow::anyhow!(
                "{option} {}: standard output, which {taken_by} takes too (use {option} - \
                 and send the other elsewhere)",
                file.path.display()
            )));
        }
    }
    // One file named two ways (the same path, relative and absolute, or through a link).
    if let (Some(json), Some(svg)) = (&json_file, &svg_file)
        && json.is(svg)
    {
        return Err(Failure::Input(anyhow::anyhow!(
            "--json {} and --svg {}: the same file, which would keep only one of them",
            json.path.display(),
            svg.path.display()
        )));
    }
    let report = match source {
        Ok(plan) => bench::bench(args, &plan).map_err(Failure::of_run)?,
        Err(report) => report,
    };
    // Both are rendered before anything is written: a failure leaves every file as it was.
    let json = match &args.json {
        Some(_) => {
            Some(serde_json::to_string_pretty(&report).map_err(|e| Failure::Run(e.into()))? + "\n")
        }
        None => None,
    };
    let svg = match &args.svg {
        Some(_) => Some(bench::chart::render(&report).map_err(Failure::Run)?),
        None => None,
    };
    let mut files = Vec::new();
    let mut to_stdout = None;
    for (text, file) in [(json, json_file), (svg, svg_file)] {
        match (text, file) {
            (Some(text), Some(file)) => files.push((file, text)),
            (Some(text), None) => to_stdout = Some(text),
            _ => {}
        }
    }
    // Standard output first: if it cannot be written, the files are left as they were.
    match to_stdout {
        Some(text) => {
            print_out(&text)?;
            // The table, which would carry it, is not printed.
            if let Some(warnings) = bench::warnings(&report) {
                for warning in warnings.lines() {
                    say!("selsig bench: {warning}");
                }
            }
        }
        None => {
            print_out(&bench::render(&report))?;
            if report.settings.perftest_mode {
                let gbits = args.report_gbits;
                print_out(&format!("\n{}", bench::render_perftest(&report, gbits)))?;
            }
        }
    }
    write_outputs(files)?;
    Ok(ExitCode::SUCCESS)
}

/// Whether two paths name one file: the same path, one existing file (links resolved), or
/// one regular file under two names (hard links).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
        || matches!(
            (std::fs::metadata(a), std::fs::metadata(b)),
            (Ok(x), Ok(y)) if x.is_file() && (x.dev(), x.ino()) == (y.dev(), y.ino())
        )
}

/// A scenario to run on the device the options open (`selsig_scenario::run`, with what
/// the device is), and the server that is its remote side, if any (`run_remote`).
struct RunOn<'a>(&'a selsig_scenario::Scenario, Option<(&'a str, remote::Cm)>);

impl common::OnDevice for RunOn<'_> {
    /// The result, and the server's device and address with a remote side.
    type Output = (selsig_scenario::RunResult, Option<String>);

    fn run<D: selsig::Device>(
        self,
        dev: &D,
        info: &common::DeviceInfo,
    ) -> anyhow::Result<Self::Output> {
        let mut options = selsig_scenario::RunOptions::new()
            .rxe(info.rxe)
            .gid_index(info.gid_index)
            .port(Some(info.port));
        if let Some(faults) = info.faults.clone() {
            options = options.inject_fatal(move || faults.inject_fatal());
        }
        let Some((host, cm)) = self.1 else {
            return Ok((selsig_scenario::run(self.0, dev, &options)?, None));
        };
        let mut server = remote::ScenarioPeer::new(host, cm);
        let result = selsig_scenario::run_remote(self.0, dev, &options, &mut server)?;
        Ok((result, server.server().map(str::to_string)))
    }
}

fn run_campaign(args: &campaign::CampaignArgs) -> Result<ExitCode, Failure> {
    let (passed, text) = campaign::run(args).map_err(Failure::of_run)?;
    print_out(&text)?;
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Whether `scenario` can run with `selsig serve` at `host` as its remote side, and the
/// region the server holds: bad input if not.
fn remote_check<'a>(
    scenario: &'a selsig_scenario::Scenario,
    host: &str,
    provider: &common::ProviderArgs,
) -> Result<&'a str, Failure> {
    if provider.provider != common::ProviderKind::Verbs {
        return Err(Failure::Input(anyhow::anyhow!(
            "--connect {host}: needs --provider verbs (the soft NIC connects queue pairs of \
             one process only)"
        )));
    }
    scenario.remote_region().map_err(|why| {
        Failure::Input(anyhow::anyhow!(
            "--connect {host}: scenario {} cannot run with a remote side: {why}",
            scenario.name()
        ))
    })
}

fn run_scenario(args: &RunArgs) -> Result<ExitCode, Failure> {
    // `--trace -`: standard output, as without --trace, but even when quiet.
    let trace_to_stdout = args.trace.as_deref() == Some(Path::new("-"));
    let trace_path = args.trace.as_deref().filter(|_| !trace_to_stdout);
    let print_trace = trace_to_stdout || (trace_path.is_none() && !args.quiet);
    let from_stdin = args.file == Path::new("-");
    let shown = if from_stdin {
        "<stdin>".to_string()
    } else {
        args.file.display().to_string()
    };
    if let Some(trace) = trace_path {
        // A scenario read from standard input may come from a file too (`< x.toml`).
        let source = if from_stdin {
            Path::new("/dev/stdin")
        } else {
            &args.file
        };
        if same_file(source, trace) {
            return Err(Failure::Input(anyhow::anyhow!(
                "--trace {} names the scenario file {}: the trace would overwrite it",
                trace.display(),
                shown
            )));
        }
    }
    let scenario = selsig_scenario::load(&args.file).map_err(|e| Failure::Input(e.into()))?;
    let held = match &args.connect {
        Some(host) => Some(remote_check(&scenario, host, &args.provider)?),
        None => None,
    };
    let trace_file = match trace_path {
        Some(path) => Some(OutputFile::open("--trace", path)?),
        None => None,
    };
    if !args.quiet {
        say!("scenario {}: {}", scenario.name(), scenario.description());
    }
    for r in scenario.races() {
        say!(
            "warning: scenario {}: step {} races the NIC ({}): {}; its trace may differ between runs",
            scenario.name(),
            r.step,
            r.class,
            r.why
        );
    }
    let mut provider = args.provider.clone();
    // The scenario's personality, unless the command line names one; the verbs provider
    // has the device's own (the scenario's is ignored there, as documented).
    if provider.personality.is_none() && provider.provider == common::ProviderKind::Soft {
        provider.personality = scenario.personality().map(|p| match p {
            selsig_scenario::Personality::Mlx5 => common::PersonalityArg::Mlx5,
            selsig_scenario::Personality::Rxe => common::PersonalityArg::Rxe,
        });
    }
    // The scenario's post API, unless the command line names one.
    if provider.post_api.is_none() {
        provider.post_api = scenario.post_api();
    }
    let connect = args.connect.as_deref().map(|host| (host, args.cm));
    let (result, server) = common::with_device(&provider, RunOn(&scenario, connect))
        .map_err(|e| Failure::of_run(e.context(format!("scenario {shown}"))))?;
    if let (Some(server), Some(held), false) = (server, held, args.quiet) {
        say!(
            "scenario {}: the peer and region {held:?} are selsig serve's, {server}",
            scenario.name(),
        );
    }
    let text = result.trace_text();
    if let Some(e) = result.error {
        // The trace up to the failed step goes where the trace goes, unless that is a
        // file (replaced only by a complete run).
        if print_trace {
            // The step's error is the one to report.
            let _ = print_out(&text);
        }
        let e = anyhow::Error::new(e).context(format!("scenario {shown}"));
        return Err(Failure::of_run(e));
    }
    match trace_file {
        Some(file) => write_outputs(vec![(file, text)])?,
        None if print_trace => print_out(&text)?,
        None => {}
    }
    if let Some(why) = &result.differs {
        say!(
            "note: scenario {}: the rxe expectations apply: {why}",
            scenario.name()
        );
    }
    if result.failures.is_empty() {
        let what = if result.checked.is_empty() {
            "no expectations".to_string()
        } else {
            format!("expectations met ({})", result.checked.join(", "))
        };
        say!("scenario {}: {what}", scenario.name());
        Ok(ExitCode::SUCCESS)
    } else {
        for f in &result.failures {
            say!("error: scenario {}: {f}", scenario.name());
        }
        Ok(ExitCode::from(1))
    }
}

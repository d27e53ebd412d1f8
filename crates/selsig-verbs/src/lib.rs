//! selsig's libibverbs provider: real RDMA devices (mlx5 and every other RNIC rdma-core
//! supports) and the kernel's Soft-RoCE (rxe), through rdma-core's `libibverbs.so.1`,
//! loaded at run time. A program using it builds and runs everywhere; where rdma-core is
//! missing, [`VerbsDevice::open`] says what to install.
//!
//! Each verbs object is a handle holding its parent (a QP holds its PD and CQs, everything
//! holds the device context), so they are destroyed in the right order whatever order the
//! program drops them in. A failed destroy is reported on stderr; `Drop` never panics.
//!
//! Registered memory is allocated by the provider (whole pages, zeroed) and accessed only
//! through [`MemoryRegion::read`] and [`MemoryRegion::write`], which copy through raw
//! pointers: the NIC may write it at any time.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod sys;

use std::alloc::Layout;
use std::ffi::{CStr, c_int, c_void};
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use selsig::{
    Access, AsyncEvent, CompletionQueue, ConnectOptions, CqError, Device, Endpoint, Local,
    MemoryRegion, Opcode, PostFailure, PostWrError, ProviderError, QpCaps, QpInit, QpState,
    QueuePair, RecvWr, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use sys::Verbs;

/// Work requests of one post kept on the stack (more spill to the heap).
const POST_INLINE: usize = 16;

/// The first work request that is refused before the provider sees it, and why: inline
/// data longer than the QP's `max_inline_data` (mlx5 answers `ENOMEM`, which reads as a
/// full queue; rxe `EINVAL`; and data of 4 GiB or more would be cut short by the 32-bit
/// `ibv_sge` length), or an inline RDMA READ (`IBV_SEND_INLINE` is for SEND and RDMA
/// WRITE only, `ibv_post_send(3)`).
fn refused_up_front(wrs: &[SendWr<'_>], max_inline: u32) -> Option<(usize, PostFailure)> {
    wrs.iter().enumerate().find_map(|(i, w)| match w.local {
        Local::Inline(_) if w.opcode == Opcode::RdmaRead => {
            Some((i, PostFailure::Invalid("an RDMA READ cannot be inline")))
        }
        Local::Inline(d) if too_long_for_an_sge(d.len()) => {
            Some((i, PostFailure::Invalid("inline data of 4 GiB or more")))
        }
        Local::Inline(d) if d.len() > max_inline as usize => Some((
            i,
            PostFailure::InlineTooLong {
                len: d.len(),
                max: max_inline,
            },
        )),
        _ => None,
    })
}

/// Whether `len` bytes are more than an `ibv_sge` length (32 bits) can say.
fn too_long_for_an_sge(len: usize) -> bool {
    u32::try_from(len).is_err()
}

/// libibverbs, loaded once per process.
fn verbs() -> Result<&'static Verbs, ProviderError> {
    static VERBS: OnceLock<Result<Verbs, String>> = OnceLock::new();
    VERBS.get_or_init(Verbs::load).as_ref().map_err(|e| {
        ProviderError::Unavailable(format!(
            "cannot load {}: {e}. Install rdma-core's verbs library and providers \
             (Debian/Ubuntu: apt-get install libibverbs1 ibverbs-providers; \
             Fedora/RHEL: dnf install libibverbs)",
            sys::LIBRARY
        ))
    })
}

/// `ibv_get_device_list` failed: without the kernel's RDMA subsystem it says ENOSYS.
fn no_device_list() -> ProviderError {
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENOSYS) {
        ProviderError::NoDevice(
            "no RDMA device: this kernel has no RDMA support (ibv_get_device_list: function \
             not implemented); use --provider soft, or a machine with an RNIC or Soft-RoCE \
             (modprobe rdma_rxe)"
                .to_string(),
        )
    } else {
        ProviderError::Os {
            verb: "ibv_get_device_list",
            source: e,
        }
    }
}

fn os(verb: &'static str) -> ProviderError {
    ProviderError::Os {
        verb,
        source: io::Error::last_os_error(),
    }
}

/// The RDMA devices rdma-core sees, by name.
pub fn device_names() -> Result<Vec<String>, ProviderError> {
    let v = verbs()?;
    let mut n: c_int = 0;
    // SAFETY: `get_device_list` returns a NULL-terminated array of `n` devices (or NULL
    // with errno set), which we read and then free with `free_device_list`.
    unsafe {
        let list = (v.fns.get_device_list)(&mut n);
        if list.is_null() {
            return Err(no_device_list());
        }
        let mut names = Vec::new();
        for i in 0..n.max(0) as usize {
            let dev = *list.add(i);
            let name = (v.fns.get_device_name)(dev);
            if !name.is_null() {
                names.push(CStr::from_ptr(name).to_string_lossy().into_owned());
            }
        }
        (v.fns.free_device_list)(list);
        Ok(names)
    }
}

/// An open device context (`ibv_context`).
struct Context {
    v: &'static Verbs,
    ctx: NonNull<sys::ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread (the library locks internally);
// the pointer is owned by this struct until `Drop` closes it.
unsafe impl Send for Context {}
// SAFETY: as above: every verb called through a shared `Context` is thread-safe.
unsafe impl Sync for Context {}

/// Reports a failed destroy on stderr, if stderr takes it: a `Drop` goes on either way
/// (`eprintln!` would panic on a closed pipe).
fn report(what: fmt::Arguments<'_>) {
    report_to(&mut io::stderr(), what);
}

fn report_to(out: &mut impl io::Write, what: fmt::Arguments<'_>) {
    let _ = writeln!(out, "selsig-verbs: {what}");
}

/// The error of a destroy verb's return code: an errno, or a provider's negated one.
fn destroy_error(rc: i32) -> io::Error {
    io::Error::from_raw_os_error(rc.saturating_abs())
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context was opened by `ibv_open_device` and every object created
        // from it holds an `Arc<Context>`, so none is left when this runs.
        let rc = unsafe { (self.v.fns.close_device)(self.ctx.as_ptr()) };
        // Unlike the destroy calls, which return the errno, `ibv_close_device` is
        // documented to return -1 and set errno (ibv_open_device(3)); rdma-core's returns 0
        // whatever happens.
        if rc != 0 {
            report(format_args!(
                "ibv_close_device({}) failed: {}",
                self.name,
                io::Error::last_os_error()
            ));
        }
    }
}

/// Where to open: a device by name (default the first), a port, a GID index.
#[derive(Debug, Clone, Default)]
pub struct VerbsOptions {
    /// The device's name (`mlx5_0`, `rxe0`); `None` for the first.
    pub device: Option<String>,
    /// The port, 1-based (default 1).
    pub port: Option<u8>,
    /// The GID index (RoCE, or global routing on InfiniBand); by default, on Ethernet, the
    /// port's RoCE v2 GID with an IPv4 address, else one with a global IPv6 address, else
    /// its first RoCE v2 GID, else 0 (GID types read from sysfs); none (LID routing) on
    /// InfiniBand.
    pub gid_index: Option<u8>,
}

/// An RDMA device opened through libibverbs.
#[derive(Clone)]
pub struct VerbsDevice {
    ctx: Arc<Context>,
    /// The device's limits (`ibv_query_device`), when it reports them.
    limits: Option<Limits>,
    port: u8,
    gid_index: Option<u8>,
    gid: [u8; 16],
    lid: u16,
    active_mtu: u32,
    ethernet: bool,
    /// Destroying a QP removes its unpolled completions from its CQs (mlx4, mlx5).
    cleans_cq: bool,
    /// The kernel's Soft-RoCE (rxe).
    rxe: bool,
    /// A software device (rxe), whose kernel flushes a receive queue only when the QP moves
    /// to the error state or a packet comes: a receive posted once the QP is in the error
    /// state would never complete.
    software: bool,
}

/// The GID index to use on an Ethernet (RoCE) port when none is given, from the port's
/// GIDs and their types (`(index, type, gid)`, the type as sysfs names it, `None` where it
/// cannot be read): the first RoCE v2 GID holding an IPv4-mapped address (what `rdma_cm`
/// picks for an IPv4 address), else the first RoCE v2 GID that is not link-local (a global
/// IPv6 address), else the first RoCE v2 GID, else 0. mlx5 lists each address twice, as
/// RoCE v1 then v2, so its index 0 is a link-local RoCE v1 GID, which no IP router
/// forwards and rxe does not speak. Stops at the first IPv4-mapped one.
fn default_roce_gid<K: AsRef<str>>(
    gids: impl IntoIterator<Item = (u8, Option<K>, [u8; 16])>,
) -> u8 {
    let (mut routable, mut any) = (None, None);
    for (index, kind, gid) in gids {
        if kind.as_ref().map(|k| k.as_ref().trim()) != Some("RoCE v2") || gid == [0; 16] {
            continue;
        }
        if gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff] {
            return index;
        }
        if gid[..2] != [0xfe, 0x80] {
            routable.get_or_insert(index);
        }
        any.get_or_insert(index);
    }
    routable.or(any).unwrap_or(0)
}

/// Whether the kernel driver behind device `name` is one whose provider removes a
/// destroyed QP's completions from its CQs (`mlx5_destroy_qp` and `mlx4_destroy_qp` call
/// their `__mlx*_cq_clean`; rxe does not), from the driver's name in sysfs.
fn driver_cleans_cq(driver: Option<&str>) -> bool {
    matches!(driver, Some("mlx5_core" | "mlx4_core"))
}

/// Whether device `name` is the kernel's Soft-RoCE, whatever its name (`rdma link add NAME
/// type rxe ...`): rxe alone gives its devices a sysfs `parent` attribute, naming the
/// network device it runs over (`rxe_verbs.c`).
fn is_rxe(name: &str) -> bool {
    std::path::Path::new(&format!("/sys/class/infiniband/{name}/parent")).exists()
}

/// Whether a device is a software one: rxe, or a device with no kernel driver behind it (or
/// whose sysfs cannot be read; a wrong guess costs a query per receive post).
fn is_software(rxe: bool, driver: Option<&str>) -> bool {
    rxe || driver.is_none()
}

/// The kernel driver of device `name` (`/sys/class/infiniband/NAME/device/driver`; rxe has
/// none).
fn driver_of(name: &str) -> Option<String> {
    let link = std::fs::read_link(format!("/sys/class/infiniband/{name}/device/driver")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

impl fmt::Debug for VerbsDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsDevice")
            .field("name", &self.ctx.name)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .field("lid", &self.lid)
            .field("ethernet", &self.ethernet)
            .field("rxe", &self.rxe)
            .finish()
    }
}

/// The limits of `ibv_device_attr` selsig checks its requests against, so that a request
/// beyond them is refused with the limit named (providers say only `EINVAL`).
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_qp_wr: u32,
    max_sge: u32,
    max_cqe: u32,
    max_mr_size: u64,
    /// RDMA READs and atomics a QP serves at once as the responder.
    max_qp_rd_atom: u32,
    /// RDMA READs and atomics a QP keeps in flight as the requester.
    max_qp_init_rd_atom: u32,
}

impl Limits {
    fn of(attr: &sys::ibv_device_attr) -> Limits {
        let count = |n: c_int| u32::try_from(n).unwrap_or(0);
        Limits {
            max_qp_wr: count(attr.max_qp_wr),
            max_sge: count(attr.max_sge),
            max_cqe: count(attr.max_cqe),
            max_mr_size: attr.max_mr_size,
            max_qp_rd_atom: count(attr.max_qp_rd_atom),
            max_qp_init_rd_atom: count(attr.max_qp_init_rd_atom),
        }
    }
}

/// The RDMA READs and atomics a QP serves at once as the responder (`max_dest_rd_atomic`,
/// what its endpoint advertises): the device's `max_qp_rd_atom`, at most 255 (the
/// attribute's width), at least 1; 1 when the device does not say.
fn responder_depth(limits: Option<&Limits>) -> u8 {
    limits.map_or(1, |l| l.max_qp_rd_atom.clamp(1, 255) as u8)
}

/// The RDMA READs and atomics a QP keeps in flight (`max_rd_atomic`): the device's
/// `max_qp_init_rd_atom`, and no more than the peer serves (`remote`; 0, not known, reads
/// as 1), at least 1.
fn initiator_depth(limits: Option<&Limits>, remote: u8) -> u8 {
    let local = limits.map_or(1, |l| l.max_qp_init_rd_atom.clamp(1, 255) as u8);
    local.min(remote.max(1))
}

fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        5 => 4096,
        _ => 1024,
    }
}

/// The largest MTU enum of at most `bytes` (256 at least): a path MTU asked for is a
/// ceiling (1500 gives 1024, not 2048).
fn mtu_enum(bytes: u32) -> u32 {
    match bytes {
        0..=511 => 1,
        512..=1023 => 2,
        1024..=2047 => 3,
        2048..=4095 => 4,
        _ => 5,
    }
}

/// The variable with which libmlx5 drops the locks of its CQs and QPs.
const SINGLE_THREADED: &str = "MLX5_SINGLE_THREADED";

/// Refuses `MLX5_SINGLE_THREADED=1` (its value `value`): libmlx5 then takes no lock in
/// `ibv_poll_cq` and `ibv_post_send` (its check for a second thread is racy and aborts
/// when it sees one), while CQs and QPs here are `Sync`, for any thread to poll and post.
fn locks_kept(value: Option<&std::ffi::OsStr>) -> Result<(), ProviderError> {
    if value.is_some_and(|v| v == "1") {
        return Err(ProviderError::Unavailable(format!(
            "{SINGLE_THREADED}=1 makes libmlx5 drop the locks of CQs and QPs, which selsig \
             shares between threads: unset it"
        )));
    }
    Ok(())
}

impl VerbsDevice {
    /// Refuses an object of another device context: the kernel would look its handle up
    /// among this context's objects (another CQ, or EINVAL).
    fn own(&self, what: &'static str, ctx: &Arc<Context>) -> Result<(), ProviderError> {
        if Arc::ptr_eq(ctx, &self.ctx) {
            Ok(())
        } else {
            Err(ProviderError::Invalid {
                what,
                why: format!(
                    "it belongs to another opening of {}, not this one",
                    ctx.name
                ),
            })
        }
    }

    /// Opens a device and checks its port: it must be active, and the GID index must name
    /// a GID.
    pub fn open(options: &VerbsOptions) -> Result<VerbsDevice, ProviderError> {
        locks_kept(std::env::var_os(SINGLE_THREADED).as_deref())?;
        let v = verbs()?;
        let port = options.port.unwrap_or(1);
        let mut n: c_int = 0;
        // SAFETY: as in `device_names`; the chosen device is opened before the list is
        // freed, which the API allows.
        let (ctx, name) = unsafe {
            let list = (v.fns.get_device_list)(&mut n);
            if list.is_null() {
                return Err(no_device_list());
            }
            let mut found = None;
            let mut names = Vec::new();
            for i in 0..n.max(0) as usize {
                let dev = *list.add(i);
                let p = (v.fns.get_device_name)(dev);
                let name = if p.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                };
                if found.is_none() && options.device.as_ref().is_none_or(|want| *want == name) {
                    found = Some((dev, name.clone()));
                }
                names.push(name);
            }
            let result = match found {
                Some((dev, name)) => {
                    let ctx = (v.fns.open_device)(dev);
                    NonNull::new(ctx)
                        .map(|c| (c, name))
                        .ok_or_else(|| os("ibv_open_device"))
                }
                None if names.is_empty() => Err(ProviderError::NoDevice(
                    "no RDMA device found: load a driver, or create a Soft-RoCE device \
                     (modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0)"
                        .to_string(),
                )),
                // Devices exist, but none has the name asked for: bad input.
                None => Err(ProviderError::Invalid {
                    what: "device",
                    why: format!(
                        "no RDMA device named {:?}; found: {}",
                        options.device.as_deref().unwrap_or(""),
                        names.join(", ")
                    ),
                }),
            };
            (v.fns.free_device_list)(list);
            result?
        };
        let ctx = Arc::new(Context { v, ctx, name });
        // Asynchronous events are read without blocking.
        // SAFETY: `async_fd` is the context's event file descriptor, open while it is.
        unsafe {
            let fd = (*ctx.ctx.as_ptr()).async_fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                return Err(os("fcntl(async_fd, O_NONBLOCK)"));
            }
        }
        let mut dev_attr = sys::ibv_device_attr::default();
        // SAFETY: `dev_attr` is a valid `ibv_device_attr` to fill; the context is open.
        let rc = unsafe { (v.fns.query_device)(ctx.ctx.as_ptr(), &mut dev_attr) };
        let limits = (rc == 0).then(|| Limits::of(&dev_attr));
        let mut attr = sys::ibv_port_attr::default();
        // SAFETY: the exported `ibv_query_port` fills the (older, shorter) compat prefix of
        // `ibv_port_attr`; `attr` is zeroed and large enough.
        let rc = unsafe { (v.fns.query_port)(ctx.ctx.as_ptr(), port, &mut attr) };
        if rc != 0 {
            return Err(ProviderError::Invalid {
                what: "port",
                why: format!(
                    "{} has no port {port} ({})",
                    ctx.name,
                    io::Error::from_raw_os_error(if rc > 0 { rc } else { libc::EINVAL })
                ),
            });
        }
        if attr.state != sys::IBV_PORT_ACTIVE {
            let state = ["NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"]
                .get(attr.state as usize)
                .copied()
                .unwrap_or("unknown");
            // The port exists: its link is the host's state, not a bad parameter.
            return Err(ProviderError::Unavailable(format!(
                "port {port} of {} is {state}, not ACTIVE (is its link up?)",
                ctx.name
            )));
        }
        let ethernet = attr.link_layer == sys::IBV_LINK_LAYER_ETHERNET;
        let query_gid = |index: u8| {
            let mut gid = sys::ibv_gid::default();
            // SAFETY: `gid` is a valid `union ibv_gid` to fill; the context is open.
            let rc =
                unsafe { (v.fns.query_gid)(ctx.ctx.as_ptr(), port, c_int::from(index), &mut gid) };
            (rc == 0).then_some(gid.raw)
        };
        let gid_index = match options.gid_index {
            Some(i) => Some(i),
            None if ethernet => {
                let types = format!(
                    "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types",
                    ctx.name
                );
                let entries = attr.gid_tbl_len.clamp(0, 256) as usize;
                // Read lazily: the scan stops at the first IPv4-mapped RoCE v2 GID, and
                // an empty entry's type is not read.
                let gids = (0..entries).map(|i| i as u8).filter_map(|i| {
                    let gid = query_gid(i).filter(|g| *g != [0; 16])?;
                    let kind = std::fs::read_to_string(format!("{types}/{i}")).ok();
                    Some((i, kind, gid))
                });
                Some(default_roce_gid(gids))
            }
            None => None,
        };
        let mut gid = [0; 16];
        if let Some(index) = gid_index {
            if i32::from(index) >= attr.gid_tbl_len {
                return Err(ProviderError::Invalid {
                    what: "GID index",
                    why: format!(
                        "{index} is beyond the GID table of {} port {port} ({} entries)",
                        ctx.name, attr.gid_tbl_len
                    ),
                });
            }
            gid = query_gid(index).unwrap_or([0; 16]);
            if gid == [0; 16] {
                return Err(ProviderError::Invalid {
                    what: "GID index",
                    why: format!(
                        "GID {index} of {} port {port} is empty (see `ibv_devinfo -v`)",
                        ctx.name
                    ),
                });
            }
        }
        let driver = driver_of(&ctx.name);
        let cleans_cq = driver_cleans_cq(driver.as_deref());
        let rxe = is_rxe(&ctx.name);
        let software = is_software(rxe, driver.as_deref());
        Ok(VerbsDevice {
            ctx,
            limits,
            port,
            gid_index,
            gid,
            lid: attr.lid,
            active_mtu: mtu_bytes(attr.active_mtu),
            ethernet,
            cleans_cq,
            rxe,
            software,
        })
    }

    /// The port in use.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The GID index in use, if any.
    pub fn gid_index(&self) -> Option<u8> {
        self.gid_index
    }

    /// The port's active MTU in bytes.
    pub fn active_mtu(&self) -> u32 {
        self.active_mtu
    }

    /// Whether the device is the kernel's Soft-RoCE (rxe), known by the sysfs `parent`
    /// attribute rxe gives its devices, so under any name. rxe differs from hardware RNICs
    /// in ways an application can see: send slots freed on execution, no async event for a
    /// responder's access error, a retry count of 7 that retransmits forever, ...
    pub fn is_rxe(&self) -> bool {
        self.rxe
    }

    fn v(&self) -> &'static Verbs {
        self.ctx.v
    }
}

struct PdInner {
    pd: NonNull<sys::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: a protection domain is a handle the thread-safe verbs take; owned until `Drop`.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an `Arc<PdInner>`: none is left.
        let rc = unsafe { (self.ctx.v.fns.dealloc_pd)(self.pd.as_ptr()) };
        if rc != 0 {
            report(format_args!("ibv_dealloc_pd failed: {}", destroy_error(rc)));
        }
    }
}

/// A protection domain.
pub struct VerbsPd {
    inner: Arc<PdInner>,
}

/// A memory region: zeroed whole pages owned by the region, registered with the
/// NIC. Deregistered, then freed, when dropped.
pub struct VerbsMr {
    mr: NonNull<sys::ibv_mr>,
    mem: NonNull<u8>,
    layout: Layout,
    len: usize,
    access: Access,
    pd: Arc<PdInner>,
    /// Held by `read` and `write`: two threads copying to or from the same bytes at once
    /// would be a data race (the NIC's own accesses are DMA, outside the program). It
    /// serializes CPU copies into one region, disjoint ones too (buffers split from one
    /// region); posting and polling never take it.
    cpu: std::sync::Mutex<()>,
}

// SAFETY: the region's memory is only accessed through raw-pointer copies (`read`,
// `write`, one at a time under `cpu`), never through references, and the MR handle
// through thread-safe verbs.
unsafe impl Send for VerbsMr {}
// SAFETY: as above.
unsafe impl Sync for VerbsMr {}

impl fmt::Debug for VerbsMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsMr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("access", &self.access)
            .finish()
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        // SAFETY: the MR was registered on this PD (kept alive by `self.pd`); after the
        // deregistration the NIC no longer reaches the memory, which is then freed with
        // the layout it was allocated with.
        unsafe {
            let rc = (self.pd.ctx.v.fns.dereg_mr)(self.mr.as_ptr());
            if rc != 0 {
                // Freeing memory the NIC may still write would be unsound: leak it.
                report(format_args!(
                    "ibv_dereg_mr failed ({}); its {} bytes are leaked",
                    destroy_error(rc),
                    self.len
                ));
                return;
            }
            std::alloc::dealloc(self.mem.as_ptr(), self.layout);
        }
    }
}

impl VerbsMr {
    fn check(&self, offset: usize, len: usize) -> Result<(), ProviderError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(ProviderError::OutOfBounds {
                offset,
                len,
                region_len: self.len,
            }),
        }
    }
}

impl MemoryRegion for VerbsMr {
    fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        // SAFETY: the MR handle is valid until `Drop`; `lkey` is set at registration.
        unsafe { (*self.mr.as_ptr()).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: as for `lkey`.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
    fn access(&self) -> Access {
        self.access
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<(), ProviderError> {
        self.check(offset, data.len())?;
        let _one_at_a_time = self.cpu.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the range is inside the allocation (checked); no Rust reference to the
        // region's memory exists, the copy goes through raw pointers, and no other copy
        // runs meanwhile (`cpu`).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.mem.as_ptr().add(offset), data.len());
        }
        Ok(())
    }
    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), ProviderError> {
        self.check(offset, buf.len())?;
        let _one_at_a_time = self.cpu.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: as in `write`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.mem.as_ptr().add(offset),
                buf.as_mut_ptr(),
                buf.len(),
            );
        }
        Ok(())
    }
}

struct CqInner {
    cq: NonNull<sys::ibv_cq>,
    ctx: Arc<Context>,
    /// A failure of `poll_cq` after completions of the same call were handed over: the
    /// next poll reports it (0: none).
    failed: AtomicI32,
}

// SAFETY: `ibv_poll_cq` is thread-safe in rdma-core's providers (libmlx5
// unless `MLX5_SINGLE_THREADED=1`, which `VerbsDevice::open` refuses).
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an `Arc<CqInner>`: none is left.
        let rc = unsafe { (self.ctx.v.fns.destroy_cq)(self.cq.as_ptr()) };
        if rc != 0 {
            report(format_args!("ibv_destroy_cq failed: {}", destroy_error(rc)));
        }
    }
}

/// A completion queue.
pub struct VerbsCq {
    inner: Arc<CqInner>,
}

impl VerbsCq {
    /// The CQ's handle, as in [`AsyncEvent::CqErr`].
    pub fn handle(&self) -> u32 {
        // SAFETY: the CQ is valid until `Drop`.
        unsafe { (*self.inner.cq.as_ptr()).handle }
    }
}

/// The fields of a completion that `ibv_poll_cq(3)` defines for it; the others are 0
/// (`None`): providers leave them unwritten (mlx5 writes no `byte_len` for a WRITE, no
/// `imm_data` for a send with immediate, no `vendor_err` on success).
fn decode(wc: &sys::ibv_wc) -> WorkCompletion {
    let status = WcStatus::try_from(wc.status).unwrap_or(WcStatus::GeneralErr);
    let opcode = if status.is_success() {
        WcOpcode::try_from(wc.opcode).ok()
    } else {
        None
    };
    let recv = opcode.is_some_and(WcOpcode::is_recv);
    WorkCompletion {
        wr_id: wc.wr_id,
        status,
        opcode,
        byte_len: if opcode.is_some_and(WcOpcode::has_byte_len) {
            wc.byte_len
        } else {
            0
        },
        qp_num: wc.qp_num,
        imm_data: (recv && wc.wc_flags & sys::IBV_WC_WITH_IMM != 0)
            .then(|| u32::from_be(wc.imm_data)),
        vendor_err: if status.is_success() {
            0
        } else {
            wc.vendor_err
        },
    }
}

impl CompletionQueue for VerbsCq {
    fn capacity(&self) -> u32 {
        // SAFETY: the CQ is valid until `Drop`; `cqe` is the real size, set at creation.
        unsafe { (*self.inner.cq.as_ptr()).cqe.max(0) as u32 }
    }

    fn identity(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self.inner) as usize)
    }

    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, CqError> {
        let cq = self.inner.cq.as_ptr();
        // SAFETY: the CQ is valid until `Drop`; `context` and its ops table live as long.
        let Some(poll) = (unsafe { (*(*cq).context).ops.poll_cq }) else {
            return Err(CqError::Os(io::Error::other("the provider has no poll_cq")));
        };
        // SAFETY: `poll_cq` is the provider's function from the context's ops table (what
        // the static inline `ibv_poll_cq` calls), and `cq` is its CQ.
        unsafe { poll_chunks(poll, cq, &self.inner.failed, out) }
    }
}

/// Polls `out.len()` completions at most through `poll`, a chunk at a time through a
/// buffer on the stack: no lock, no allocation. A failure after completions of the same
/// call (earlier chunks, or entries of the failing provider call that carry a status) is
/// kept in `failed` for the next call, and those completions are handed over.
///
/// # Safety
///
/// `poll(cq, n, wc)` must behave as a provider's `poll_cq`: write at most `n` entries at
/// `wc` and return how many completions it polled, or a negative value.
unsafe fn poll_chunks(
    poll: sys::PollCq,
    cq: *mut sys::ibv_cq,
    failed: &AtomicI32,
    out: &mut [WorkCompletion],
) -> Result<usize, CqError> {
    let was = failed.swap(0, Ordering::Relaxed);
    if was != 0 {
        return Err(poll_failure(was));
    }
    let mut raw = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; POLL_CHUNK];
    let mut polled = 0;
    while polled < out.len() {
        let want = (out.len() - polled).min(POLL_CHUNK);
        // Providers write only the fields a completion defines (mlx5: not `byte_len` for a
        // WRITE, not `vendor_err` on success): the others must read as 0, not as whatever
        // the stack or an earlier chunk left there. The status, which every completion
        // has, starts as no status at all: a failed call's completions are those that
        // have one.
        raw[..want].fill(MaybeUninit::new(sys::ibv_wc {
            wr_id: NO_WR_ID,
            status: NO_STATUS,
            ..sys::ibv_wc::default()
        }));
        // SAFETY: `poll` writes at most `want` entries at the start of `raw`, which has
        // room for them (the caller's contract; `MaybeUninit<T>` has `T`'s layout).
        let rc = unsafe { poll(cq, want as c_int, raw.as_mut_ptr().cast()) };
        let n = match usize::try_from(rc) {
            Ok(n) => n.min(want),
            // mlx5 returns -2 for a completion it cannot parse after consuming those before
            // it in the same call (and the one it failed on): they are in `raw`, each with
            // its status written. The failing one has no status, or (an error completion of
            // a QP it does not know) a status but no wr_id.
            Err(_) => {
                // SAFETY: every entry was initialized above.
                let entry = |i: usize| unsafe { raw[i].assume_init_ref() };
                let written = (0..want)
                    .take_while(|&i| entry(i).status != NO_STATUS)
                    .count();
                match written.checked_sub(1) {
                    Some(last) if entry(last).wr_id == NO_WR_ID => last,
                    _ => written,
                }
            }
        };
        for (o, w) in out[polled..].iter_mut().zip(&raw[..n]) {
            // SAFETY: the first `want` entries were initialized above (integers only); the
            // provider then wrote some of their fields.
            *o = decode(unsafe { w.assume_init_ref() });
        }
        polled += n;
        if rc < 0 {
            if polled > 0 {
                // Hand over what was polled; the next call reports the failure (mlx5
                // consumed the completion it could not parse: it would not fail again).
                failed.store(rc, Ordering::Relaxed);
                break;
            }
            return Err(poll_failure(rc));
        }
        if n < want {
            break;
        }
    }
    Ok(polled)
}

/// An `ibv_wc.status` no provider writes (the statuses run from 0 to 21).
const NO_STATUS: std::ffi::c_uint = std::ffi::c_uint::MAX;

/// The `wr_id` a polled entry starts with: a completion that fails to parse has none
/// written. (A queue's sends reach it only at sequence number 2^63 - 1, and a receive with
/// it is refused; a real completion with it, last in a failed call, would be taken for the
/// failing one.)
const NO_WR_ID: u64 = u64::MAX;

/// A negative return of `poll_cq`: `ibv_poll_cq(3)` promises only "negative", not an
/// errno (mlx5 returns -2 for a completion it cannot parse).
fn poll_failure(n: c_int) -> CqError {
    CqError::Os(io::Error::other(format!(
        "ibv_poll_cq failed (returned {n})"
    )))
}

/// Completions polled per call to the provider's `poll_cq`.
const POLL_CHUNK: usize = 32;

/// An RC queue pair.
pub struct VerbsQp {
    qp: NonNull<sys::ibv_qp>,
    _pd: Arc<PdInner>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    caps: QpCaps,
    sq_sig_all: bool,
    dev: VerbsDevice,
    psn: AtomicU32,
    /// The state as this QP's modifies and queries last found it (libibverbs caches it in
    /// `ibv_qp.state` too, which its calls write without a lock: this is read instead).
    state: AtomicU32,
    /// Whether the QP ever reached RTS (mlx5 takes no work request in the error state
    /// before it has: `ENOMEM` for ever).
    reached_rts: AtomicBool,
    /// Held across `ibv_modify_qp` and `ibv_query_qp`, which write `ibv_qp.state` unlocked.
    attr_calls: Mutex<()>,
}

// SAFETY: `ibv_post_send` and `ibv_post_recv` are thread-safe (libmlx5 unless
// `MLX5_SINGLE_THREADED=1`, which `VerbsDevice::open` refuses); `ibv_modify_qp` and
// `ibv_query_qp`, which write the QP's cached state (`ibv_qp.state`) without a lock, are
// called under `attr_calls`, and selsig never reads that field; the handle is owned until
// `Drop`. Some providers' post calls read that field without a lock (rxe's `post_recv`,
// irdma's posts), so a post on one thread and a modify or query on another race inside
// rdma-core, as they do in any program that posts while another thread changes or
// queries the QP: the post sees the state just before or just after the change (at worst
// a stale `EINVAL`, which `post_error` re-checks against the queried state). selsig cannot
// close that without serializing every post with those calls.
unsafe impl Send for VerbsQp {}
// SAFETY: as above.
unsafe impl Sync for VerbsQp {}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // SAFETY: the QP was created by `ibv_create_qp`; its PD and CQs are still alive
        // (this struct holds them), as the destroy requires.
        let rc = unsafe { (self.dev.v().fns.destroy_qp)(self.qp.as_ptr()) };
        if rc != 0 {
            report(format_args!("ibv_destroy_qp failed: {}", destroy_error(rc)));
        }
    }
}

/// Whether a send queue in `state` takes no work request: below RTS, and in the error
/// state before it ever reached RTS (mlx5 refuses every post there with `ENOMEM`, for
/// ever, which would read as a full queue; rxe takes them and flushes them).
fn takes_no_sends(state: QpState, reached_rts: bool) -> bool {
    match state {
        QpState::Reset | QpState::Init | QpState::Rtr => true,
        QpState::Err | QpState::Sqe => !reached_rts,
        _ => false,
    }
}

fn state_name(s: u32) -> QpState {
    QpState::try_from(s).unwrap_or(QpState::Err)
}

impl VerbsQp {
    /// The attributes `mask` names (`ibv_query_qp`); `None` if they cannot be read.
    fn query(&self, mask: c_int) -> Option<sys::ibv_qp_attr> {
        let _calls = self.attr_calls.lock().unwrap_or_else(|e| e.into_inner());
        self.query_locked(mask)
    }

    /// [`query`](Self::query), `attr_calls` held.
    fn query_locked(&self, mask: c_int) -> Option<sys::ibv_qp_attr> {
        let mut attr = sys::ibv_qp_attr::default();
        // SAFETY: `init` is a valid `ibv_qp_init_attr` to fill; `attr` likewise.
        let rc = unsafe {
            let mut init: sys::ibv_qp_init_attr = std::mem::zeroed();
            (self.dev.v().fns.query_qp)(self.qp.as_ptr(), &mut attr, mask, &mut init)
        };
        if rc == 0 && mask & sys::IBV_QP_STATE != 0 {
            self.state.store(attr.qp_state, Ordering::Release);
        }
        (rc == 0).then_some(attr)
    }

    /// The path MTU the QP uses, in bytes (`ibv_query_qp`), once connected (before, what
    /// the device reports for a QP with no path: 256 on rxe); `None` if it cannot be read.
    pub fn path_mtu(&self) -> Option<u32> {
        self.query(sys::IBV_QP_PATH_MTU)
            .map(|attr| mtu_bytes(attr.path_mtu))
    }

    /// How many RDMA READs and atomics the QP keeps in flight and serves at once
    /// (`max_rd_atomic`, `max_dest_rd_atomic`, from `ibv_query_qp`; a provider may round
    /// them up); `None` if they cannot be read.
    pub fn rd_atomic(&self) -> Option<(u8, u8)> {
        self.query(sys::IBV_QP_MAX_QP_RD_ATOMIC | sys::IBV_QP_MAX_DEST_RD_ATOMIC)
            .map(|attr| (attr.max_rd_atomic, attr.max_dest_rd_atomic))
    }

    fn modify(
        &self,
        attr: &mut sys::ibv_qp_attr,
        mask: c_int,
        to: QpState,
        what: &str,
    ) -> Result<(), ProviderError> {
        let _calls = self.attr_calls.lock().unwrap_or_else(|e| e.into_inner());
        let from = self
            .query_locked(sys::IBV_QP_STATE)
            .map_or_else(|| self.cached_state(), |a| state_name(a.qp_state));
        // SAFETY: `attr` is a valid `ibv_qp_attr` whose fields named by `mask` are set.
        let rc = unsafe { (self.dev.v().fns.modify_qp)(self.qp.as_ptr(), attr, mask) };
        if rc == 0 {
            self.state.store(attr.qp_state, Ordering::Release);
            if to == QpState::Rts {
                self.reached_rts.store(true, Ordering::Release);
            }
        }
        if rc != 0 {
            let code = errno_of(rc, io::Error::last_os_error().raw_os_error());
            return Err(ProviderError::Transition {
                qp_num: self.qp_num(),
                from,
                to,
                why: format!(
                    "ibv_modify_qp failed ({}); attributes set: {what}",
                    io::Error::from_raw_os_error(code)
                ),
            });
        }
        Ok(())
    }

    /// The state this QP's calls last found.
    fn cached_state(&self) -> QpState {
        state_name(self.state.load(Ordering::Acquire))
    }

    fn local_psn(&self) -> u32 {
        let psn = self.psn.load(Ordering::Relaxed);
        if psn != u32::MAX {
            return psn;
        }
        let fresh = random_psn();
        match self
            .psn
            .compare_exchange(u32::MAX, fresh, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => fresh,
            Err(existing) => existing,
        }
    }

    /// Refuses options out of range ([`ConnectOptions::check`]), a port other than the
    /// one the device was opened on, and a GID index other than the device's: the
    /// endpoint advertises the GID of the index the device was opened with, so the path
    /// must start from that one (the peer's `dgid` would name another address than the
    /// packets come from).
    fn check_options(&self, options: &ConnectOptions) -> Result<(), ProviderError> {
        options.check()?;
        if options.port != self.dev.port {
            return Err(ProviderError::Invalid {
                what: "port",
                why: format!(
                    "the device was opened on port {}, not {}",
                    self.dev.port, options.port
                ),
            });
        }
        match options.gid_index {
            Some(i) if Some(i) != self.dev.gid_index => Err(ProviderError::Invalid {
                what: "GID index",
                why: format!(
                    "{} was opened with GID index {}, whose GID the endpoint advertises; \
                     connect with that index (or open the device with {i})",
                    self.dev.name(),
                    self.dev
                        .gid_index
                        .map_or("none (LID routing)".to_string(), |g| g.to_string())
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Posts `wrs` as one `ibv_post_send` list built in `sges` and `raw` (at least
    /// `wrs.len()` entries each).
    fn post_send_in(
        &self,
        wrs: &[SendWr<'_>],
        sges: &mut [MaybeUninit<sys::ibv_sge>],
        raw: &mut [MaybeUninit<sys::ibv_send_wr>],
    ) -> Result<(), PostWrError> {
        let base = raw.as_mut_ptr().cast::<sys::ibv_send_wr>();
        let sge_base = sges.as_mut_ptr().cast::<sys::ibv_sge>();
        for (i, wr) in wrs.iter().enumerate() {
            let (sge, inline) = match wr.local {
                Local::Empty => (None, false),
                Local::Sge(s) => (
                    Some(sys::ibv_sge {
                        addr: s.addr,
                        length: s.length,
                        lkey: s.lkey,
                    }),
                    false,
                ),
                Local::Inline(data) => (
                    Some(sys::ibv_sge {
                        addr: data.as_ptr() as u64,
                        length: data.len() as u32,
                        lkey: 0,
                    }),
                    true,
                ),
            };
            let sg_list = match sge {
                Some(sge) => {
                    let at = sge_base.wrapping_add(i);
                    // SAFETY: `i < wrs.len() <= sges.len()`: `at` is in `sges`, written
                    // through the pointer the list keeps (not through the slice, which
                    // would retag the memory the list points at).
                    unsafe { at.write(sge) };
                    at
                }
                None => std::ptr::null_mut(),
            };
            let opcode = match wr.opcode {
                Opcode::RdmaWrite => sys::IBV_WR_RDMA_WRITE,
                Opcode::RdmaWriteWithImm => sys::IBV_WR_RDMA_WRITE_WITH_IMM,
                Opcode::RdmaRead => sys::IBV_WR_RDMA_READ,
                Opcode::Send => sys::IBV_WR_SEND,
                Opcode::SendWithImm => sys::IBV_WR_SEND_WITH_IMM,
            };
            let mut flags = 0;
            if wr.signaled {
                flags |= sys::IBV_SEND_SIGNALED;
            }
            if inline {
                flags |= sys::IBV_SEND_INLINE;
            }
            // SAFETY: `i < wrs.len() <= raw.len()`, written through the list's base pointer
            // as the sges above.
            unsafe {
                base.wrapping_add(i).write(sys::ibv_send_wr {
                    wr_id: wr.wr_id,
                    next: if i + 1 < wrs.len() {
                        base.wrapping_add(i + 1)
                    } else {
                        std::ptr::null_mut()
                    },
                    sg_list,
                    num_sge: i32::from(sge.is_some()),
                    opcode,
                    send_flags: flags,
                    imm_data: wr.imm_data.to_be(),
                    wr: sys::ibv_send_wr_wr {
                        rdma: sys::ibv_rdma_info {
                            remote_addr: wr.remote.addr,
                            rkey: wr.remote.rkey,
                        },
                    },
                    _qp_type: 0,
                    _bind_mw_or_tso: [0; 6],
                });
            }
        }
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        let qp = self.qp.as_ptr();
        // SAFETY: `post_send` is the provider's function from the context's ops table (what
        // the static inline `ibv_post_send` calls). The first `wrs.len()` entries of `raw`
        // and the entries of `sges` they point at were written above and form the list;
        // they and the inline bytes they point at live until it returns (inline data is
        // copied during the call).
        let rc = unsafe {
            let Some(post) = (*(*qp).context).ops.post_send else {
                return Err(PostWrError {
                    index: 0,
                    failure: PostFailure::Other,
                    source: Some(io::Error::other("the provider has no post_send")),
                });
            };
            post(qp, base, &mut bad)
        };
        post_result(rc, bad, base, wrs.len(), Queue::Send, || self.state())
    }
}

fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    (h.finish() as u32) & 0x00ff_ffff
}

impl QueuePair for VerbsQp {
    fn qp_num(&self) -> u32 {
        // SAFETY: the QP is valid until `Drop`; `qp_num` is set at creation.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn destroy_cleans_cq(&self) -> bool {
        self.dev.cleans_cq
    }

    fn send_cq_identity(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self._send_cq) as usize)
    }

    fn recv_cq_is_send_cq(&self) -> bool {
        Arc::ptr_eq(&self._send_cq, &self._recv_cq)
    }

    fn sq_sig_all(&self) -> bool {
        self.sq_sig_all
    }

    fn state(&self) -> QpState {
        match self.query(sys::IBV_QP_STATE) {
            Some(attr) => state_name(attr.qp_state),
            // The state the last modify or query found.
            None => self.cached_state(),
        }
    }

    fn endpoint(&self, options: &ConnectOptions) -> Result<Endpoint, ProviderError> {
        self.check_options(options)?;
        Ok(Endpoint {
            qp_num: self.qp_num(),
            psn: self.local_psn(),
            lid: self.dev.lid,
            gid: self.dev.gid,
            mtu: options.mtu.min(self.dev.active_mtu),
            rd_atomic: responder_depth(self.dev.limits.as_ref()),
        })
    }

    fn connect(&self, remote: &Endpoint, options: &ConnectOptions) -> Result<(), ProviderError> {
        // Refused as bad input before anything changes.
        self.check_options(options)?;
        let port = self.dev.port;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: options.access.bits(),
            ..Default::default()
        };
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_PKEY_INDEX
                | sys::IBV_QP_PORT
                | sys::IBV_QP_ACCESS_FLAGS,
            QpState::Init,
            &format!("pkey_index 0, port {port}, access {}", options.access),
        )?;
        let gid_index = options.gid_index.or(self.dev.gid_index);
        let mtu = path_mtu(options.mtu, self.dev.active_mtu, remote.mtu);
        let responder = responder_depth(self.dev.limits.as_ref());
        let initiator = initiator_depth(self.dev.limits.as_ref(), remote.rd_atomic);
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: mtu_enum(mtu),
            dest_qp_num: remote.qp_num,
            rq_psn: remote.psn & 0x00ff_ffff,
            max_dest_rd_atomic: responder,
            min_rnr_timer: 12,
            ah_attr: sys::ibv_ah_attr {
                grh: sys::ibv_global_route {
                    dgid: sys::ibv_gid { raw: remote.gid },
                    sgid_index: gid_index.unwrap_or(0),
                    hop_limit: 64,
                    ..Default::default()
                },
                dlid: remote.lid,
                is_global: u8::from(gid_index.is_some()),
                port_num: port,
                ..Default::default()
            },
            ..Default::default()
        };
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_AV
                | sys::IBV_QP_PATH_MTU
                | sys::IBV_QP_DEST_QPN
                | sys::IBV_QP_RQ_PSN
                | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                | sys::IBV_QP_MIN_RNR_TIMER,
            QpState::Rtr,
            &format!(
                "path_mtu {}, dest_qp_num {:#x}, rq_psn {:#x}, max_dest_rd_atomic {responder}, \
                 address vector (dlid {}, {})",
                mtu_bytes(mtu_enum(mtu)),
                remote.qp_num,
                remote.psn,
                remote.lid,
                match gid_index {
                    Some(i) => format!("sgid_index {i}, dgid {}", gid_text(&remote.gid)),
                    None => "no GRH".to_string(),
                }
            ),
        )?;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: options.retry_cnt,
            rnr_retry: options.rnr_retry,
            sq_psn: self.local_psn(),
            max_rd_atomic: initiator,
            ..Default::default()
        };
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_TIMEOUT
                | sys::IBV_QP_RETRY_CNT
                | sys::IBV_QP_RNR_RETRY
                | sys::IBV_QP_SQ_PSN
                | sys::IBV_QP_MAX_QP_RD_ATOMIC,
            QpState::Rts,
            &format!(
                "timeout 14, retry_cnt {}, rnr_retry {}, sq_psn {:#x}, max_rd_atomic {initiator}",
                options.retry_cnt,
                options.rnr_retry,
                self.local_psn()
            ),
        )
    }

    fn to_error(&self) -> Result<(), ProviderError> {
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_ERR,
            ..Default::default()
        };
        self.modify(&mut a, sys::IBV_QP_STATE, QpState::Err, "state ERR")
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostWrError> {
        if wrs.is_empty() {
            return Ok(());
        }
        // The state the last modify or query found: below RTS a send queue takes nothing
        // (rxe would queue the work requests and run them after RTS while the post
        // reports them refused), nor in the error state before it ever reached RTS.
        let cached = self.cached_state();
        if takes_no_sends(cached, self.reached_rts.load(Ordering::Acquire)) {
            return Err(PostWrError {
                index: 0,
                failure: PostFailure::State(cached),
                source: None,
            });
        }
        if let Some((bad, failure)) = refused_up_front(wrs, self.caps.max_inline_data) {
            // What comes before it is posted, as a provider's `bad_wr` would leave it. If
            // that post took them all and failed after (rxe's doorbell), they are posted
            // all the same: the refusal at `bad` is the error to report.
            if let Err(e) = self.post_send(&wrs[..bad])
                && e.index < bad
            {
                return Err(e);
            }
            return Err(PostWrError {
                index: bad,
                failure,
                source: None,
            });
        }
        // Built in place, on the stack for the usual batch sizes: no allocation, no copies.
        if wrs.len() <= POST_INLINE {
            let mut sges = [const { MaybeUninit::uninit() }; POST_INLINE];
            let mut raw = [const { MaybeUninit::uninit() }; POST_INLINE];
            self.post_send_in(wrs, &mut sges, &mut raw)
        } else {
            let mut sges = Vec::with_capacity(wrs.len());
            sges.resize_with(wrs.len(), MaybeUninit::uninit);
            let mut raw = Vec::with_capacity(wrs.len());
            raw.resize_with(wrs.len(), MaybeUninit::uninit);
            self.post_send_in(wrs, &mut sges, &mut raw)
        }
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), PostWrError> {
        if wrs.is_empty() {
            return Ok(());
        }
        // A receive's completion with the `wr_id` a failed poll marks an unparsed
        // completion with could be lost (see `NO_WR_ID`): refused at its position, those
        // before it posted.
        if let Some(at) = wrs.iter().position(|w| w.wr_id == NO_WR_ID) {
            self.post_recv(&wrs[..at])?;
            return Err(PostWrError {
                index: at,
                failure: PostFailure::Invalid(
                    "a receive's wr_id cannot be u64::MAX (the verbs provider marks an \
                     unparsed completion with it)",
                ),
                source: None,
            });
        }
        let mut sges: Vec<sys::ibv_sge> = wrs
            .iter()
            .map(|w| {
                w.sge.map_or_else(sys::ibv_sge::default, |s| sys::ibv_sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                })
            })
            .collect();
        let mut raw: Vec<sys::ibv_recv_wr> = wrs
            .iter()
            .map(|w| sys::ibv_recv_wr {
                wr_id: w.wr_id,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: i32::from(w.sge.is_some()),
            })
            .collect();
        let base = raw.as_mut_ptr();
        for i in 0..raw.len() {
            // SAFETY: as in `post_send`.
            unsafe {
                let w = base.add(i);
                if (*w).num_sge > 0 {
                    (*w).sg_list = sges.as_mut_ptr().add(i);
                }
                if i + 1 < wrs.len() {
                    (*w).next = base.add(i + 1);
                }
            }
        }
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        let qp = self.qp.as_ptr();
        // SAFETY: as in `post_send`, with the provider's `post_recv`.
        let rc = unsafe {
            let Some(post) = (*(*qp).context).ops.post_recv else {
                return Err(PostWrError {
                    index: 0,
                    failure: PostFailure::Other,
                    source: Some(io::Error::other("the provider has no post_recv")),
                });
            };
            post(qp, base, &mut bad)
        };
        let result = post_result(rc, bad, base, wrs.len(), Queue::Recv, || self.state());
        // A receive posted to a QP in the error state is flushed, as the error state does
        // with every work request; but rxe's kernel flushes a receive queue only when its
        // responder runs (the QP's move to ERR, a packet), and rxe's `post_recv` never
        // enters the kernel: the receive would never complete. Moving the QP to ERR again
        // runs the responder. (Should the NIC move the QP to ERR after this query, its own
        // flush takes the receive.)
        let posted = result.as_ref().map_or_else(|e| e.index, |()| wrs.len());
        if posted > 0 && self.dev.software && self.state() == QpState::Err {
            // Best effort: the receives are posted whatever this says.
            let _ = self.to_error();
        }
        result
    }
}

/// Which queue a failed post was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Send,
    Recv,
}

/// What `ibv_post_send` / `ibv_post_recv` returned, `rc`, with `bad_wr` as it left it in a
/// list of `len` work requests starting at `base`. Call it right after the post: a provider
/// that returns -1 sets `errno`.
fn post_result<T>(
    rc: i32,
    bad: *const T,
    base: *const T,
    len: usize,
    queue: Queue,
    state: impl FnOnce() -> QpState,
) -> Result<(), PostWrError> {
    if rc == 0 {
        return Ok(());
    }
    let errno = io::Error::last_os_error().raw_os_error();
    // The position of `bad_wr` from the addresses alone (nothing is read through it).
    let offset = (!bad.is_null()).then(|| {
        (bad as isize).wrapping_sub(base as isize) / std::mem::size_of::<T>().max(1) as isize
    });
    Err(post_error(rc, errno, offset, len, queue, state))
}

/// The errno of a verb that failed with `rc`: the errno itself (rxe, mlx5), its negation
/// (siw, erdma, bnxt_re), or -1 with the errno in `errno` (read right after the call);
/// EINVAL where none is given.
fn errno_of(rc: i32, errno: Option<i32>) -> i32 {
    match rc {
        1.. => rc,
        ..-1 => rc.saturating_neg(),
        _ => errno.filter(|&e| e > 0).unwrap_or(libc::EINVAL),
    }
}

/// The error of a failed `ibv_post_send` / `ibv_post_recv`: `rc` is what the provider
/// returned (rxe and mlx5 return the errno; others may return -1 and set `errno`, read
/// right after the call), `bad` the position of `bad_wr` in the list of `len` work
/// requests (`None` when the provider left it null: a send batch was taken whole, a
/// receive batch not at all), `state` queries the QP's state (only for `EINVAL`).
fn post_error(
    rc: i32,
    errno: Option<i32>,
    bad: Option<isize>,
    len: usize,
    queue: Queue,
    state: impl FnOnce() -> QpState,
) -> PostWrError {
    let code = errno_of(rc, errno);
    if bad.is_none() && queue == Queue::Send {
        // Every provider but rxe names the work request that failed. rxe leaves `bad_wr`
        // null when it took every work request and then its doorbell `write()` failed
        // (`rxe_post_send`): they are in its queue and run with the next doorbell (even
        // one rung after RTS, when the kernel refused this one for the state). Taken as
        // posted, so no buffer comes back while the NIC may still read it.
        return PostWrError {
            index: len,
            failure: PostFailure::AfterPosting,
            source: Some(io::Error::from_raw_os_error(code)),
        };
    }
    let index = bad.map_or(0, |i| i.clamp(0, len as isize - 1) as usize);
    let failure = match code {
        libc::ENOMEM | libc::ENOSPC => PostFailure::Full,
        libc::EINVAL => {
            // A send queue takes work requests from RTS on (and, flushing them, in the
            // error states); a receive queue from INIT on.
            let state = state();
            let refused = match queue {
                Queue::Send => matches!(state, QpState::Reset | QpState::Init | QpState::Rtr),
                Queue::Recv => state == QpState::Reset,
            };
            if refused {
                PostFailure::State(state)
            } else {
                PostFailure::Invalid("rejected by the provider (EINVAL)")
            }
        }
        _ => PostFailure::Other,
    };
    PostWrError {
        index,
        failure,
        source: Some(io::Error::from_raw_os_error(code)),
    }
}

fn gid_text(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

impl Device for VerbsDevice {
    type Pd = VerbsPd;
    type Mr = VerbsMr;
    type Cq = VerbsCq;
    type Qp = VerbsQp;

    fn name(&self) -> &str {
        &self.ctx.name
    }

    fn alloc_pd(&self) -> Result<VerbsPd, ProviderError> {
        // SAFETY: the context is open.
        let pd = unsafe { (self.v().fns.alloc_pd)(self.ctx.ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| os("ibv_alloc_pd"))?;
        Ok(VerbsPd {
            inner: Arc::new(PdInner {
                pd,
                ctx: Arc::clone(&self.ctx),
            }),
        })
    }

    fn reg_mr(&self, pd: &VerbsPd, len: usize, access: Access) -> Result<VerbsMr, ProviderError> {
        self.own("protection domain", &pd.inner.ctx)?;
        if let Some(max) = self.limits.map(|l| l.max_mr_size)
            && len as u64 > max
        {
            return Err(ProviderError::Invalid {
                what: "region length",
                why: format!(
                    "{len} bytes: {} registers at most {max} (max_mr_size)",
                    self.ctx.name
                ),
            });
        }
        let layout =
            region_layout(len, rustix::param::page_size()).map_err(|e| ProviderError::Invalid {
                what: "region length",
                why: format!("{len} bytes: {e}"),
            })?;
        // SAFETY: the layout has a non-zero size.
        let mem = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or_else(|| {
            ProviderError::Invalid {
                what: "region length",
                why: format!("cannot allocate {len} bytes"),
            }
        })?;
        // SAFETY: `mem` is `len` bytes of memory owned by the region, registered for as long
        // as the region lives.
        let mr = unsafe {
            (self.v().fns.reg_mr)(
                pd.inner.pd.as_ptr(),
                mem.as_ptr().cast::<c_void>(),
                len,
                access.bits() as c_int,
            )
        };
        let Some(mr) = NonNull::new(mr) else {
            let err = os("ibv_reg_mr");
            // SAFETY: the registration failed: the memory is ours to free.
            unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
            return Err(err);
        };
        Ok(VerbsMr {
            mr,
            mem,
            layout,
            len,
            access,
            pd: Arc::clone(&pd.inner),
            cpu: std::sync::Mutex::new(()),
        })
    }

    fn create_cq(&self, min_entries: u32) -> Result<VerbsCq, ProviderError> {
        if let Some(max) = self.limits.map(|l| l.max_cqe)
            && (min_entries == 0 || min_entries > max)
        {
            return Err(ProviderError::Invalid {
                what: "CQ size",
                why: format!(
                    "{min_entries} entries: {} supports 1 to {max} (max_cqe)",
                    self.ctx.name
                ),
            });
        }
        let cqe = c_int::try_from(min_entries).map_err(|_| ProviderError::Invalid {
            what: "CQ size",
            why: format!("{min_entries} entries"),
        })?;
        // SAFETY: the context is open; no channel, no CQ context.
        let cq = unsafe {
            (self.v().fns.create_cq)(
                self.ctx.ctx.as_ptr(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(|| os("ibv_create_cq"))?;
        Ok(VerbsCq {
            inner: Arc::new(CqInner {
                cq,
                ctx: Arc::clone(&self.ctx),
                failed: AtomicI32::new(0),
            }),
        })
    }

    fn create_qp(
        &self,
        pd: &VerbsPd,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
        init: &QpInit,
    ) -> Result<VerbsQp, ProviderError> {
        self.own("protection domain", &pd.inner.ctx)?;
        self.own("send CQ", &send_cq.inner.ctx)?;
        self.own("receive CQ", &recv_cq.inner.ctx)?;
        if let Some(l) = self.limits {
            let caps = &init.caps;
            for (what, n, max, field) in [
                ("max_send_wr", caps.max_send_wr, l.max_qp_wr, "max_qp_wr"),
                ("max_recv_wr", caps.max_recv_wr, l.max_qp_wr, "max_qp_wr"),
                ("max_send_sge", caps.max_send_sge, l.max_sge, "max_sge"),
                ("max_recv_sge", caps.max_recv_sge, l.max_sge, "max_sge"),
            ] {
                if n > max {
                    return Err(ProviderError::Invalid {
                        what,
                        why: format!("{n}: {} supports up to {max} ({field})", self.ctx.name),
                    });
                }
            }
        }
        let mut attr = sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.inner.cq.as_ptr(),
            recv_cq: recv_cq.inner.cq.as_ptr(),
            srq: std::ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: init.caps.max_send_wr,
                max_recv_wr: init.caps.max_recv_wr,
                max_send_sge: init.caps.max_send_sge.max(1),
                max_recv_sge: init.caps.max_recv_sge.max(1),
                max_inline_data: init.caps.max_inline_data,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: c_int::from(init.sq_sig_all),
        };
        // SAFETY: `attr` is valid; the CQs and the PD belong to this context and the QP
        // keeps them alive. On success the real capacities are written back into `attr.cap`.
        let qp = unsafe { (self.v().fns.create_qp)(pd.inner.pd.as_ptr(), &mut attr) };
        let qp = NonNull::new(qp).ok_or_else(|| os("ibv_create_qp"))?;
        let c = attr.cap;
        Ok(VerbsQp {
            qp,
            _pd: Arc::clone(&pd.inner),
            _send_cq: Arc::clone(&send_cq.inner),
            _recv_cq: Arc::clone(&recv_cq.inner),
            caps: QpCaps {
                max_send_wr: c.max_send_wr,
                max_recv_wr: c.max_recv_wr,
                max_send_sge: c.max_send_sge,
                max_recv_sge: c.max_recv_sge,
                max_inline_data: c.max_inline_data,
            },
            sq_sig_all: init.sq_sig_all,
            dev: self.clone(),
            psn: AtomicU32::new(u32::MAX),
            state: AtomicU32::new(sys::IBV_QPS_RESET),
            reached_rts: AtomicBool::new(false),
            attr_calls: Mutex::new(()),
        })
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        // SAFETY: `ev` is filled by `get_async_event` (non-blocking: the fd was set
        // O_NONBLOCK at open), read, then acknowledged as the API requires. The QP or CQ
        // it points to is alive until then: destroying one waits for the acknowledgement
        // of its events (`events_completed` in `ibv_cmd_destroy_qp`/`_cq`).
        unsafe {
            let mut ev = sys::ibv_async_event {
                element: std::ptr::null_mut(),
                event_type: 0,
            };
            if (self.v().fns.get_async_event)(self.ctx.ctx.as_ptr(), &mut ev) != 0 {
                return None;
            }
            let event = decode_event(&ev);
            (self.v().fns.ack_async_event)(&mut ev);
            Some(event)
        }
    }
}

/// The path MTU: the smallest of what is asked, this port's active MTU and the peer's
/// (0: not known).
fn path_mtu(asked: u32, active: u32, remote: u32) -> u32 {
    let remote = if remote == 0 { u32::MAX } else { remote };
    asked.min(active).min(remote)
}

/// The event `ev` describes.
///
/// # Safety
///
/// `ev.element` points to a live `ibv_cq` for `IBV_EVENT_CQ_ERR` and to a live `ibv_qp`
/// for the QP events, as `ibv_get_async_event` fills it until the event is acknowledged.
unsafe fn decode_event(ev: &sys::ibv_async_event) -> AsyncEvent {
    // SAFETY: the element is a QP for the QP events (the caller's promise).
    let qp_num = || unsafe { (*ev.element.cast::<sys::ibv_qp>()).qp_num };
    match ev.event_type {
        sys::IBV_EVENT_CQ_ERR => AsyncEvent::CqErr {
            // SAFETY: the element is a CQ for this event (the caller's promise).
            cq: unsafe { (*ev.element.cast::<sys::ibv_cq>()).handle },
        },
        sys::IBV_EVENT_QP_FATAL => AsyncEvent::QpFatal { qp_num: qp_num() },
        sys::IBV_EVENT_QP_REQ_ERR => AsyncEvent::QpReqErr { qp_num: qp_num() },
        sys::IBV_EVENT_QP_ACCESS_ERR => AsyncEvent::QpAccessErr { qp_num: qp_num() },
        sys::IBV_EVENT_PORT_ACTIVE => AsyncEvent::PortActive {
            port: port_of(ev.element),
        },
        sys::IBV_EVENT_PORT_ERR => AsyncEvent::PortErr {
            port: port_of(ev.element),
        },
        other => AsyncEvent::Other { event_type: other },
    }
}

/// The memory of a region of `len` bytes: whole pages of `page` bytes, aligned to a page.
/// `ibv_reg_mr` pins (and, with fork protection, marks "don't copy on fork") the whole
/// pages the region touches: no other object may share them.
fn region_layout(len: usize, page: usize) -> Result<Layout, std::alloc::LayoutError> {
    Layout::from_size_align(len.max(1), page).map(|l| l.pad_to_align())
}

/// The `port_num` member of `ibv_async_event.element`, a union of pointers and an `int`
/// (libibverbs writes the `int`): it lies at the union's start, so in the first bytes of
/// the pointer as it sits in memory, whatever the byte order. (Ports are numbered from 1
/// up to at most 255: `ibv_device_attr.phys_port_cnt` is a `u8`.)
fn port_of(element: *mut c_void) -> u8 {
    let bytes = (element as usize).to_ne_bytes();
    let mut int = [0u8; size_of::<c_int>()];
    int.copy_from_slice(&bytes[..size_of::<c_int>()]);
    c_int::from_ne_bytes(int) as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_uint;

    /// A region's memory is whole pages of the host's size, whatever its length.
    #[test]
    fn a_region_takes_whole_pages() {
        for page in [4096, 65536] {
            for (len, size) in [(0, page), (1, page), (page, page), (page + 1, 2 * page)] {
                let layout = region_layout(len, page).unwrap();
                assert_eq!((layout.size(), layout.align()), (size, page), "{len}");
            }
        }
        assert!(region_layout(usize::MAX - 10, 4096).is_err());
    }

    /// The port number of a port event is the union's `int`, at its start, on either byte
    /// order (a cast of the pointer's value reads it only on a little-endian host).
    #[test]
    fn a_port_event_s_port_is_the_int_at_the_start_of_the_element() {
        for port in [1u8, 2, 255] {
            let mut union = [0xa5u8; size_of::<*mut c_void>()];
            union[..size_of::<c_int>()].copy_from_slice(&c_int::from(port).to_ne_bytes());
            let element = usize::from_ne_bytes(union) as *mut c_void;
            assert_eq!(port_of(element), port);
        }
    }

    /// A peer that did not say its MTU leaves the smaller of what was asked and this
    /// port's: never more than the port takes.
    #[test]
    fn the_path_mtu_is_the_smallest_known() {
        assert_eq!(path_mtu(4096, 1024, 0), 1024);
        assert_eq!(path_mtu(1024, 4096, 0), 1024);
        assert_eq!(path_mtu(4096, 4096, 2048), 2048);
        assert_eq!(path_mtu(4096, 1024, 4096), 1024);
        assert_eq!(path_mtu(512, 1024, 2048), 512);
    }

    /// Each event is read from the element its type names: a CQ's handle, a QP's number,
    /// a port number in the pointer itself.
    #[test]
    fn async_events_are_decoded_from_their_element() {
        // SAFETY: both structs are plain C data (pointers, integers, pthread objects), for
        // which all zero bytes are a valid value; only the fields set below are read.
        let (mut cq, mut qp) = unsafe {
            (
                std::mem::zeroed::<sys::ibv_cq>(),
                std::mem::zeroed::<sys::ibv_qp>(),
            )
        };
        cq.handle = 0x51;
        qp.qp_num = 0x1234;
        let cq_ptr: *mut sys::ibv_cq = &mut cq;
        let qp_ptr: *mut sys::ibv_qp = &mut qp;
        for (event_type, element, expected) in [
            (
                sys::IBV_EVENT_CQ_ERR,
                cq_ptr.cast(),
                AsyncEvent::CqErr { cq: 0x51 },
            ),
            (
                sys::IBV_EVENT_QP_FATAL,
                qp_ptr.cast(),
                AsyncEvent::QpFatal { qp_num: 0x1234 },
            ),
            (
                sys::IBV_EVENT_QP_REQ_ERR,
                qp_ptr.cast(),
                AsyncEvent::QpReqErr { qp_num: 0x1234 },
            ),
            (
                sys::IBV_EVENT_QP_ACCESS_ERR,
                qp_ptr.cast(),
                AsyncEvent::QpAccessErr { qp_num: 0x1234 },
            ),
            (
                sys::IBV_EVENT_PORT_ACTIVE,
                std::ptr::without_provenance_mut(2),
                AsyncEvent::PortActive { port: 2 },
            ),
            (
                sys::IBV_EVENT_PORT_ERR,
                std::ptr::without_provenance_mut(1),
                AsyncEvent::PortErr { port: 1 },
            ),
            (
                99,
                std::ptr::null_mut(),
                AsyncEvent::Other { event_type: 99 },
            ),
        ] {
            let ev = sys::ibv_async_event {
                element,
                event_type,
            };
            // SAFETY: the element is the CQ or QP above (alive) for the events that read
            // one; the others do not dereference it.
            assert_eq!(unsafe { decode_event(&ev) }, expected, "{event_type}");
        }
    }

    /// Standard error as a closed pipe: every write fails with EPIPE.
    struct ClosedPipe;

    impl io::Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    /// A failed destroy is reported where it can be, and a `Drop` goes on when it cannot
    /// (`eprintln!` panics on a closed pipe); a provider's negated errno reads as the errno.
    #[test]
    fn a_failed_destroy_is_reported_without_panicking() {
        let mut out = Vec::new();
        report_to(
            &mut out,
            format_args!("ibv_destroy_cq failed: {}", destroy_error(16)),
        );
        let busy = io::Error::from_raw_os_error(16).to_string();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("selsig-verbs: ibv_destroy_cq failed: {busy}\n")
        );
        report_to(&mut ClosedPipe, format_args!("ibv_dealloc_pd failed"));
        assert_eq!(destroy_error(-16).to_string(), busy);
    }

    #[test]
    fn a_send_queue_takes_work_from_rts_on_and_in_the_error_state_only_after_rts() {
        for (state, reached_rts, refused) in [
            (QpState::Reset, false, true),
            (QpState::Init, false, true),
            (QpState::Rtr, false, true),
            (QpState::Rts, true, false),
            // mlx5 would answer ENOMEM for ever (its qp_state_max_gs is -1 until RTS).
            (QpState::Err, false, true),
            (QpState::Err, true, false),
            (QpState::Sqe, true, false),
        ] {
            assert_eq!(
                takes_no_sends(state, reached_rts),
                refused,
                "{state:?}, reached RTS: {reached_rts}"
            );
        }
    }

    #[test]
    fn reads_in_flight_are_what_the_device_allows_and_the_peer_serves() {
        let limits = |rd: u32, init: u32| Limits {
            max_qp_wr: 1,
            max_sge: 1,
            max_cqe: 1,
            max_mr_size: 1,
            max_qp_rd_atom: rd,
            max_qp_init_rd_atom: init,
        };
        // mlx5 reports 16 and 16, rxe 128 and 128.
        let mlx5 = limits(16, 16);
        assert_eq!(responder_depth(Some(&mlx5)), 16);
        assert_eq!(initiator_depth(Some(&mlx5), 128), 16);
        assert_eq!(initiator_depth(Some(&mlx5), 4), 4);
        // A peer that does not say serves one.
        assert_eq!(initiator_depth(Some(&mlx5), 0), 1);
        // The attributes are a byte wide; a device that does not say, or says 0, gets 1.
        assert_eq!(responder_depth(Some(&limits(1000, 1000))), 255);
        assert_eq!(initiator_depth(Some(&limits(1000, 1000)), 255), 255);
        assert_eq!(responder_depth(None), 1);
        assert_eq!(initiator_depth(None, 16), 1);
        assert_eq!(responder_depth(Some(&limits(0, 0))), 1);
        assert_eq!(initiator_depth(Some(&limits(0, 0)), 16), 1);
    }

    #[test]
    fn inline_work_requests_the_provider_must_not_see_are_found() {
        assert!(!too_long_for_an_sge(u32::MAX as usize));
        assert!(too_long_for_an_sge(u32::MAX as usize + 1));
        let small = [1u8; 8];
        let wr = SendWr {
            wr_id: 1,
            opcode: selsig::Opcode::RdmaWrite,
            local: Local::Inline(&small),
            remote: selsig::RemoteAddr { addr: 0, rkey: 0 },
            imm_data: 0,
            signaled: false,
        };
        assert_eq!(refused_up_front(&[wr, wr], 8), None);
        assert_eq!(
            refused_up_front(&[wr, wr], 7),
            Some((0, PostFailure::InlineTooLong { len: 8, max: 7 }))
        );
        let read = SendWr {
            opcode: selsig::Opcode::RdmaRead,
            ..wr
        };
        assert_eq!(
            refused_up_front(&[wr, read], 64),
            Some((1, PostFailure::Invalid("an RDMA READ cannot be inline")))
        );
    }

    fn errno_of(e: &PostWrError) -> Option<i32> {
        e.source.as_ref().and_then(io::Error::raw_os_error)
    }

    #[test]
    fn post_errors_take_the_errno_from_the_return_code_or_errno() {
        let never = || -> QpState { panic!("the state is only queried for EINVAL") };
        // rxe and mlx5 return the errno itself.
        let e = post_error(
            libc::ENOMEM,
            Some(libc::EAGAIN),
            Some(3),
            8,
            Queue::Send,
            never,
        );
        assert_eq!(
            (e.index, e.failure, errno_of(&e)),
            (3, PostFailure::Full, Some(libc::ENOMEM))
        );
        // Others return -1 and set errno: the same for sends and receives.
        for queue in [Queue::Send, Queue::Recv] {
            let e = post_error(-1, Some(libc::ENOMEM), Some(0), 2, queue, never);
            assert_eq!(
                (e.failure, errno_of(&e)),
                (PostFailure::Full, Some(libc::ENOMEM))
            );
            // ENOSPC is a full queue too.
            let e = post_error(-1, Some(libc::ENOSPC), Some(0), 2, queue, never);
            assert_eq!(
                (e.failure, errno_of(&e)),
                (PostFailure::Full, Some(libc::ENOSPC))
            );
            let e = post_error(-1, Some(libc::EIO), Some(0), 2, queue, never);
            assert_eq!(
                (e.index, e.failure, errno_of(&e)),
                (0, PostFailure::Other, Some(libc::EIO))
            );
            // -1 without an errno: EINVAL, judged by the state.
            let e = post_error(-1, Some(0), Some(0), 2, queue, || QpState::Rts);
            assert_eq!(errno_of(&e), Some(libc::EINVAL));
            assert!(matches!(e.failure, PostFailure::Invalid(_)), "{e:?}");
            // Others (siw, erdma, bnxt_re) return the errno negated; errno is stale then.
            let e = post_error(-libc::ENOMEM, Some(libc::EAGAIN), Some(1), 2, queue, never);
            assert_eq!(
                (e.index, e.failure, errno_of(&e)),
                (1, PostFailure::Full, Some(libc::ENOMEM))
            );
        }
    }

    #[test]
    fn post_results_find_bad_wr_by_its_address() {
        let list = [sys::ibv_sge::default(); 4];
        let base = list.as_ptr();
        assert!(post_result(0, std::ptr::null(), base, 4, Queue::Send, || QpState::Rts).is_ok());
        let e = post_result(
            libc::ENOMEM,
            base.wrapping_add(2),
            base,
            4,
            Queue::Send,
            || QpState::Rts,
        )
        .unwrap_err();
        assert_eq!((e.index, e.failure), (2, PostFailure::Full));
        // A null `bad_wr`: a receive batch was refused whole (rxe in RESET), a send batch
        // was taken whole before the provider failed (rxe's doorbell).
        let e = post_result(libc::EINVAL, std::ptr::null(), base, 4, Queue::Recv, || {
            QpState::Reset
        })
        .unwrap_err();
        assert_eq!(
            (e.index, e.failure),
            (0, PostFailure::State(QpState::Reset))
        );
        let e = post_result(libc::EINVAL, std::ptr::null(), base, 4, Queue::Send, || {
            panic!("a batch taken whole is no state error")
        })
        .unwrap_err();
        assert_eq!(
            (e.index, e.failure, errno_of(&e)),
            (4, PostFailure::AfterPosting, Some(libc::EINVAL))
        );
    }

    #[test]
    fn post_errors_name_the_bad_work_request_within_the_list() {
        let at = |bad| post_error(libc::ENOMEM, None, bad, 4, Queue::Send, || QpState::Rts).index;
        assert_eq!(
            [at(None), at(Some(0)), at(Some(2)), at(Some(3))],
            [4, 0, 2, 3]
        );
        // A pointer outside the list is not trusted beyond it.
        assert_eq!([at(Some(-1)), at(Some(9))], [0, 3]);
    }

    #[test]
    fn einval_is_a_state_error_where_the_queue_takes_no_work_requests() {
        let send =
            |state| post_error(libc::EINVAL, None, Some(0), 1, Queue::Send, || state).failure;
        let recv = |state| post_error(libc::EINVAL, None, None, 1, Queue::Recv, || state).failure;
        for state in [QpState::Reset, QpState::Init, QpState::Rtr] {
            assert_eq!(send(state), PostFailure::State(state));
        }
        assert!(matches!(send(QpState::Rts), PostFailure::Invalid(_)));
        assert_eq!(recv(QpState::Reset), PostFailure::State(QpState::Reset));
        for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
            assert!(matches!(recv(state), PostFailure::Invalid(_)), "{state:?}");
        }
    }

    #[test]
    fn the_default_roce_gid_is_a_v2_one_with_an_ipv4_address_if_there_is_one() {
        let link_local = {
            let mut g = [0u8; 16];
            g[0] = 0xfe;
            g[1] = 0x80;
            g[15] = 1;
            g
        };
        let ipv4 = {
            let mut g = [0u8; 16];
            g[10] = 0xff;
            g[11] = 0xff;
            g[12..].copy_from_slice(&[10, 77, 0, 1]);
            g
        };
        let (v1, v2) = (Some("IB/RoCE v1\n"), Some("RoCE v2\n"));
        // mlx5: each address as RoCE v1, then v2.
        let mlx5 = [
            (0, v1, link_local),
            (1, v2, link_local),
            (2, v1, ipv4),
            (3, v2, ipv4),
        ];
        assert_eq!(default_roce_gid(mlx5), 3);
        // rxe: RoCE v2 only.
        assert_eq!(default_roce_gid([(0, v2, link_local), (1, v2, ipv4)]), 1);
        // No IPv4 address: the first RoCE v2 GID; no types readable: 0.
        assert_eq!(
            default_roce_gid([(0, v1, link_local), (1, v2, link_local)]),
            1
        );
        assert_eq!(
            default_roce_gid([(0, None::<&str>, link_local), (1, None, ipv4)]),
            0
        );
        // Empty entries are skipped.
        assert_eq!(default_roce_gid([(0, v2, [0; 16]), (1, v2, link_local)]), 1);
        // No IPv4 address: a global IPv6 one before a link-local one.
        let global = {
            let mut g = [0u8; 16];
            g[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
            g[15] = 1;
            g
        };
        let ipv6 = [
            (0, v1, link_local),
            (1, v2, link_local),
            (2, v1, global),
            (3, v2, global),
        ];
        assert_eq!(default_roce_gid(ipv6), 3);
    }

    #[test]
    fn mlx4_and_mlx5_clean_a_destroyed_qps_completions() {
        assert!(driver_cleans_cq(Some("mlx5_core")));
        assert!(driver_cleans_cq(Some("mlx4_core")));
        assert!(!driver_cleans_cq(Some("bnxt_en")));
        assert!(!driver_cleans_cq(None)); // rxe: no device behind it
    }

    #[test]
    fn mtu_round_trips() {
        for (bytes, e) in [(256, 1), (512, 2), (1024, 3), (2048, 4), (4096, 5)] {
            assert_eq!(mtu_enum(bytes), e);
            assert_eq!(mtu_bytes(e), bytes);
        }
        assert_eq!(mtu_enum(9000), 5);
        // A ceiling: rounded down.
        assert_eq!(mtu_enum(1500), 3);
        assert_eq!(mtu_enum(4095), 4);
        assert_eq!(mtu_enum(100), 1);
    }

    #[test]
    fn completions_decode_without_panics() {
        let mut wc = sys::ibv_wc {
            wr_id: 7,
            status: 0,
            opcode: 129,
            byte_len: 12,
            imm_data: 42u32.to_be(),
            wc_flags: sys::IBV_WC_WITH_IMM,
            qp_num: 3,
            ..Default::default()
        };
        let d = decode(&wc);
        assert_eq!(
            (d.wr_id, d.status, d.opcode, d.imm_data),
            (
                7,
                WcStatus::Success,
                Some(WcOpcode::RecvRdmaWithImm),
                Some(42)
            )
        );
        wc.status = 999;
        assert_eq!(decode(&wc).status, WcStatus::GeneralErr);
        wc.status = 10;
        assert_eq!(
            decode(&wc).opcode,
            None,
            "an error completion's opcode is meaningless"
        );
    }

    #[test]
    fn gids_print_like_ibv_devinfo() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 77, 0, 1]);
        assert_eq!(gid_text(&g), "0000:0000:0000:0000:0000:ffff:0a4d:0001");
    }

    /// Writes `n` receive completions of 64 bytes (wr_id 1000, 1001, ...) and only their
    /// `wr_id`, `status`, `opcode` and `byte_len`: `wc_flags`, `imm_data`, `qp_num` are
    /// left as they were (as mlx5 leaves a WRITE's `byte_len` and a success's `vendor_err`).
    unsafe extern "C" fn writes_some_fields(
        _cq: *mut sys::ibv_cq,
        n: c_int,
        wc: *mut sys::ibv_wc,
    ) -> c_int {
        for i in 0..n as usize {
            // SAFETY: the poll loop passes room for `n` entries.
            unsafe {
                let w = wc.add(i);
                (&raw mut (*w).wr_id).write(1000 + i as u64);
                (&raw mut (*w).status).write(WcStatus::Success as c_uint);
                (&raw mut (*w).opcode).write(WcOpcode::Recv as c_uint);
                (&raw mut (*w).byte_len).write(64);
            }
        }
        n
    }

    /// As mlx5 when the third completion names no QP it knows: writes two completions
    /// (wr_id 1, 2), the third's `qp_num` but no status, and returns -2, then on the next
    /// call one completion (wr_id 4), as the failing one was consumed.
    unsafe extern "C" fn fails_on_the_third(
        _cq: *mut sys::ibv_cq,
        n: c_int,
        wc: *mut sys::ibv_wc,
    ) -> c_int {
        static CALLS: AtomicI32 = AtomicI32::new(0);
        let write = |i: usize, wr_id: u64| {
            // SAFETY: the poll loop passes room for `n` entries; `i < n` below.
            unsafe {
                let w = wc.add(i);
                (&raw mut (*w).wr_id).write(wr_id);
                (&raw mut (*w).status).write(WcStatus::Success as c_uint);
                (&raw mut (*w).opcode).write(WcOpcode::RdmaWrite as c_uint);
                (&raw mut (*w).qp_num).write(7);
            }
        };
        assert!(n >= 3);
        if CALLS.fetch_add(1, Ordering::Relaxed) == 0 {
            write(0, 1);
            write(1, 2);
            // SAFETY: as above.
            unsafe { (&raw mut (*wc.add(2)).qp_num).write(0x99) };
            -2
        } else {
            write(0, 4);
            1
        }
    }

    /// Writes `n` RDMA READ completions of 4096 bytes with a value in every field, those a
    /// successful READ does not define included (a provider that copies whole entries, as
    /// rxe does, may leave any there).
    unsafe extern "C" fn reads(_cq: *mut sys::ibv_cq, n: c_int, wc: *mut sys::ibv_wc) -> c_int {
        for i in 0..n as usize {
            // SAFETY: the poll loop passes room for `n` entries.
            unsafe {
                wc.add(i).write(sys::ibv_wc {
                    wr_id: i as u64,
                    status: WcStatus::Success as c_uint,
                    opcode: WcOpcode::RdmaRead as c_uint,
                    vendor_err: 0x55,
                    byte_len: 4096,
                    imm_data: 0xabab_abab,
                    qp_num: 7,
                    src_qp: 0xabab,
                    wc_flags: sys::IBV_WC_WITH_IMM,
                    pkey_index: 0xabab,
                    slid: 0xabab,
                    sl: 0xab,
                    dlid_path_bits: 0xab,
                })
            };
        }
        n
    }

    /// Fills the stack below the caller with a pattern, where a later call's buffer lies.
    #[inline(never)]
    fn smear_stack() {
        let mut junk = [0xabu8; 16 << 10];
        std::hint::black_box(&mut junk);
    }

    fn poll_with(poll: sys::PollCq, n: usize) -> Vec<WorkCompletion> {
        let mut out = vec![WorkCompletion::new(0, WcStatus::GeneralErr, 0); n];
        smear_stack();
        // SAFETY: the fake `poll` functions write at most the entries asked for and ignore
        // the CQ.
        let k = unsafe { poll_chunks(poll, std::ptr::null_mut(), &AtomicI32::new(0), &mut out) }
            .unwrap();
        out.truncate(k);
        out
    }

    /// As mlx5 when the third completion is an error completion of a QP it does not know:
    /// its status and `qp_num` are written, not its `wr_id`.
    unsafe extern "C" fn fails_on_an_error_completion(
        _cq: *mut sys::ibv_cq,
        n: c_int,
        wc: *mut sys::ibv_wc,
    ) -> c_int {
        assert!(n >= 3);
        for i in 0..3 {
            // SAFETY: the poll loop passes room for `n` entries; `i < 3 <= n`.
            unsafe {
                let w = wc.add(i);
                if i < 2 {
                    (&raw mut (*w).wr_id).write(i as u64 + 1);
                }
                let status = if i < 2 {
                    WcStatus::Success
                } else {
                    WcStatus::WrFlushErr
                };
                (&raw mut (*w).status).write(status as c_uint);
                (&raw mut (*w).qp_num).write(if i < 2 { 7 } else { 0x99 });
            }
        }
        -2
    }

    #[test]
    fn a_failed_error_completion_is_not_handed_over() {
        let failed = AtomicI32::new(0);
        let mut out = vec![WorkCompletion::new(0, WcStatus::GeneralErr, 0); 8];
        // SAFETY: the fake writes at most the entries asked for and ignores the CQ.
        let n = unsafe {
            poll_chunks(
                fails_on_an_error_completion,
                std::ptr::null_mut(),
                &failed,
                &mut out,
            )
        }
        .unwrap();
        assert_eq!(
            out[..n]
                .iter()
                .map(|w| (w.wr_id, w.qp_num))
                .collect::<Vec<_>>(),
            [(1, 7), (2, 7)]
        );
        assert_eq!(
            failed.load(Ordering::Relaxed),
            -2,
            "reported with the next poll"
        );
    }

    /// mlx5 consumes the completions before one it cannot parse, and that one, and returns
    /// -2: the completions it wrote are handed over, the failure comes with the next call,
    /// and the call after goes on behind the one that failed.
    #[test]
    fn completions_before_a_failed_one_in_the_same_call_are_kept() {
        let failed = AtomicI32::new(0);
        let mut out = vec![WorkCompletion::new(0, WcStatus::GeneralErr, 0); 8];
        let mut poll = || {
            // SAFETY: the fake writes at most the entries asked for and ignores the CQ.
            unsafe { poll_chunks(fails_on_the_third, std::ptr::null_mut(), &failed, &mut out) }
        };
        assert_eq!(poll().unwrap(), 2);
        assert!(poll().is_err(), "the failure is reported once");
        assert_eq!(poll().unwrap(), 1);
        assert_eq!(out[0].wr_id, 4);
    }

    #[test]
    fn fields_a_provider_leaves_unwritten_read_as_zero() {
        // 40 completions: a chunk of 32 and one of 8 (wr_ids from 1000 again), on a stack
        // full of a pattern.
        let wcs = poll_with(writes_some_fields, 40);
        assert_eq!(wcs.len(), 40);
        for (i, wc) in wcs.iter().enumerate() {
            assert_eq!(
                *wc,
                WorkCompletion {
                    opcode: Some(WcOpcode::Recv),
                    byte_len: 64,
                    ..WorkCompletion::new(1000 + (i % 32) as u64, WcStatus::Success, 0)
                },
                "completion {i}"
            );
        }
    }

    #[test]
    fn only_the_fields_a_completion_defines_are_reported() {
        // A READ defines its length; a send completion never carries immediate data, and
        // a success no vendor syndrome.
        let wcs = poll_with(reads, 3);
        assert_eq!(
            wcs[2],
            WorkCompletion {
                opcode: Some(WcOpcode::RdmaRead),
                byte_len: 4096,
                ..WorkCompletion::new(2, WcStatus::Success, 7)
            }
        );
        let recv = sys::ibv_wc {
            wr_id: 9,
            opcode: WcOpcode::RecvRdmaWithImm as c_uint,
            byte_len: 64,
            imm_data: 0xfeed_u32.to_be(),
            qp_num: 7,
            wc_flags: sys::IBV_WC_WITH_IMM,
            vendor_err: 0x55,
            ..Default::default()
        };
        assert_eq!(
            decode(&recv),
            WorkCompletion {
                opcode: Some(WcOpcode::RecvRdmaWithImm),
                byte_len: 64,
                imm_data: Some(0xfeed),
                ..WorkCompletion::new(9, WcStatus::Success, 7)
            }
        );
        // An error completion: no opcode, no length, its syndrome.
        let failed = sys::ibv_wc {
            status: WcStatus::RemAccessErr as c_uint,
            ..recv
        };
        assert_eq!(
            decode(&failed),
            WorkCompletion {
                vendor_err: 0x55,
                ..WorkCompletion::new(9, WcStatus::RemAccessErr, 7)
            }
        );
    }

    #[test]
    fn mlx5_without_locks_is_refused() {
        let v = |s: &str| Some(std::ffi::OsString::from(s));
        let e = locks_kept(v("1").as_deref()).unwrap_err().to_string();
        assert!(e.contains("MLX5_SINGLE_THREADED=1"), "{e}");
        for ok in [None, v("0"), v("")] {
            assert!(locks_kept(ok.as_deref()).is_ok());
        }
    }
}

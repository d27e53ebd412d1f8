//! The device: libibverbs loaded once per process, the device list, [`VerbsDevice`] opened
//! on a port (its limits, GID, MTU and driver), and the decoding of its asynchronous
//! events.

use std::collections::VecDeque;
use std::ffi::{CStr, c_int, c_void};
use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

pub use selsig::PostApi;
use selsig::{AsyncEvent, ProviderError};

use crate::error::{no_device_list, os, report};
use crate::sys::{self, Verbs};

/// libibverbs, loaded once per process.
pub(crate) fn verbs() -> Result<&'static Verbs, ProviderError> {
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
pub(crate) struct Context {
    pub(crate) v: &'static Verbs,
    pub(crate) ctx: NonNull<sys::ibv_context>,
    pub(crate) name: String,
    /// Opened here, and closed on `Drop`; else the program's ([`VerbsDevice::from_raw`]).
    pub(crate) owned: bool,
    /// The asynchronous events read and not yet handed out (at most [`MAX_EVENTS`]).
    pub(crate) events: Mutex<VecDeque<AsyncEvent>>,
    /// `IBV_EVENT_DEVICE_FATAL` was read: the device is lost.
    pub(crate) lost: AtomicBool,
}

/// The most asynchronous events a context keeps unread; beyond, the oldest non-fatal one
/// goes (a peer can make a QP raise events; it must not make them fill memory).
const MAX_EVENTS: usize = 1024;

impl Context {
    /// Reads the asynchronous events pending on the context's (non-blocking) descriptor
    /// into `events`, noting a fatal error. Nothing on a program's own context: its events
    /// are the program's to read.
    pub(crate) fn read_async_events(&self) {
        if !self.owned {
            return;
        }
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            // SAFETY: `ev` is filled by `get_async_event` (non-blocking: the fd was set
            // O_NONBLOCK at open), decoded, then acknowledged as the API requires. The QP
            // or CQ it points to is alive until then: destroying one waits for the
            // acknowledgement of its events (`events_completed` in
            // `ibv_cmd_destroy_qp`/`_cq`).
            let event = unsafe {
                let mut ev = sys::ibv_async_event {
                    element: std::ptr::null_mut(),
                    event_type: 0,
                };
                if (self.v.fns.get_async_event)(self.ctx.as_ptr(), &mut ev) != 0 {
                    return;
                }
                let event = decode_event(&ev);
                (self.v.fns.ack_async_event)(&mut ev);
                event
            };
            if event == AsyncEvent::DeviceFatal {
                self.lost.store(true, Ordering::Release);
            }
            keep(&mut events, event, MAX_EVENTS);
        }
    }

    /// Whether the device was lost (reading the pending events first).
    pub(crate) fn lost(&self) -> bool {
        if !self.lost.load(Ordering::Acquire) {
            self.read_async_events();
        }
        self.lost.load(Ordering::Acquire)
    }
}

// SAFETY: libibverbs contexts may be used from any thread (the library locks internally);
// the pointer is owned by this struct until `Drop` closes it.
unsafe impl Send for Context {}
// SAFETY: as above: every verb called through a shared `Context` is thread-safe.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
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
    pub(crate) ctx: Arc<Context>,
    /// The device's limits (`ibv_query_device`), when it reports them.
    pub(crate) limits: Option<Limits>,
    pub(crate) port: u8,
    pub(crate) gid_index: Option<u8>,
    pub(crate) gid: [u8; 16],
    pub(crate) lid: u16,
    pub(crate) active_mtu: u32,
    pub(crate) ethernet: bool,
    /// Destroying a QP removes its unpolled completions from its CQs (mlx4, mlx5).
    pub(crate) cleans_cq: bool,
    /// The kernel driver is mlx5's (`mlx5_core`): libmlx5 sizes its queues.
    pub(crate) mlx5: bool,
    /// The kernel's Soft-RoCE (rxe).
    rxe: bool,
    /// A software device (rxe), whose kernel flushes a receive queue only when the QP moves
    /// to the error state or a packet comes: a receive posted once the QP is in the error
    /// state would never complete.
    pub(crate) software: bool,
    /// How its queue pairs post sends.
    pub(crate) post_api: PostApi,
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
pub(crate) struct Limits {
    pub(crate) max_qp_wr: u32,
    pub(crate) max_sge: u32,
    pub(crate) max_cqe: u32,
    pub(crate) max_mr_size: u64,
    /// RDMA READs and atomics a QP serves at once as the responder.
    pub(crate) max_qp_rd_atom: u32,
    /// RDMA READs and atomics a QP keeps in flight as the requester.
    pub(crate) max_qp_init_rd_atom: u32,
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

pub(crate) fn mtu_bytes(mtu: u32) -> u32 {
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
pub(crate) fn mtu_enum(bytes: u32) -> u32 {
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
    pub(crate) fn own(&self, what: &'static str, ctx: &Arc<Context>) -> Result<(), ProviderError> {
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
        let ctx = Arc::new(Context {
            v,
            ctx,
            name,
            owned: true,
            events: Mutex::new(VecDeque::new()),
            lost: AtomicBool::new(false),
        });
        Self::describe(ctx, options)
    }

    /// A device of a context the program opened itself (`ibv_open_device`), for
    /// [`VerbsCq::from_raw`](crate::VerbsCq::from_raw) and
    /// [`VerbsQp::from_raw`](crate::VerbsQp::from_raw): its port is checked as
    /// [`open`](Self::open) checks it (`options.device` is not read). The context stays the
    /// program's: it is not closed, and its asynchronous events are the program's to read
    /// ([`poll_async_event`](selsig::Device::poll_async_event) finds none).
    ///
    /// # Safety
    ///
    /// `ctx` is an open device context of the libibverbs this process loaded, and it stays
    /// open until the device and everything made or wrapped with it are dropped.
    pub unsafe fn from_raw(
        ctx: *mut sys::ibv_context,
        options: &VerbsOptions,
    ) -> Result<VerbsDevice, ProviderError> {
        locks_kept(std::env::var_os(SINGLE_THREADED).as_deref())?;
        let v = verbs()?;
        let ctx = NonNull::new(ctx).ok_or(ProviderError::Invalid {
            what: "device context",
            why: "it is NULL".to_string(),
        })?;
        // SAFETY: an open context (the caller's contract), whose `device` is its device.
        let name = unsafe {
            let p = (v.fns.get_device_name)((*ctx.as_ptr()).device);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        let ctx = Arc::new(Context {
            v,
            ctx,
            name,
            owned: false,
            events: Mutex::new(VecDeque::new()),
            lost: AtomicBool::new(false),
        });
        Self::describe(ctx, options)
    }

    /// The device of an open context: its limits, its port (which must be active) and the
    /// GID in use.
    fn describe(ctx: Arc<Context>, options: &VerbsOptions) -> Result<VerbsDevice, ProviderError> {
        let v = ctx.v;
        let port = options.port.unwrap_or(1);
        // Asynchronous events are read without blocking (a program's own context is left
        // as it is: its events are the program's).
        if ctx.owned {
            // SAFETY: `async_fd` is the context's event file descriptor, open while it is.
            let fd = unsafe { (*ctx.ctx.as_ptr()).async_fd };
            set_nonblocking(fd).map_err(|source| ProviderError::Os {
                verb: "fcntl(async_fd, O_NONBLOCK)",
                source,
            })?;
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
        let mlx5 = driver.as_deref() == Some("mlx5_core");
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
            mlx5,
            rxe,
            software,
            post_api: PostApi::Legacy,
        })
    }

    /// This device handle with its queue pairs posting through `api`: the QPs it creates
    /// from now on, and those of the program it wraps ([`VerbsQp::from_raw`], which must
    /// then have been made with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`). Other clones of the
    /// handle keep theirs. [`PostApi::Extended`] is refused, with the reason, where the
    /// device's provider has no `ibv_create_qp_ex` or libibverbs no `ibv_qp_to_qp_ex`
    /// (before rdma-core 24).
    ///
    /// [`VerbsQp::from_raw`]: crate::VerbsQp::from_raw
    pub fn with_post_api(mut self, api: PostApi) -> Result<VerbsDevice, ProviderError> {
        if api == PostApi::Extended {
            if self.v().fns.qp_to_qp_ex.is_none() {
                return Err(ProviderError::Unavailable(format!(
                    "the extended post API needs ibv_qp_to_qp_ex, which {} lacks \
                     (rdma-core 24 or later has it)",
                    sys::LIBRARY
                )));
            }
            if self.create_qp_ex().is_none() {
                return Err(ProviderError::Unavailable(format!(
                    "{}'s provider has no ibv_create_qp_ex: the extended post API is not \
                     available on it (use the legacy one)",
                    self.ctx.name
                )));
            }
        }
        self.post_api = api;
        Ok(self)
    }

    /// How this handle's queue pairs post sends.
    pub fn post_api(&self) -> PostApi {
        self.post_api
    }

    /// The provider's `create_qp_ex` ([`sys::create_qp_ex_op`]).
    pub(crate) fn create_qp_ex(&self) -> Option<sys::CreateQpEx> {
        // SAFETY: the context is open while this handle lives.
        unsafe { sys::create_qp_ex_op(self.ctx.ctx.as_ptr()) }
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

    pub(crate) fn v(&self) -> &'static Verbs {
        self.ctx.v
    }
}

/// Makes the open descriptor `fd` non-blocking (`O_NONBLOCK`), its other flags kept.
pub(crate) fn set_nonblocking(fd: c_int) -> io::Result<()> {
    // SAFETY: fcntl reading and setting the flags of a descriptor: no memory is passed,
    // and a descriptor that is not open fails with EBADF.
    let set = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0
            && (flags & libc::O_NONBLOCK != 0
                || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) >= 0)
    };
    if set {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Appends `event` to `events`, which keeps at most `max`: beyond, the oldest event that is
/// not `DeviceFatal` goes.
fn keep(events: &mut VecDeque<AsyncEvent>, event: AsyncEvent, max: usize) {
    if events.len() >= max
        && let Some(i) = events.iter().position(|e| *e != AsyncEvent::DeviceFatal)
    {
        events.remove(i);
    }
    events.push_back(event);
}

/// The event `ev` describes.
///
/// # Safety
///
/// `ev.element` points to a live `ibv_cq` for `IBV_EVENT_CQ_ERR` and to a live `ibv_qp`
/// for the QP events, as `ibv_get_async_event` fills it until the event is acknowledged.
pub(crate) unsafe fn decode_event(ev: &sys::ibv_async_event) -> AsyncEvent {
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
        sys::IBV_EVENT_DEVICE_FATAL => AsyncEvent::DeviceFatal,
        other => AsyncEvent::Other { event_type: other },
    }
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

    /// Unread events are bounded: the oldest goes first, a fatal error's never.
    #[test]
    fn unread_events_are_bounded_and_the_fatal_one_stays() {
        let mut events = VecDeque::new();
        keep(&mut events, AsyncEvent::PortErr { port: 1 }, 3);
        keep(&mut events, AsyncEvent::DeviceFatal, 3);
        for qp_num in 1..=3 {
            keep(&mut events, AsyncEvent::QpFatal { qp_num }, 3);
        }
        assert_eq!(
            Vec::from(events),
            [
                AsyncEvent::DeviceFatal,
                AsyncEvent::QpFatal { qp_num: 2 },
                AsyncEvent::QpFatal { qp_num: 3 },
            ]
        );
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
                sys::IBV_EVENT_DEVICE_FATAL,
                std::ptr::without_provenance_mut(0),
                AsyncEvent::DeviceFatal,
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
    fn a_descriptor_is_made_non_blocking_with_its_other_flags_kept() {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors `pipe2` writes.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fcntl on the open descriptor, reading its flags.
        let flags = |fd| unsafe { libc::fcntl(fd, libc::F_GETFL) };
        let before = flags(fds[0]);
        assert_eq!(before & libc::O_NONBLOCK, 0);
        set_nonblocking(fds[0]).unwrap();
        assert_eq!(flags(fds[0]), before | libc::O_NONBLOCK);
        set_nonblocking(fds[0]).unwrap(); // already: nothing to do
        // SAFETY: the descriptors are open and this test's own.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        // (Not the closed number: another test's thread may open one that gets it.)
        let e = set_nonblocking(-1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
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

    /// The post API reads and prints as a `--post-api` option would take it; legacy by
    /// default.
    #[test]
    fn the_post_api_is_named_legacy_or_extended() {
        assert_eq!(PostApi::default(), PostApi::Legacy);
        for api in [PostApi::Legacy, PostApi::Extended] {
            assert_eq!(api.to_string().parse::<PostApi>(), Ok(api));
        }
        let e = "ex".parse::<PostApi>().unwrap_err();
        assert!(e.contains("legacy") && e.contains("extended"), "{e}");
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

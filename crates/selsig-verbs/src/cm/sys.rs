//! The few librdmacm types and functions selsig uses, written by hand from rdma-core's
//! `<rdma/rdma_cma.h>` and loaded at run time, as libibverbs is ([`crate::sys`]).
//!
//! Only the leading fields selsig reads are spelled out; the structs are always allocated
//! by librdmacm and read through its pointers, so their ends may stay undeclared.
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_void};

use libloading::Library;

use crate::sys::{ibv_context, ibv_qp, ibv_qp_attr};

/// `struct rdma_event_channel`: the descriptor the connection events are read from.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_cm_id`: its first fields (`verbs` is the device context librdmacm opened
/// for the id once its address is bound or resolved; `qp` stays NULL here: selsig
/// creates its queue pairs itself).
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    /// Ignored when accepting.
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// This and `qp_num`: read because the id has no QP of librdmacm's.
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_cm_event`: the connection parameters of `param` (the union's other
/// members, for UD and multicast, are never read).
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    /// `enum rdma_cm_event_type`.
    pub event: c_int,
    pub status: c_int,
    pub conn: rdma_conn_param,
}

/// `enum rdma_port_space`: `RDMA_PS_TCP`, reliable connections.
pub const RDMA_PS_TCP: c_int = 0x0106;

/// `RDMA_MAX_RESP_RES` and `RDMA_MAX_INIT_DEPTH`: "as many as the device allows".
pub const RDMA_MAX_RESP_RES: u8 = 0xff;
pub const RDMA_MAX_INIT_DEPTH: u8 = 0xff;

// `enum rdma_cm_event_type`.
pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_int = 0;
pub const RDMA_CM_EVENT_ADDR_ERROR: c_int = 1;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_int = 2;
pub const RDMA_CM_EVENT_ROUTE_ERROR: c_int = 3;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_int = 4;
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: c_int = 5;
pub const RDMA_CM_EVENT_CONNECT_ERROR: c_int = 6;
pub const RDMA_CM_EVENT_UNREACHABLE: c_int = 7;
pub const RDMA_CM_EVENT_REJECTED: c_int = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: c_int = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_int = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_int = 11;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_int = 15;

/// The exported functions selsig calls, resolved from `librdmacm.so.1`. All return 0, or
/// -1 with `errno` set, but for those noted.
pub struct Fns {
    pub create_event_channel: unsafe extern "C" fn() -> *mut rdma_event_channel,
    pub destroy_event_channel: unsafe extern "C" fn(channel: *mut rdma_event_channel),
    pub create_id: unsafe extern "C" fn(
        channel: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut c_void,
        ps: c_int,
    ) -> c_int,
    pub destroy_id: unsafe extern "C" fn(id: *mut rdma_cm_id) -> c_int,
    pub bind_addr: unsafe extern "C" fn(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int,
    pub listen: unsafe extern "C" fn(id: *mut rdma_cm_id, backlog: c_int) -> c_int,
    pub resolve_addr: unsafe extern "C" fn(
        id: *mut rdma_cm_id,
        src: *mut libc::sockaddr,
        dst: *mut libc::sockaddr,
        timeout_ms: c_int,
    ) -> c_int,
    pub resolve_route: unsafe extern "C" fn(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int,
    pub connect: unsafe extern "C" fn(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int,
    pub accept: unsafe extern "C" fn(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int,
    pub reject:
        unsafe extern "C" fn(id: *mut rdma_cm_id, private_data: *const c_void, len: u8) -> c_int,
    pub disconnect: unsafe extern "C" fn(id: *mut rdma_cm_id) -> c_int,
    pub get_cm_event: unsafe extern "C" fn(
        channel: *mut rdma_event_channel,
        event: *mut *mut rdma_cm_event,
    ) -> c_int,
    pub ack_cm_event: unsafe extern "C" fn(event: *mut rdma_cm_event) -> c_int,
    pub init_qp_attr: unsafe extern "C" fn(
        id: *mut rdma_cm_id,
        attr: *mut ibv_qp_attr,
        mask: *mut c_int,
    ) -> c_int,
    /// The port in network byte order (0 for an id with no address).
    pub get_src_port: unsafe extern "C" fn(id: *mut rdma_cm_id) -> u16,
    /// A static string, never NULL.
    pub event_str: unsafe extern "C" fn(event: c_int) -> *const c_char,
    /// `rdma_establish` (rdma-core 28): completes an active connection whose QP is not
    /// librdmacm's (sends the RTU). `None` in an older librdmacm.
    pub establish: Option<unsafe extern "C" fn(id: *mut rdma_cm_id) -> c_int>,
}

/// The library and its functions; the functions are valid while the library is loaded.
pub struct Cm {
    pub fns: Fns,
    _lib: Library,
}

/// The library file rdma-core installs.
pub const LIBRARY: &str = "librdmacm.so.1";

impl Cm {
    /// Loads librdmacm and resolves every function selsig calls.
    pub fn load() -> Result<Cm, String> {
        // SAFETY: loading librdmacm runs its initializers, which set up nothing but
        // library state (the devices are opened by its first call).
        let lib = unsafe { Library::new(LIBRARY) }.map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is the librdmacm function of this name, whose C
                // signature the field's type spells out; the pointer stays valid while
                // `lib` is loaded, and `Cm` keeps `lib` with the pointers.
                unsafe {
                    *lib.get(concat!($name, "\0").as_bytes())
                        .map_err(|e| format!("librdmacm has no {}: {e}", $name))?
                }
            };
        }
        let fns = Fns {
            create_event_channel: sym!("rdma_create_event_channel"),
            destroy_event_channel: sym!("rdma_destroy_event_channel"),
            create_id: sym!("rdma_create_id"),
            destroy_id: sym!("rdma_destroy_id"),
            bind_addr: sym!("rdma_bind_addr"),
            listen: sym!("rdma_listen"),
            resolve_addr: sym!("rdma_resolve_addr"),
            resolve_route: sym!("rdma_resolve_route"),
            connect: sym!("rdma_connect"),
            accept: sym!("rdma_accept"),
            reject: sym!("rdma_reject"),
            disconnect: sym!("rdma_disconnect"),
            get_cm_event: sym!("rdma_get_cm_event"),
            ack_cm_event: sym!("rdma_ack_cm_event"),
            init_qp_attr: sym!("rdma_init_qp_attr"),
            get_src_port: sym!("rdma_get_src_port"),
            event_str: sym!("rdma_event_str"),
            // SAFETY: as in `sym!`; an older library leaves it out.
            establish: unsafe { lib.get(b"rdma_establish\0").ok().map(|f| *f) },
        };
        Ok(Cm { fns, _lib: lib })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The offsets of `<rdma/rdma_cma.h>` (rdma-core 44 to 57, x86_64 and every LP64
    /// target): what librdmacm writes where selsig reads it.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn layouts_match_rdma_cma_h() {
        assert_eq!(offset_of!(rdma_cm_id, verbs), 0);
        assert_eq!(offset_of!(rdma_cm_id, qp), 3 * size_of::<usize>());
        assert_eq!(offset_of!(rdma_conn_param, private_data_len), 8);
        assert_eq!(offset_of!(rdma_conn_param, srq), 14);
        assert_eq!(offset_of!(rdma_conn_param, qp_num), 16);
        assert_eq!(size_of::<rdma_conn_param>(), 24);
        assert_eq!(offset_of!(rdma_cm_event, event), 16);
        assert_eq!(offset_of!(rdma_cm_event, status), 20);
        assert_eq!(offset_of!(rdma_cm_event, conn), 24);
    }
}

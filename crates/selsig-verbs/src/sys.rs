//! The few libibverbs types and functions selsig uses, written by hand from
//! `<infiniband/verbs.h>` (rdma-core) and loaded at run time. Their layouts are checked
//! against the system header by the crate's tests (`layout.c`).
//!
//! Only what selsig touches is spelled out; the rest of a struct is opaque padding of the
//! right size. Nothing here is safe to use directly: the wrappers in the crate root are.
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use libloading::Library;

/// `struct ibv_device`: opaque.
#[repr(C)]
pub struct ibv_device {
    _opaque: [u8; 0],
}

/// `struct ibv_srq`: opaque.
#[repr(C)]
pub struct ibv_opaque {
    _opaque: [u8; 0],
}

/// `struct ibv_comp_channel`: a completion event channel (`ibv_create_comp_channel`).
/// `refcnt` counts the CQs made with it (libibverbs keeps it under the context's mutex:
/// never touch it).
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    /// The descriptor `ibv_get_cq_event` reads, readable while an event is pending.
    pub fd: c_int,
    pub refcnt: c_int,
}

pub type PollCq =
    unsafe extern "C" fn(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int;
pub type PostSend = unsafe extern "C" fn(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int;
pub type PostRecv = unsafe extern "C" fn(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int;

/// `struct ibv_context_ops`: the provider's function table, through which the
/// `static inline` verbs (`ibv_post_send`, `ibv_poll_cq`, ...) call.
#[repr(C)]
pub struct ibv_context_ops {
    /// `_compat_query_device` … `_compat_create_cq` (`alloc_mw`, `bind_mw` and `dealloc_mw`
    /// among them).
    pub _before_poll_cq: [*mut c_void; 11],
    pub poll_cq: Option<PollCq>,
    pub req_notify_cq:
        Option<unsafe extern "C" fn(cq: *mut ibv_cq, solicited_only: c_int) -> c_int>,
    /// `_compat_cq_event` … `_compat_destroy_qp`.
    pub _before_post_send: [*mut c_void; 12],
    pub post_send: Option<PostSend>,
    pub post_recv: Option<PostRecv>,
    /// `_compat_create_ah` … `_compat_async_event`.
    pub _after: [*mut c_void; 5],
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_opaque,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_opaque,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `struct ibv_rx_hash_conf` (a member of `ibv_qp_init_attr_ex`, unused: zeroed).
#[repr(C)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`: `ibv_qp_init_attr`'s fields, then what `comp_mask` names.
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_opaque,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_opaque,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut ibv_opaque,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    /// `enum ibv_qp_create_send_ops_flags`.
    pub send_ops_flags: u64,
}

pub type CreateQpEx =
    unsafe extern "C" fn(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;

/// The end of `struct verbs_context`, which libibverbs allocates just before every
/// `struct ibv_context` whose `abi_compat` is `__VERBS_ABI_IS_EXTENDED` (the struct "grows
/// up": new members are added at its start, so its end never moves). The static inline
/// `ibv_create_qp_ex` reaches `create_qp_ex` through it (`verbs_get_ctx_op`): present when
/// `sz`, the size the provider's libibverbs filled, reaches back to it and it is not NULL.
#[repr(C)]
pub struct verbs_context_end {
    pub create_qp_ex: Option<CreateQpEx>,
    pub get_srq_num: *mut c_void,
    pub create_srq_ex: *mut c_void,
    pub open_xrcd: *mut c_void,
    pub close_xrcd: *mut c_void,
    pub _abi_placeholder3: u64,
    /// The size of the provider's `struct verbs_context`, counted from its start up to
    /// the end of `context`.
    pub sz: usize,
    pub context: ibv_context,
}

/// `__VERBS_ABI_IS_EXTENDED`, in `ibv_context.abi_compat`: a `verbs_context` surrounds it.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// The provider's `create_qp_ex` of context `ctx`, found as the static inline
/// `ibv_create_qp_ex` finds it (`verbs_get_ctx_op`): in the `struct verbs_context` around an
/// extended context (`abi_compat`), when the provider's libibverbs filled that far (`sz`
/// reaches back to it) and set it.
///
/// # Safety
///
/// `ctx` is an open device context of the libibverbs this process loaded.
pub unsafe fn create_qp_ex_op(ctx: *mut ibv_context) -> Option<CreateQpEx> {
    // SAFETY: an open context (the caller's contract); `abi_compat` is set when it is made.
    if unsafe { (*ctx).abi_compat } != VERBS_ABI_IS_EXTENDED {
        return None;
    }
    let end_offset = std::mem::offset_of!(verbs_context_end, context);
    let from_end = |offset: usize| size_of::<verbs_context_end>() - offset;
    // SAFETY: an extended context lies at the end of a `struct verbs_context` (libibverbs'
    // `verbs_init_and_alloc_context`), whose last members `verbs_context_end` mirrors
    // (checked against the header): stepping back from the context by its offset there
    // stays in that allocation. `sz` says how much of the struct the provider's libibverbs
    // has; a member beyond it is not read. Members are read by value, through the pointer.
    unsafe {
        let end = ctx.byte_sub(end_offset).cast::<verbs_context_end>();
        if (*end).sz < from_end(std::mem::offset_of!(verbs_context_end, create_qp_ex)) {
            return None;
        }
        (*end).create_qp_ex
    }
}

/// The extended posting API's functions in `struct ibv_qp_ex`, called by the static inline
/// `ibv_wr_*` of `verbs.h`.
pub type WrStart = unsafe extern "C" fn(qp: *mut ibv_qp_ex);
pub type WrComplete = unsafe extern "C" fn(qp: *mut ibv_qp_ex) -> c_int;
pub type WrRdma = unsafe extern "C" fn(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64);
pub type WrRdmaImm =
    unsafe extern "C" fn(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm_data: u32);
pub type WrSend = unsafe extern "C" fn(qp: *mut ibv_qp_ex);
pub type WrSendImm = unsafe extern "C" fn(qp: *mut ibv_qp_ex, imm_data: u32);
pub type WrCmpSwp =
    unsafe extern "C" fn(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, compare: u64, swap: u64);
pub type WrFetchAdd =
    unsafe extern "C" fn(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64);
pub type WrSetSge = unsafe extern "C" fn(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32);
pub type WrSetSgeList =
    unsafe extern "C" fn(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge);
pub type WrSetInlineData =
    unsafe extern "C" fn(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize);

/// `struct ibv_qp_ex`: the QP (first, so the pointers convert), the fields the next work
/// request is built with (`wr_id`, `wr_flags`), and the provider's builders and setters.
/// Those selsig does not call are opaque pointers.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    /// `enum ibv_send_flags`.
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<WrCmpSwp>,
    pub wr_atomic_fetch_add: Option<WrFetchAdd>,
    pub wr_bind_mw: *mut c_void,
    pub wr_local_inv: *mut c_void,
    pub wr_rdma_read: Option<WrRdma>,
    pub wr_rdma_write: Option<WrRdma>,
    /// Its immediate data in network byte order (`__be32`).
    pub wr_rdma_write_imm: Option<WrRdmaImm>,
    pub wr_send: Option<WrSend>,
    /// Its immediate data in network byte order (`__be32`).
    pub wr_send_imm: Option<WrSendImm>,
    pub wr_send_inv: *mut c_void,
    pub wr_send_tso: *mut c_void,
    pub wr_set_ud_addr: *mut c_void,
    pub wr_set_xrc_srqn: *mut c_void,
    pub wr_set_inline_data: Option<WrSetInlineData>,
    pub wr_set_inline_data_list: *mut c_void,
    pub wr_set_sge: Option<WrSetSge>,
    pub wr_set_sge_list: Option<WrSetSgeList>,
    pub wr_start: Option<WrStart>,
    pub wr_complete: Option<WrComplete>,
    pub wr_abort: Option<WrStart>,
    pub wr_atomic_write: *mut c_void,
}

/// `union ibv_gid` (16 bytes, 8-byte aligned by its `__be64` view).
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// The prefix of `struct ibv_port_attr` up to `flags`: what the exported `ibv_query_port`
/// fills (libibverbs' `_compat_ibv_port_attr`). The fields after it (`port_cap_flags2`,
/// and from rdma-core 50 `active_speed_ex`) are never written by that call, and the
/// struct's size changes across versions: the prefix does not.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_uint,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

impl Default for ibv_device_attr {
    fn default() -> Self {
        ibv_device_attr {
            fw_ver: [0; 64],
            node_guid: 0,
            sys_image_guid: 0,
            max_mr_size: 0,
            page_size_cap: 0,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 0,
            max_qp_wr: 0,
            device_cap_flags: 0,
            max_sge: 0,
            max_sge_rd: 0,
            max_cq: 0,
            max_cqe: 0,
            max_mr: 0,
            max_pd: 0,
            max_qp_rd_atom: 0,
            max_ee_rd_atom: 0,
            max_res_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            max_ee_init_rd_atom: 0,
            atomic_cap: 0,
            max_ee: 0,
            max_rdd: 0,
            max_mw: 0,
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            max_mcast_grp: 0,
            max_mcast_qp_attach: 0,
            max_total_mcast_qp_attach: 0,
            max_ah: 0,
            max_fmr: 0,
            max_map_per_fmr: 0,
            max_srq: 0,
            max_srq_wr: 0,
            max_srq_sge: 0,
            max_pkeys: 0,
            local_ca_ack_delay: 0,
            phys_port_cnt: 0,
        }
    }
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The `rdma` member of `ibv_send_wr.wr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_rdma_info {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// The `atomic` member of `ibv_send_wr.wr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_atomic_info {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// The `wr` union of `ibv_send_wr` (its largest member, `atomic`, is 32 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_rdma_info,
    pub atomic: ibv_atomic_info,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// Network byte order.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// The `qp_type` union (`xrc.remote_srqn`).
    pub _qp_type: u32,
    /// The `bind_mw` / `tso` union.
    pub _bind_mw_or_tso: [u64; 6],
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Immediate data (network byte order) or the invalidated rkey.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_async_event`.
#[repr(C)]
pub struct ibv_async_event {
    /// `element`: a CQ, QP, SRQ or WQ pointer, or a port number.
    pub element: *mut c_void,
    pub event_type: c_uint,
}

// enum values
pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_QPS_RESET: c_uint = 0;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPS_ERR: c_uint = 6;
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_CAP: c_int = 1 << 19;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;
pub const IBV_PORT_ACTIVE: c_uint = 4;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
pub const IBV_EVENT_CQ_ERR: c_uint = 0;
pub const IBV_EVENT_QP_FATAL: c_uint = 1;
pub const IBV_EVENT_QP_REQ_ERR: c_uint = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: c_uint = 3;
pub const IBV_EVENT_DEVICE_FATAL: c_uint = 8;
pub const IBV_EVENT_PORT_ACTIVE: c_uint = 9;
pub const IBV_EVENT_PORT_ERR: c_uint = 10;
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
pub const IBV_QP_EX_WITH_RDMA_WRITE: u64 = 1 << 0;
pub const IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
pub const IBV_QP_EX_WITH_SEND: u64 = 1 << 2;
pub const IBV_QP_EX_WITH_SEND_WITH_IMM: u64 = 1 << 3;
pub const IBV_QP_EX_WITH_RDMA_READ: u64 = 1 << 4;
pub const IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
pub const IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;

/// The exported functions selsig calls, resolved from `libibverbs.so.1`.
pub struct Fns {
    pub get_device_list: unsafe extern "C" fn(num: *mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(list: *mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(dev: *mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(dev: *mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(ctx: *mut ibv_context) -> c_int,
    pub query_device:
        unsafe extern "C" fn(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int,
    pub query_port:
        unsafe extern "C" fn(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(
        ctx: *mut ibv_context,
        port: u8,
        index: c_int,
        gid: *mut ibv_gid,
    ) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(ctx: *mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(pd: *mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_int,
    ) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(mr: *mut ibv_mr) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        ctx: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(cq: *mut ibv_cq) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(ctx: *mut ibv_context) -> *mut ibv_comp_channel,
    /// Returns the errno (`EBUSY` while a CQ made with the channel is alive).
    pub destroy_comp_channel: unsafe extern "C" fn(channel: *mut ibv_comp_channel) -> c_int,
    /// One `read()` of the channel's fd: 0 and the CQ of one event, or -1 with `errno`
    /// (`EAGAIN` on a non-blocking fd with no event pending).
    pub get_cq_event: unsafe extern "C" fn(
        channel: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        cq_context: *mut *mut c_void,
    ) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(cq: *mut ibv_cq, nevents: c_uint),
    pub create_qp:
        unsafe extern "C" fn(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub destroy_qp: unsafe extern "C" fn(qp: *mut ibv_qp) -> c_int,
    pub modify_qp:
        unsafe extern "C" fn(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int,
    pub query_qp: unsafe extern "C" fn(
        qp: *mut ibv_qp,
        attr: *mut ibv_qp_attr,
        mask: c_int,
        init: *mut ibv_qp_init_attr,
    ) -> c_int,
    pub get_async_event:
        unsafe extern "C" fn(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int,
    pub ack_async_event: unsafe extern "C" fn(event: *mut ibv_async_event),
    /// `ibv_qp_to_qp_ex` (`IBVERBS_1.6`, rdma-core 24): the QP's `ibv_qp_ex`, NULL for a QP
    /// made without `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`. `None` in an older libibverbs.
    pub qp_to_qp_ex: Option<unsafe extern "C" fn(qp: *mut ibv_qp) -> *mut ibv_qp_ex>,
}

/// The library and its functions; the functions are valid while the library is loaded.
pub struct Verbs {
    pub fns: Fns,
    _lib: Library,
}

/// The library file rdma-core installs.
pub const LIBRARY: &str = "libibverbs.so.1";

impl Verbs {
    /// Loads libibverbs and resolves every function selsig calls.
    pub fn load() -> Result<Verbs, String> {
        // SAFETY: loading libibverbs runs its initializers, which only read configuration
        // (the provider drivers are loaded later, by ibv_get_device_list).
        let lib = unsafe { Library::new(LIBRARY) }.map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is the libibverbs function of this name, whose C
                // signature the field's type spells out; the pointer stays valid while
                // `lib` is loaded, and `Verbs` keeps `lib` with the pointers.
                unsafe {
                    *lib.get(concat!($name, "\0").as_bytes())
                        .map_err(|e| format!("libibverbs has no {}: {e}", $name))?
                }
            };
        }
        let fns = Fns {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            query_device: sym!("ibv_query_device"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            dereg_mr: sym!("ibv_dereg_mr"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            create_comp_channel: sym!("ibv_create_comp_channel"),
            destroy_comp_channel: sym!("ibv_destroy_comp_channel"),
            get_cq_event: sym!("ibv_get_cq_event"),
            ack_cq_events: sym!("ibv_ack_cq_events"),
            create_qp: sym!("ibv_create_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            query_qp: sym!("ibv_query_qp"),
            get_async_event: sym!("ibv_get_async_event"),
            ack_async_event: sym!("ibv_ack_async_event"),
            // SAFETY: as in `sym!`; a library without it leaves the extended API out.
            qp_to_qp_ex: unsafe { lib.get(b"ibv_qp_to_qp_ex\0").ok().map(|f| *f) },
        };
        Ok(Verbs { fns, _lib: lib })
    }
}

/// Compares every declaration above with the system header, through the table
/// `csrc/layout.c` computes with the C compiler.
#[cfg(test)]
mod layout {
    #[cfg(verbs_h)]
    use super::*;
    #[cfg(verbs_h)]
    use std::mem::{align_of, offset_of, size_of};

    #[cfg(verbs_h)]
    #[repr(C)]
    struct Entry {
        name: *const c_char,
        value: usize,
    }

    #[cfg(verbs_h)]
    unsafe extern "C" {
        static selsig_verbs_layout: [Entry; 0];
    }

    /// What Rust computes for the same names.
    #[cfg(verbs_h)]
    fn rust_table() -> Vec<(String, usize)> {
        macro_rules! size {
            ($t:ident) => {
                (
                    concat!("size ", stringify!($t)).to_string(),
                    size_of::<$t>(),
                )
            };
        }
        macro_rules! align {
            ($t:ident) => {
                (
                    concat!("align ", stringify!($t)).to_string(),
                    align_of::<$t>(),
                )
            };
        }
        macro_rules! off {
            ($t:ident, $($f:tt)+) => {
                (concat!("offset ", stringify!($t), ".", stringify!($($f)+)).replace(' ', "").replacen("offset", "offset ", 1), offset_of!($t, $($f)+))
            };
        }
        // The distance from a member of `verbs_context_end` to its end, as from the same
        // member of `struct verbs_context` to its end.
        macro_rules! end_of {
            ($f:ident) => {
                (
                    concat!("end verbs_context.", stringify!($f)).to_string(),
                    size_of::<verbs_context_end>() - offset_of!(verbs_context_end, $f),
                )
            };
        }
        vec![
            size!(ibv_context_ops),
            off!(ibv_context_ops, poll_cq),
            off!(ibv_context_ops, req_notify_cq),
            off!(ibv_context_ops, post_send),
            off!(ibv_context_ops, post_recv),
            size!(ibv_context),
            off!(ibv_context, ops),
            off!(ibv_context, cmd_fd),
            off!(ibv_context, async_fd),
            off!(ibv_context, mutex),
            off!(ibv_context, abi_compat),
            size!(ibv_pd),
            off!(ibv_pd, handle),
            size!(ibv_mr),
            off!(ibv_mr, addr),
            off!(ibv_mr, length),
            off!(ibv_mr, lkey),
            off!(ibv_mr, rkey),
            size!(ibv_comp_channel),
            off!(ibv_comp_channel, fd),
            off!(ibv_comp_channel, refcnt),
            size!(ibv_cq),
            off!(ibv_cq, channel),
            off!(ibv_cq, handle),
            off!(ibv_cq, cqe),
            off!(ibv_cq, mutex),
            off!(ibv_cq, cond),
            off!(ibv_cq, async_events_completed),
            size!(ibv_qp),
            off!(ibv_qp, context),
            off!(ibv_qp, send_cq),
            off!(ibv_qp, qp_num),
            off!(ibv_qp, state),
            off!(ibv_qp, mutex),
            off!(ibv_qp, events_completed),
            size!(ibv_qp_cap),
            off!(ibv_qp_cap, max_inline_data),
            size!(ibv_qp_init_attr),
            off!(ibv_qp_init_attr, cap),
            off!(ibv_qp_init_attr, qp_type),
            off!(ibv_qp_init_attr, sq_sig_all),
            size!(ibv_gid),
            align!(ibv_gid),
            size!(ibv_global_route),
            off!(ibv_global_route, flow_label),
            off!(ibv_global_route, sgid_index),
            off!(ibv_global_route, hop_limit),
            size!(ibv_ah_attr),
            align!(ibv_ah_attr),
            off!(ibv_ah_attr, dlid),
            off!(ibv_ah_attr, is_global),
            off!(ibv_ah_attr, port_num),
            size!(ibv_qp_attr),
            off!(ibv_qp_attr, path_mtu),
            off!(ibv_qp_attr, rq_psn),
            off!(ibv_qp_attr, sq_psn),
            off!(ibv_qp_attr, dest_qp_num),
            off!(ibv_qp_attr, qp_access_flags),
            off!(ibv_qp_attr, cap),
            off!(ibv_qp_attr, ah_attr),
            off!(ibv_qp_attr, alt_ah_attr),
            off!(ibv_qp_attr, pkey_index),
            off!(ibv_qp_attr, max_rd_atomic),
            off!(ibv_qp_attr, max_dest_rd_atomic),
            off!(ibv_qp_attr, min_rnr_timer),
            off!(ibv_qp_attr, port_num),
            off!(ibv_qp_attr, timeout),
            off!(ibv_qp_attr, retry_cnt),
            off!(ibv_qp_attr, rnr_retry),
            off!(ibv_qp_attr, rate_limit),
            size!(ibv_device_attr),
            off!(ibv_device_attr, max_mr_size),
            off!(ibv_device_attr, max_qp_wr),
            off!(ibv_device_attr, max_sge),
            off!(ibv_device_attr, max_cqe),
            off!(ibv_device_attr, atomic_cap),
            off!(ibv_device_attr, max_srq_sge),
            off!(ibv_device_attr, phys_port_cnt),
            off!(ibv_port_attr, active_mtu),
            off!(ibv_port_attr, gid_tbl_len),
            off!(ibv_port_attr, lid),
            off!(ibv_port_attr, link_layer),
            // The prefix ends where `port_cap_flags2` starts.
            (
                "offset ibv_port_attr.port_cap_flags2".into(),
                size_of::<ibv_port_attr>(),
            ),
            size!(ibv_sge),
            off!(ibv_sge, length),
            off!(ibv_sge, lkey),
            size!(ibv_send_wr),
            align!(ibv_send_wr),
            off!(ibv_send_wr, next),
            off!(ibv_send_wr, sg_list),
            off!(ibv_send_wr, num_sge),
            off!(ibv_send_wr, opcode),
            off!(ibv_send_wr, send_flags),
            off!(ibv_send_wr, imm_data),
            off!(ibv_send_wr, wr.rdma.remote_addr),
            off!(ibv_send_wr, wr.rdma.rkey),
            off!(ibv_send_wr, wr.atomic.remote_addr),
            off!(ibv_send_wr, wr.atomic.compare_add),
            off!(ibv_send_wr, wr.atomic.swap),
            off!(ibv_send_wr, wr.atomic.rkey),
            size!(ibv_recv_wr),
            off!(ibv_recv_wr, sg_list),
            off!(ibv_recv_wr, num_sge),
            size!(ibv_wc),
            off!(ibv_wc, status),
            off!(ibv_wc, opcode),
            off!(ibv_wc, vendor_err),
            off!(ibv_wc, byte_len),
            off!(ibv_wc, imm_data),
            off!(ibv_wc, qp_num),
            off!(ibv_wc, wc_flags),
            off!(ibv_wc, dlid_path_bits),
            size!(ibv_async_event),
            off!(ibv_async_event, event_type),
            size!(ibv_rx_hash_conf),
            off!(ibv_rx_hash_conf, rx_hash_key),
            off!(ibv_rx_hash_conf, rx_hash_fields_mask),
            size!(ibv_qp_init_attr_ex),
            off!(ibv_qp_init_attr_ex, cap),
            off!(ibv_qp_init_attr_ex, qp_type),
            off!(ibv_qp_init_attr_ex, sq_sig_all),
            off!(ibv_qp_init_attr_ex, comp_mask),
            off!(ibv_qp_init_attr_ex, pd),
            off!(ibv_qp_init_attr_ex, xrcd),
            off!(ibv_qp_init_attr_ex, create_flags),
            off!(ibv_qp_init_attr_ex, max_tso_header),
            off!(ibv_qp_init_attr_ex, rwq_ind_tbl),
            off!(ibv_qp_init_attr_ex, rx_hash_conf),
            off!(ibv_qp_init_attr_ex, source_qpn),
            off!(ibv_qp_init_attr_ex, send_ops_flags),
            // Counted back from the end of `struct verbs_context`, which is all selsig
            // mirrors of it (`verbs_context_end`).
            end_of!(create_qp_ex),
            end_of!(sz),
            end_of!(context),
            size!(ibv_qp_ex),
            off!(ibv_qp_ex, qp_base),
            off!(ibv_qp_ex, comp_mask),
            off!(ibv_qp_ex, wr_id),
            off!(ibv_qp_ex, wr_flags),
            off!(ibv_qp_ex, wr_atomic_cmp_swp),
            off!(ibv_qp_ex, wr_atomic_fetch_add),
            off!(ibv_qp_ex, wr_rdma_read),
            off!(ibv_qp_ex, wr_rdma_write),
            off!(ibv_qp_ex, wr_rdma_write_imm),
            off!(ibv_qp_ex, wr_send),
            off!(ibv_qp_ex, wr_send_imm),
            off!(ibv_qp_ex, wr_set_inline_data),
            off!(ibv_qp_ex, wr_set_sge),
            off!(ibv_qp_ex, wr_set_sge_list),
            off!(ibv_qp_ex, wr_start),
            off!(ibv_qp_ex, wr_complete),
            off!(ibv_qp_ex, wr_abort),
            off!(ibv_qp_ex, wr_atomic_write),
            (
                "value IBV_QP_INIT_ATTR_PD".into(),
                IBV_QP_INIT_ATTR_PD as usize,
            ),
            (
                "value IBV_QP_INIT_ATTR_SEND_OPS_FLAGS".into(),
                IBV_QP_INIT_ATTR_SEND_OPS_FLAGS as usize,
            ),
            (
                "value IBV_QP_EX_WITH_RDMA_WRITE".into(),
                IBV_QP_EX_WITH_RDMA_WRITE as usize,
            ),
            (
                "value IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM".into(),
                IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM as usize,
            ),
            (
                "value IBV_QP_EX_WITH_SEND".into(),
                IBV_QP_EX_WITH_SEND as usize,
            ),
            (
                "value IBV_QP_EX_WITH_SEND_WITH_IMM".into(),
                IBV_QP_EX_WITH_SEND_WITH_IMM as usize,
            ),
            (
                "value IBV_QP_EX_WITH_RDMA_READ".into(),
                IBV_QP_EX_WITH_RDMA_READ as usize,
            ),
            (
                "value IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP".into(),
                IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP as usize,
            ),
            (
                "value IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD".into(),
                IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD as usize,
            ),
            (
                "value __VERBS_ABI_IS_EXTENDED".into(),
                VERBS_ABI_IS_EXTENDED as usize,
            ),
            ("value IBV_QPT_RC".into(), IBV_QPT_RC as usize),
            ("value IBV_QPS_RTS".into(), IBV_QPS_RTS as usize),
            ("value IBV_QPS_ERR".into(), IBV_QPS_ERR as usize),
            ("value IBV_QP_DEST_QPN".into(), IBV_QP_DEST_QPN as usize),
            ("value IBV_QP_CAP".into(), IBV_QP_CAP as usize),
            (
                "value IBV_QP_MAX_DEST_RD_ATOMIC".into(),
                IBV_QP_MAX_DEST_RD_ATOMIC as usize,
            ),
            ("value IBV_WR_RDMA_READ".into(), IBV_WR_RDMA_READ as usize),
            (
                "value IBV_WR_SEND_WITH_IMM".into(),
                IBV_WR_SEND_WITH_IMM as usize,
            ),
            (
                "value IBV_WR_ATOMIC_CMP_AND_SWP".into(),
                IBV_WR_ATOMIC_CMP_AND_SWP as usize,
            ),
            (
                "value IBV_WR_ATOMIC_FETCH_AND_ADD".into(),
                IBV_WR_ATOMIC_FETCH_AND_ADD as usize,
            ),
            ("value IBV_SEND_SIGNALED".into(), IBV_SEND_SIGNALED as usize),
            ("value IBV_SEND_INLINE".into(), IBV_SEND_INLINE as usize),
            ("value IBV_WC_WITH_IMM".into(), IBV_WC_WITH_IMM as usize),
            ("value IBV_PORT_ACTIVE".into(), IBV_PORT_ACTIVE as usize),
            (
                "value IBV_LINK_LAYER_ETHERNET".into(),
                IBV_LINK_LAYER_ETHERNET as usize,
            ),
            (
                "value IBV_EVENT_QP_ACCESS_ERR".into(),
                IBV_EVENT_QP_ACCESS_ERR as usize,
            ),
            (
                "value IBV_EVENT_PORT_ERR".into(),
                IBV_EVENT_PORT_ERR as usize,
            ),
            (
                "value IBV_EVENT_DEVICE_FATAL".into(),
                IBV_EVENT_DEVICE_FATAL as usize,
            ),
        ]
    }

    #[cfg(verbs_h)]
    fn c_table() -> Vec<(String, usize)> {
        let mut out = Vec::new();
        // SAFETY: `selsig_verbs_layout` is the constant array of `layout.c`, terminated by
        // an entry with a NULL name; the names are NUL-terminated string literals.
        unsafe {
            let mut p = std::ptr::addr_of!(selsig_verbs_layout).cast::<Entry>();
            while !(*p).name.is_null() {
                let name = std::ffi::CStr::from_ptr((*p).name)
                    .to_string_lossy()
                    .into_owned();
                out.push((name, (*p).value));
                p = p.add(1);
            }
        }
        out
    }

    #[test]
    #[cfg_attr(
        not(verbs_h),
        ignore = "<infiniband/verbs.h> was not found when building: install libibverbs-dev"
    )]
    fn declarations_match_the_system_header() {
        #[cfg(verbs_h)]
        {
            let c: std::collections::BTreeMap<String, usize> = c_table().into_iter().collect();
            let rust = rust_table();
            assert_eq!(rust.len(), c.len(), "both tables list the same items");
            let mut wrong = Vec::new();
            for (name, value) in &rust {
                match c.get(name) {
                    Some(v) if v == value => {}
                    Some(v) => wrong.push(format!("{name}: C {v}, Rust {value}")),
                    None => wrong.push(format!("{name}: not in the C table")),
                }
            }
            assert!(
                wrong.is_empty(),
                "layout differences:\n{}",
                wrong.join("\n")
            );
        }
    }
}

/* The layout of the libibverbs structures selsig declares by hand, from the system
 * header: the crate's tests compare it with what Rust computes for its own declarations. */
#include <stddef.h>
#include <infiniband/verbs.h>

struct selsig_layout_entry {
	const char *name;
	size_t value;
};

#define SIZE(t) { "size " #t, sizeof(struct t) }
#define ALIGN(t) { "align " #t, _Alignof(struct t) }
#define OFF(t, f) { "offset " #t "." #f, offsetof(struct t, f) }

const struct selsig_layout_entry selsig_verbs_layout[] = {
	SIZE(ibv_context_ops), OFF(ibv_context_ops, poll_cq), OFF(ibv_context_ops, req_notify_cq),
	OFF(ibv_context_ops, post_send), OFF(ibv_context_ops, post_recv),
	SIZE(ibv_context), OFF(ibv_context, ops), OFF(ibv_context, cmd_fd), OFF(ibv_context, async_fd),
	OFF(ibv_context, mutex), OFF(ibv_context, abi_compat),
	SIZE(ibv_pd), OFF(ibv_pd, handle),
	SIZE(ibv_mr), OFF(ibv_mr, addr), OFF(ibv_mr, length), OFF(ibv_mr, lkey), OFF(ibv_mr, rkey),
	SIZE(ibv_comp_channel), OFF(ibv_comp_channel, fd), OFF(ibv_comp_channel, refcnt),
	SIZE(ibv_cq), OFF(ibv_cq, channel), OFF(ibv_cq, handle), OFF(ibv_cq, cqe), OFF(ibv_cq, mutex), OFF(ibv_cq, cond),
	OFF(ibv_cq, async_events_completed),
	SIZE(ibv_qp), OFF(ibv_qp, context), OFF(ibv_qp, send_cq), OFF(ibv_qp, qp_num), OFF(ibv_qp, state),
	OFF(ibv_qp, mutex), OFF(ibv_qp, events_completed),
	SIZE(ibv_qp_cap), OFF(ibv_qp_cap, max_inline_data),
	SIZE(ibv_qp_init_attr), OFF(ibv_qp_init_attr, cap), OFF(ibv_qp_init_attr, qp_type),
	OFF(ibv_qp_init_attr, sq_sig_all),
	{ "size ibv_gid", sizeof(union ibv_gid) }, { "align ibv_gid", _Alignof(union ibv_gid) },
	SIZE(ibv_global_route), OFF(ibv_global_route, flow_label), OFF(ibv_global_route, sgid_index),
	OFF(ibv_global_route, hop_limit),
	SIZE(ibv_ah_attr), ALIGN(ibv_ah_attr), OFF(ibv_ah_attr, dlid), OFF(ibv_ah_attr, is_global),
	OFF(ibv_ah_attr, port_num),
	SIZE(ibv_qp_attr), OFF(ibv_qp_attr, path_mtu), OFF(ibv_qp_attr, rq_psn), OFF(ibv_qp_attr, sq_psn),
	OFF(ibv_qp_attr, dest_qp_num), OFF(ibv_qp_attr, qp_access_flags), OFF(ibv_qp_attr, cap),
	OFF(ibv_qp_attr, ah_attr), OFF(ibv_qp_attr, alt_ah_attr), OFF(ibv_qp_attr, pkey_index),
	OFF(ibv_qp_attr, max_rd_atomic), OFF(ibv_qp_attr, max_dest_rd_atomic),
	OFF(ibv_qp_attr, min_rnr_timer), OFF(ibv_qp_attr, port_num), OFF(ibv_qp_attr, timeout),
	OFF(ibv_qp_attr, retry_cnt), OFF(ibv_qp_attr, rnr_retry), OFF(ibv_qp_attr, rate_limit),
	SIZE(ibv_device_attr), OFF(ibv_device_attr, max_mr_size), OFF(ibv_device_attr, max_qp_wr),
	OFF(ibv_device_attr, max_sge), OFF(ibv_device_attr, max_cqe), OFF(ibv_device_attr, atomic_cap),
	OFF(ibv_device_attr, max_srq_sge), OFF(ibv_device_attr, phys_port_cnt),
	OFF(ibv_port_attr, active_mtu), OFF(ibv_port_attr, gid_tbl_len),
	OFF(ibv_port_attr, lid), OFF(ibv_port_attr, link_layer), OFF(ibv_port_attr, port_cap_flags2),
	SIZE(ibv_sge), OFF(ibv_sge, length), OFF(ibv_sge, lkey),
	SIZE(ibv_send_wr), ALIGN(ibv_send_wr), OFF(ibv_send_wr, next), OFF(ibv_send_wr, sg_list),
	OFF(ibv_send_wr, num_sge), OFF(ibv_send_wr, opcode), OFF(ibv_send_wr, send_flags),
	OFF(ibv_send_wr, imm_data), OFF(ibv_send_wr, wr.rdma.remote_addr), OFF(ibv_send_wr, wr.rdma.rkey),
	OFF(ibv_send_wr, wr.atomic.remote_addr), OFF(ibv_send_wr, wr.atomic.compare_add),
	OFF(ibv_send_wr, wr.atomic.swap), OFF(ibv_send_wr, wr.atomic.rkey),
	SIZE(ibv_recv_wr), OFF(ibv_recv_wr, sg_list), OFF(ibv_recv_wr, num_sge),
	SIZE(ibv_wc), OFF(ibv_wc, status), OFF(ibv_wc, opcode), OFF(ibv_wc, vendor_err),
	OFF(ibv_wc, byte_len), OFF(ibv_wc, imm_data), OFF(ibv_wc, qp_num), OFF(ibv_wc, wc_flags),
	OFF(ibv_wc, dlid_path_bits),
	SIZE(ibv_async_event), OFF(ibv_async_event, event_type),
	{ "value IBV_QPT_RC", IBV_QPT_RC }, { "value IBV_QPS_RTS", IBV_QPS_RTS },
	{ "value IBV_QPS_ERR", IBV_QPS_ERR }, { "value IBV_QP_DEST_QPN", IBV_QP_DEST_QPN },
	{ "value IBV_QP_CAP", IBV_QP_CAP },
	{ "value IBV_QP_MAX_DEST_RD_ATOMIC", IBV_QP_MAX_DEST_RD_ATOMIC },
	{ "value IBV_WR_RDMA_READ", IBV_WR_RDMA_READ }, { "value IBV_WR_SEND_WITH_IMM", IBV_WR_SEND_WITH_IMM },
	{ "value IBV_WR_ATOMIC_CMP_AND_SWP", IBV_WR_ATOMIC_CMP_AND_SWP },
	{ "value IBV_WR_ATOMIC_FETCH_AND_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD },
	{ "value IBV_SEND_SIGNALED", IBV_SEND_SIGNALED }, { "value IBV_SEND_INLINE", IBV_SEND_INLINE },
	{ "value IBV_WC_WITH_IMM", IBV_WC_WITH_IMM }, { "value IBV_PORT_ACTIVE", IBV_PORT_ACTIVE },
	{ "value IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET },
	{ "value IBV_EVENT_QP_ACCESS_ERR", IBV_EVENT_QP_ACCESS_ERR },
	{ "value IBV_EVENT_PORT_ERR", IBV_EVENT_PORT_ERR },
	{ "value IBV_EVENT_DEVICE_FATAL", IBV_EVENT_DEVICE_FATAL },
	{ 0, 0 },
};

/*
 * The seed of selective signaling with plain libibverbs and libselsig: 8 RDMA WRITEs of
 * 64 bytes on an RC queue pair created with sq_sig_all = 0, every 4th signaled. The CQ
 * gets only CQE4 and CQE8; CQE4 confirms WR1-WR4. With --fail-at K, WR K carries a bad
 * rkey: it fails, every later one is flushed, and each still gets its exact outcome.
 *
 * The program owns its device, PD, MRs, CQs and QPs (two QPs of one device, connected to
 * each other over RoCE); libselsig decides the signal flag and wr_id of each WRITE, takes
 * the completions ibv_poll_cq wrote, and hands each WRITE's cookie (its buffer's index)
 * back in posting order. At the end the target memory is checked against the outcomes.
 *
 *   seed [--device NAME] [--gid-index N] [--fail-at K]     (defaults: the first device, 1)
 *
 * Exit code 0 when every outcome is as the semantics say and the memory matches them.
 * Build: see docs/c.md.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "selsig.h"

enum { WRS = 8, SIZE = 64, DEPTH = 16 };

static void die(const char *what, int err)
{
    fprintf(stderr, "seed: %s: %s\n", what, strerror(err));
    exit(1);
}

static void check(selsig_result rc, const char *call)
{
    if (rc != SELSIG_OK) {
        fprintf(stderr, "seed: %s: %s\n", call, selsig_strerror(rc));
        exit(1);
    }
}

static struct ibv_context *open_device(const char *name)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        fprintf(stderr, "seed: no RDMA device\n");
        exit(1);
    }
    struct ibv_context *ctx = NULL;
    for (int i = 0; i < n && !ctx; i++)
        if (!name || strcmp(ibv_get_device_name(list[i]), name) == 0)
            ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!ctx) {
        fprintf(stderr, "seed: cannot open device %s\n", name ? name : "(first)");
        exit(1);
    }
    return ctx;
}

/* RESET -> INIT -> RTR -> RTS, to `dest` on this same port over RoCE (GID `gid`). */
static void connect_qp(struct ibv_qp *qp, uint32_t dest, const union ibv_gid *gid, int gid_index,
                       enum ibv_mtu mtu)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc)
        die("ibv_modify_qp to INIT", rc);
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = dest;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *gid;
    a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    rc = ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc)
        die("ibv_modify_qp to RTR", rc);
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    rc = ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc)
        die("ibv_modify_qp to RTS", rc);
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    const char *device = NULL;
    int gid_index = 1, fail_at = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--device") == 0)
            device = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--gid-index") == 0)
            gid_index = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--fail-at") == 0)
            fail_at = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: seed [--device NAME] [--gid-index N] [--fail-at K]\n");
            return 2;
        }
    }
    if (fail_at < 0 || fail_at > WRS) {
        fprintf(stderr, "seed: --fail-at %d: expected 1 to %d\n", fail_at, WRS);
        return 2;
    }

    struct ibv_context *ctx = open_device(device);
    struct ibv_port_attr port;
    int rc = ibv_query_port(ctx, 1, &port);
    if (rc)
        die("ibv_query_port", rc);
    union ibv_gid gid;
    rc = ibv_query_gid(ctx, 1, gid_index, &gid);
    if (rc)
        die("ibv_query_gid", rc);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    if (!pd)
        die("ibv_alloc_pd", errno);
    static char src[WRS * SIZE], dst[WRS * SIZE];
    for (int i = 0; i < WRS * SIZE; i++)
        src[i] = (char)(i / SIZE + 1);
    struct ibv_mr *src_mr = ibv_reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *dst_mr =
        ibv_reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!src_mr || !dst_mr)
        die("ibv_reg_mr", errno);
    struct ibv_cq *cq = ibv_create_cq(ctx, DEPTH, NULL, NULL, 0);
    struct ibv_cq *peer_cq = ibv_create_cq(ctx, DEPTH, NULL, NULL, 0);
    if (!cq || !peer_cq)
        die("ibv_create_cq", errno);
    /* The sender's receives (none are posted) report to the peer's CQ: `cq` holds only
     * the sends' completions. */
    struct ibv_qp_init_attr init = {
        .send_cq = cq,
        .recv_cq = peer_cq,
        .cap = {.max_send_wr = DEPTH, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
    };
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    struct ibv_qp_init_attr peer_init = init;
    peer_init.send_cq = peer_cq;
    struct ibv_qp *peer = ibv_create_qp(pd, &peer_init);
    if (!qp || !peer)
        die("ibv_create_qp", errno);
    connect_qp(qp, peer->qp_num, &gid, gid_index, port.active_mtu);
    connect_qp(peer, qp->qp_num, &gid, gid_index, port.active_mtu);

    /* The tracker, with the capacities the device read back. */
    selsig_config config;
    selsig_tracker *tracker = NULL;
    check(selsig_config_init(&config, init.cap.max_send_wr, (uint32_t)cq->cqe), "selsig_config_init");
    config.interval = 4;
    config.flags = SELSIG_CHECK_QP_NUM;
    config.qp_num = qp->qp_num;
    check(selsig_tracker_create(&config, &tracker), "selsig_tracker_create");

    printf("seed: %d RDMA WRITEs of %d B on %s, every 4th signaled, send queue depth %u\n", WRS,
           SIZE, ibv_get_device_name(ctx->device), init.cap.max_send_wr);
    if (fail_at)
        printf("WR%d is posted with a bad remote key.\n", fail_at);

    /* Post: the cookie of a WRITE is its index. */
    uint64_t cookies[WRS];
    selsig_posted posted[WRS];
    struct ibv_sge sge[WRS];
    struct ibv_send_wr wr[WRS];
    size_t n = 0;
    for (int i = 0; i < WRS; i++)
        cookies[i] = (uint64_t)i;
    check(selsig_tracker_post_batch(tracker, cookies, WRS, 0, posted, &n), "selsig_tracker_post_batch");
    printf("Send queue:");
    for (size_t i = 0; i < n; i++) {
        sge[i] = (struct ibv_sge){(uintptr_t)src + i * SIZE, SIZE, src_mr->lkey};
        memset(&wr[i], 0, sizeof wr[i]);
        wr[i].wr_id = posted[i].wr_id;
        wr[i].sg_list = &sge[i];
        wr[i].num_sge = 1;
        wr[i].opcode = IBV_WR_RDMA_WRITE;
        wr[i].send_flags = posted[i].send_flags;
        wr[i].wr.rdma.remote_addr = (uintptr_t)dst + i * SIZE;
        wr[i].wr.rdma.rkey = dst_mr->rkey ^ ((int)i + 1 == fail_at ? 0x5a5a5au : 0);
        wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
        printf(" WR%zu(%s)", i + 1, posted[i].send_flags & IBV_SEND_SIGNALED ? "S" : "U");
    }
    printf("\n");
    struct ibv_send_wr *bad = NULL;
    rc = ibv_post_send(qp, wr, &bad);
    if (rc) {
        /* Nothing from bad_wr on was posted: hand those back, then give up. */
        uint64_t back[WRS];
        check(selsig_tracker_rollback(tracker, bad->wr_id, back, WRS, &n), "selsig_tracker_rollback");
        fprintf(stderr, "seed: %zu WRITEs handed back\n", n);
        die("ibv_post_send", rc);
    }

    /* Poll until every WRITE is retired: each CQE retires everything it covers. */
    int outcome[WRS], status[WRS], retired = 0, ok = 1;
    double start = seconds();
    while (retired < WRS) {
        struct ibv_wc wcs[DEPTH];
        int got = ibv_poll_cq(cq, DEPTH, wcs);
        if (got < 0)
            die("ibv_poll_cq", -got);
        if (got == 0 && seconds() - start > 20) {
            fprintf(stderr, "seed: no completion for 20 s, %d of %d retired\n", retired, WRS);
            return 1;
        }
        for (int k = 0; k < got; k++) {
            uint64_t seq = 0;
            check(selsig_tracker_seq_of(tracker, wcs[k].wr_id, &seq), "selsig_tracker_seq_of");
            size_t handled = 0;
            check(selsig_tracker_handle_wcs(tracker, &wcs[k], 1, &handled), "selsig_tracker_handle_wcs");
            selsig_retired r[WRS];
            check(selsig_tracker_poll_retired(tracker, r, WRS, &n), "selsig_tracker_poll_retired");
            printf("CQE%" PRIu64 ": %s", seq, ibv_wc_status_str(wcs[k].status));
            for (size_t j = 0; j < n; j++) {
                uint64_t i = r[j].cookie;
                outcome[i] = (int)r[j].outcome;
                status[i] = (int)r[j].status;
                printf("%s WR%" PRIu64 " %s", j ? "," : ":", i + 1,
                       r[j].outcome == SELSIG_COMPLETED ? "completed"
                       : r[j].outcome == SELSIG_FAILED  ? "failed"
                                                        : "flushed");
                if ((int)i != retired) {
                    fprintf(stderr, "\nseed: WR%" PRIu64 " retired out of order\n", i + 1);
                    ok = 0;
                }
                retired++;
            }
            printf("\n");
        }
    }

    /* What the semantics say, and what the memory holds. */
    int landed = 0;
    for (int i = 0; i < WRS; i++) {
        int want = !fail_at || i + 1 < fail_at ? SELSIG_COMPLETED
                   : i + 1 == fail_at          ? SELSIG_FAILED
                                               : SELSIG_FLUSHED;
        int want_status = want == SELSIG_COMPLETED ? IBV_WC_SUCCESS
                          : want == SELSIG_FAILED  ? IBV_WC_REM_ACCESS_ERR
                                                   : IBV_WC_WR_FLUSH_ERR;
        if (outcome[i] != want || status[i] != want_status) {
            fprintf(stderr, "seed: WR%d: outcome %d status %s, expected %d %s\n", i + 1, outcome[i],
                    ibv_wc_status_str(status[i]), want, ibv_wc_status_str(want_status));
            ok = 0;
        }
        int same = memcmp(dst + i * SIZE, src + i * SIZE, SIZE) == 0;
        if (want == SELSIG_COMPLETED && !same) {
            fprintf(stderr, "seed: WR%d completed but its bytes did not land\n", i + 1);
            ok = 0;
        }
        if (want != SELSIG_COMPLETED && same) {
            fprintf(stderr, "seed: WR%d did not complete but its bytes landed\n", i + 1);
            ok = 0;
        }
        landed += same;
    }
    selsig_stats s;
    check(selsig_tracker_stats(tracker, &s), "selsig_tracker_stats");
    printf("Remote buffer: %d of %d writes landed.\n", landed, WRS);
    printf("Summary: %" PRIu64 " completed, %" PRIu64 " failed, %" PRIu64 " flushed; %" PRIu64
           " CQEs for %d WRs.\n",
           s.completed, s.failed, s.flushed, s.cqes, WRS);
    if (!fail_at && s.cqes != 2) {
        fprintf(stderr, "seed: %" PRIu64 " CQEs, expected 2 (CQE4 and CQE8)\n", s.cqes);
        ok = 0;
    }

    selsig_tracker_destroy(tracker);
    ibv_destroy_qp(peer);
    ibv_destroy_qp(qp);
    ibv_destroy_cq(peer_cq);
    ibv_destroy_cq(cq);
    ibv_dereg_mr(dst_mr);
    ibv_dereg_mr(src_mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    printf("%s\n", ok ? "verified" : "NOT verified");
    return ok ? 0 : 1;
}

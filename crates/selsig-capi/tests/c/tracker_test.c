/*
 * libselsig from C, with no RDMA device: this program plays the NIC. It posts through the
 * tracker as a libibverbs program would, writes the ibv_wc entries a NIC would write
 * (a CQE only for signaled work requests that succeed; one for every work request after
 * an error, flushed), and checks what comes back. Each check prints what failed and
 * exits 1.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "selsig.h"

static int checks;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        checks++;                                                                        \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);     \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define OK(call) CHECK((call) == SELSIG_OK)

static struct ibv_wc wc_of(uint64_t wr_id, enum ibv_wc_status status, uint32_t qp_num)
{
    struct ibv_wc wc;
    memset(&wc, 0, sizeof wc);
    wc.wr_id = wr_id;
    wc.status = status;
    wc.opcode = IBV_WC_RDMA_WRITE;
    wc.qp_num = qp_num;
    return wc;
}

static selsig_tracker *tracker_of(uint32_t sq, uint32_t cq, uint32_t interval, uint32_t flags)
{
    selsig_config config;
    selsig_tracker *t = NULL;
    OK(selsig_config_init(&config, sq, cq));
    config.interval = interval;
    config.flags = flags;
    config.qp_num = 7;
    OK(selsig_tracker_create(&config, &t));
    CHECK(t != NULL);
    return t;
}

/* The seed: 8 RDMA WRITEs, every 4th signaled: only CQE4 and CQE8; CQE4 confirms 1-4. */
static void seed(void)
{
    selsig_tracker *t = tracker_of(16, 16, 4, 0);
    uint64_t cookies[8];
    selsig_posted posted[8];
    size_t n = 0;
    for (int i = 0; i < 8; i++)
        cookies[i] = 100 + i;
    OK(selsig_tracker_post_batch(t, cookies, 8, 0, posted, &n));
    CHECK(n == 8);
    for (int i = 0; i < 8; i++) {
        CHECK(posted[i].wr_id == (uint64_t)i + 1);
        CHECK(posted[i].send_flags == ((i == 3 || i == 7) ? IBV_SEND_SIGNALED : 0));
    }
    CHECK(SELSIG_IBV_SEND_SIGNALED == IBV_SEND_SIGNALED);

    struct ibv_wc cq[2] = {wc_of(4, IBV_WC_SUCCESS, 7), wc_of(8, IBV_WC_SUCCESS, 7)};
    size_t handled = 0;
    OK(selsig_tracker_handle_wcs(t, cq, 1, &handled));
    CHECK(handled == 1);
    selsig_retired r[8];
    OK(selsig_tracker_poll_retired(t, r, 8, &n));
    CHECK(n == 4);
    for (int i = 0; i < 4; i++) {
        CHECK(r[i].cookie == 100 + (uint64_t)i);
        CHECK(r[i].seq == (uint64_t)i + 1);
        CHECK(r[i].outcome == SELSIG_COMPLETED && r[i].status == IBV_WC_SUCCESS);
        CHECK(r[i].signaled == (i == 3));
    }
    OK(selsig_tracker_handle_wcs(t, cq + 1, 1, &handled));
    OK(selsig_tracker_poll_retired(t, r, 8, &n));
    CHECK(n == 4 && r[0].cookie == 104 && r[3].cookie == 107);
    OK(selsig_tracker_poll_retired(t, r, 8, &n));
    CHECK(n == 0);

    selsig_stats s;
    OK(selsig_tracker_stats(t, &s));
    CHECK(s.posted == 8 && s.signaled == 2 && s.cqes == 2 && s.completed == 8);
    uint32_t outstanding = 99, available = 0;
    OK(selsig_tracker_room(t, &outstanding, &available));
    CHECK(outstanding == 0 && available == 16);
    selsig_tracker_destroy(t);
}

/* WR3 fails with a bad rkey: the NIC writes its error CQE and a flush for every later
 * work request, signaled or not. WR1-2 completed, WR3 failed, WR4-8 flushed. */
static void error_mid(void)
{
    selsig_tracker *t = tracker_of(16, 16, 4, 0);
    selsig_posted p;
    for (uint64_t wr = 1; wr <= 8; wr++)
        OK(selsig_tracker_post(t, wr, 0, &p));
    struct ibv_wc cq[6];
    cq[0] = wc_of(3, IBV_WC_REM_ACCESS_ERR, 7);
    for (int i = 1; i < 6; i++)
        cq[i] = wc_of(3 + (uint64_t)i, IBV_WC_WR_FLUSH_ERR, 7);
    size_t handled = 0;
    OK(selsig_tracker_handle_wcs(t, cq, 6, &handled));
    CHECK(handled == 6);
    selsig_retired r[8];
    size_t n = 0;
    OK(selsig_tracker_poll_retired(t, r, 8, &n));
    CHECK(n == 8);
    for (int i = 0; i < 8; i++) {
        CHECK(r[i].cookie == (uint64_t)i + 1);
        if (i < 2)
            CHECK(r[i].outcome == SELSIG_COMPLETED);
        else if (i == 2)
            CHECK(r[i].outcome == SELSIG_FAILED && r[i].status == IBV_WC_REM_ACCESS_ERR);
        else
            CHECK(r[i].outcome == SELSIG_FLUSHED && r[i].status == IBV_WC_WR_FLUSH_ERR);
    }
    uint32_t state = 0;
    OK(selsig_tracker_state(t, &state));
    CHECK(state == SELSIG_STATE_ERROR);
    /* Posting to a tracker in the error state. */
    CHECK(selsig_tracker_post(t, 9, 0, &p) == SELSIG_ERR_QUEUE_ERROR);
    selsig_tracker_destroy(t);
}

/* Bad input: a documented code each, and nothing changed. */
static void bad_input(void)
{
    selsig_config config;
    selsig_tracker *t = NULL;
    selsig_posted p;
    size_t n = 0;
    CHECK(selsig_config_init(NULL, 4, 4) == SELSIG_ERR_NULL);
    CHECK(selsig_tracker_create(NULL, &t) == SELSIG_ERR_NULL);
    OK(selsig_config_init(&config, 0, 4));
    CHECK(selsig_tracker_create(&config, &t) == SELSIG_ERR_INVALID && t == NULL);
    OK(selsig_config_init(&config, 4, 0));
    CHECK(selsig_tracker_create(&config, &t) == SELSIG_ERR_INVALID);
    OK(selsig_config_init(&config, 4, 4));
    config.interval = 0;
    CHECK(selsig_tracker_create(&config, &t) == SELSIG_ERR_INVALID);
    OK(selsig_config_init(&config, 4, 4));
    config.policy = 42;
    CHECK(selsig_tracker_create(&config, &t) == SELSIG_ERR_INVALID);
    OK(selsig_config_init(&config, 4, 4));
    config.flags = 1u << 20;
    CHECK(selsig_tracker_create(&config, &t) == SELSIG_ERR_INVALID);
    OK(selsig_config_init(&config, 4, 4));
    config.policy = SELSIG_POLICY_ADAPTIVE;
    config.flags = SELSIG_NO_CLOCK;
    CHECK(selsig_tracker_create(&config, &t) == SELSIG_ERR_INVALID);
    CHECK(selsig_tracker_create(&config, NULL) == SELSIG_ERR_NULL);

    /* A null tracker. */
    CHECK(selsig_tracker_post(NULL, 1, 0, &p) == SELSIG_ERR_NULL);
    CHECK(selsig_tracker_handle_wcs(NULL, NULL, 0, &n) == SELSIG_ERR_NULL);
    CHECK(selsig_tracker_poll_retired(NULL, NULL, 0, &n) == SELSIG_ERR_NULL);
    CHECK(selsig_tracker_poll_completed(NULL, NULL, 0, &n) == SELSIG_ERR_NULL);
    selsig_tracker_destroy(NULL);
    selsig_pool_destroy(NULL);

    t = tracker_of(8, 8, 4, SELSIG_CHECK_QP_NUM);
    OK(selsig_tracker_post(t, 1, 0, &p));
    CHECK(selsig_tracker_post(t, 2, 0, NULL) == SELSIG_ERR_NULL);
    CHECK(selsig_tracker_post(t, 2, 0x80, &p) == SELSIG_ERR_INVALID);
    uint64_t cookie = 2;
    CHECK(selsig_tracker_post_batch(t, &cookie, 1, 0, NULL, &n) == SELSIG_ERR_NULL);
    /* A completion for a wr_id never posted, one of another QP, one posted unsignaled. */
    struct ibv_wc wc = wc_of(99, IBV_WC_SUCCESS, 7);
    CHECK(selsig_tracker_handle_wcs(t, &wc, 1, &n) == SELSIG_ERR_UNKNOWN_WR && n == 0);
    wc = wc_of(1, IBV_WC_SUCCESS, 8);
    CHECK(selsig_tracker_handle_wcs(t, &wc, 1, &n) == SELSIG_ERR_WRONG_QP);
    wc = wc_of(1, IBV_WC_SUCCESS, 7);
    CHECK(selsig_tracker_handle_wcs(t, &wc, 1, &n) == SELSIG_ERR_UNSIGNALED);
    CHECK(selsig_tracker_handle_wcs(t, NULL, 1, &n) == SELSIG_ERR_NULL);
    selsig_stats s;
    OK(selsig_tracker_stats(t, &s));
    CHECK(s.rejected_cqes == 3 && s.cqes == 0);
    uint32_t outstanding = 0;
    OK(selsig_tracker_room(t, &outstanding, NULL));
    CHECK(outstanding == 1);
    /* A rollback from a wr_id not outstanding, and into too small an array. */
    CHECK(selsig_tracker_rollback(t, 5, &cookie, 1, &n) == SELSIG_ERR_NOT_OUTSTANDING);
    OK(selsig_tracker_post(t, 2, 0, &p));
    CHECK(selsig_tracker_rollback(t, 1, &cookie, 1, &n) == SELSIG_ERR_BUFFER_TOO_SMALL && n == 2);
    OK(selsig_tracker_room(t, &outstanding, NULL));
    CHECK(outstanding == 2);
    selsig_tracker_destroy(t);

    /* Every code has a message; an unknown one says so. */
    for (int code = 0; code <= SELSIG_ERR_DEVICE_LOST; code++)
        CHECK(strlen(selsig_strerror(code)) > 0 && strcmp(selsig_strerror(code), "unknown result code") != 0);
    CHECK(strcmp(selsig_strerror(-1), "unknown result code") == 0);
    CHECK(strcmp(selsig_strerror(SELSIG_ERR_SQ_FULL), "the send queue is full: poll completions first") == 0);
}

/* A full send queue: the batch registers what fits and says why it stopped; the deadlock
 * rule signals one of every full queue's work requests whatever the policy. */
static void full_queue_and_rollback(void)
{
    selsig_config config;
    selsig_tracker *t = NULL;
    OK(selsig_config_init(&config, 4, 16));
    config.policy = SELSIG_POLICY_NEVER;
    OK(selsig_tracker_create(&config, &t));
    uint64_t cookies[6] = {1, 2, 3, 4, 5, 6};
    selsig_posted p[6];
    size_t n = 0;
    CHECK(selsig_tracker_post_batch(t, cookies, 6, 0, p, &n) == SELSIG_ERR_SQ_FULL);
    CHECK(n == 4);
    CHECK(p[3].send_flags == IBV_SEND_SIGNALED);
    /* ibv_post_send refused the third (bad_wr): the third and fourth come back. */
    uint64_t back[4] = {0};
    OK(selsig_tracker_rollback(t, p[2].wr_id, back, 4, &n));
    CHECK(n == 2 && back[0] == 3 && back[1] == 4);
    uint32_t outstanding = 0;
    OK(selsig_tracker_room(t, &outstanding, NULL));
    CHECK(outstanding == 2);
    /* The unsignaled tail: confirm_all gives the marker's wr_id. */
    int marker = 0;
    uint64_t wr_id = 0;
    OK(selsig_tracker_confirm_all(t, &marker, &wr_id));
    CHECK(marker == 1 && wr_id == 3);
    struct ibv_wc wc = wc_of(wr_id, IBV_WC_SUCCESS, 7);
    OK(selsig_tracker_handle_wcs(t, &wc, 1, &n));
    selsig_retired r[4];
    OK(selsig_tracker_poll_retired(t, r, 4, &n));
    CHECK(n == 2 && r[0].cookie == 1 && r[1].cookie == 2);
    OK(selsig_tracker_confirm_all(t, &marker, &wr_id));
    CHECK(marker == 0);
    selsig_tracker_destroy(t);
}

/* Receives on the same CQ: sends carry bit 63, a receive's completion is not a send. */
static void tagged_sends(void)
{
    selsig_tracker *t = tracker_of(8, 8, 1, SELSIG_TAG_SENDS);
    selsig_posted p;
    OK(selsig_tracker_post(t, 1, 0, &p));
    CHECK(p.wr_id == (SELSIG_WR_ID_TAG | 1));
    struct ibv_wc recv = wc_of(1, IBV_WC_WR_FLUSH_ERR, 7);
    struct ibv_wc send = wc_of(p.wr_id, IBV_WC_SUCCESS, 7);
    int yes = 1;
    OK(selsig_tracker_owns(t, &recv, &yes));
    CHECK(yes == 0);
    OK(selsig_tracker_owns(t, &send, &yes));
    CHECK(yes == 1);
    size_t n = 0;
    CHECK(selsig_tracker_handle_wcs(t, &recv, 1, &n) == SELSIG_ERR_NOT_A_SEND);
    OK(selsig_tracker_handle_wcs(t, &send, 1, &n));
    uint64_t seq = 0;
    OK(selsig_tracker_seq_of(t, p.wr_id, &seq));
    CHECK(seq == 1);
    CHECK(selsig_tracker_seq_of(t, 1, &seq) == SELSIG_ERR_NOT_A_SEND);
    selsig_tracker_destroy(t);
}

/* Two send queues on one CQ share its credits. */
static void shared_pool(void)
{
    selsig_pool *pool = NULL;
    OK(selsig_pool_create(6, &pool));
    CHECK(selsig_pool_create(0, &pool) == SELSIG_ERR_INVALID);
    selsig_config config;
    selsig_tracker *a = NULL, *b = NULL;
    OK(selsig_config_init(&config, 16, 0));
    config.pool = pool;
    OK(selsig_tracker_create(&config, &a));
    OK(selsig_tracker_create(&config, &b));
    selsig_pool_destroy(pool); /* the trackers keep the pool */
    uint64_t cookies[4] = {1, 2, 3, 4};
    selsig_posted p[4];
    size_t n = 0;
    OK(selsig_tracker_post_batch(a, cookies, 4, 0, p, &n));
    CHECK(selsig_tracker_post_batch(b, cookies, 4, 0, p, &n) == SELSIG_ERR_CQ_FULL);
    CHECK(n == 2);
    /* The one that took the pool's last credit is signaled. */
    CHECK(p[1].send_flags == IBV_SEND_SIGNALED);
    selsig_tracker_destroy(a);
    selsig_tracker_destroy(b);
}

/* A long stream through a NIC loop: posts in batches of 32 into a queue of 128, the NIC
 * completes what was posted and writes CQEs for the signaled ones, a CQ polled 16 at a
 * time; every cookie comes back once, in order, completed. */
static void stream(void)
{
    enum { TOTAL = 200000, DEPTH = 128, BATCH = 32, POLL = 16 };
    selsig_tracker *t = tracker_of(DEPTH, DEPTH, 16, SELSIG_NO_CLOCK);
    static struct ibv_wc cq[DEPTH];
    size_t cq_head = 0, cq_len = 0;
    uint64_t next_cookie = 0, expect = 0;
    while (expect < TOTAL) {
        uint64_t cookies[BATCH];
        selsig_posted p[BATCH];
        size_t want = 0, n = 0;
        while (want < BATCH && next_cookie + want < TOTAL) {
            cookies[want] = next_cookie + want;
            want++;
        }
        int rc = selsig_tracker_post_batch(t, cookies, want, SELSIG_POST_SIGNAL, p, &n);
        CHECK(rc == SELSIG_OK || rc == SELSIG_ERR_SQ_FULL || rc == SELSIG_ERR_CQ_FULL);
        next_cookie += n;
        /* The NIC: every posted WRITE executes; a signaled one makes a CQE. */
        for (size_t i = 0; i < n; i++)
            if (p[i].send_flags & IBV_SEND_SIGNALED) {
                CHECK(cq_len < DEPTH);
                cq[(cq_head + cq_len++) % DEPTH] = wc_of(p[i].wr_id, IBV_WC_SUCCESS, 7);
            }
        /* The application polls. */
        struct ibv_wc polled[POLL];
        size_t k = 0;
        while (k < POLL && cq_len > 0) {
            polled[k++] = cq[cq_head];
            cq_head = (cq_head + 1) % DEPTH;
            cq_len--;
        }
        size_t handled = 0;
        OK(selsig_tracker_handle_wcs(t, polled, k, &handled));
        CHECK(handled == k);
        selsig_retired r[DEPTH];
        do {
            OK(selsig_tracker_poll_retired(t, r, DEPTH, &n));
            for (size_t i = 0; i < n; i++) {
                CHECK(r[i].cookie == expect);
                CHECK(r[i].outcome == SELSIG_COMPLETED);
                expect++;
            }
        } while (n > 0);
    }
    selsig_stats s;
    OK(selsig_tracker_stats(t, &s));
    CHECK(s.posted == TOTAL && s.completed == TOTAL && s.cqes < TOTAL / 8);
    selsig_tracker_destroy(t);
}

/* A lost device (IBV_EVENT_DEVICE_FATAL): what the CQ held is handled first, then every
 * outstanding work request retires as SELSIG_DEVICE_LOST, and nothing more is posted. */
static void device_lost(void)
{
    selsig_tracker *t = tracker_of(16, 16, 4, 0);
    selsig_posted p;
    for (uint64_t wr = 1; wr <= 7; wr++)
        OK(selsig_tracker_post(t, wr, 0, &p));
    struct ibv_wc cq[1] = {wc_of(4, IBV_WC_SUCCESS, 7)};
    size_t handled = 0;
    OK(selsig_tracker_handle_wcs(t, cq, 1, &handled));
    uint64_t lost = 0;
    OK(selsig_tracker_device_lost(t, &lost));
    CHECK(lost == 3);
    selsig_retired r[8];
    size_t n = 0;
    OK(selsig_tracker_poll_retired(t, r, 8, &n));
    CHECK(n == 7);
    for (int i = 0; i < 7; i++) {
        CHECK(r[i].cookie == (uint64_t)i + 1);
        if (i < 4)
            CHECK(r[i].outcome == SELSIG_COMPLETED);
        else
            CHECK(r[i].outcome == SELSIG_DEVICE_LOST && r[i].status == IBV_WC_GENERAL_ERR);
    }
    uint32_t state = 0;
    OK(selsig_tracker_state(t, &state));
    CHECK(state == SELSIG_STATE_DEVICE_LOST);
    CHECK(selsig_tracker_post(t, 8, 0, &p) == SELSIG_ERR_DEVICE_LOST);
    CHECK(strstr(selsig_strerror(SELSIG_ERR_DEVICE_LOST), "device was lost") != NULL);
    OK(selsig_tracker_device_lost(t, &lost));
    CHECK(lost == 0);
    CHECK(selsig_tracker_device_lost(t, NULL) == SELSIG_ERR_NULL);
    CHECK(selsig_tracker_device_lost(NULL, &lost) == SELSIG_ERR_NULL);
    selsig_tracker_destroy(t);
}

/* The fast path: the cookies of the work requests that completed, up to the first that
 * did not, which poll_retired then gives with its outcome: of 12 WRITEs, CQE4 and CQE8
 * confirm WR1-8, WR9-10 complete silently before WR11 fails, and WR12 is flushed. */
static void completed_fast_path(void)
{
    selsig_tracker *t = tracker_of(16, 16, 4, 0);
    selsig_posted p;
    for (uint64_t wr = 1; wr <= 12; wr++)
        OK(selsig_tracker_post(t, 100 + wr, 0, &p));
    /* CQE4 and CQE8 succeed; WR11 fails, WR12 is flushed. */
    struct ibv_wc cq[4] = {wc_of(4, IBV_WC_SUCCESS, 7), wc_of(8, IBV_WC_SUCCESS, 7),
                           wc_of(11, IBV_WC_REM_ACCESS_ERR, 7), wc_of(12, IBV_WC_WR_FLUSH_ERR, 7)};
    size_t handled = 0, n = 99;
    OK(selsig_tracker_handle_wcs(t, cq, 4, &handled));
    CHECK(handled == 4);
    uint64_t cookies[16];
    /* At most max at a time, in order. */
    OK(selsig_tracker_poll_completed(t, cookies, 3, &n));
    CHECK(n == 3 && cookies[0] == 101 && cookies[2] == 103);
    OK(selsig_tracker_poll_completed(t, cookies, 16, &n));
    CHECK(n == 7 && cookies[0] == 104 && cookies[6] == 110);
    /* WR11 failed: the fast path stops before it, however often asked. */
    OK(selsig_tracker_poll_completed(t, cookies, 16, &n));
    CHECK(n == 0);
    selsig_retired r[4];
    OK(selsig_tracker_poll_retired(t, r, 4, &n));
    CHECK(n == 2);
    CHECK(r[0].cookie == 111 && r[0].outcome == SELSIG_FAILED && r[0].status == IBV_WC_REM_ACCESS_ERR);
    CHECK(r[1].cookie == 112 && r[1].outcome == SELSIG_FLUSHED);
    /* Nothing retired: nothing to hand back; max 0 hands back nothing. */
    OK(selsig_tracker_poll_completed(t, cookies, 16, &n));
    CHECK(n == 0);
    OK(selsig_tracker_poll_completed(t, NULL, 0, &n));
    CHECK(n == 0);
    selsig_tracker_destroy(t);
}

int main(void)
{
    seed();
    error_mid();
    completed_fast_path();
    bad_input();
    full_queue_and_rollback();
    tagged_sends();
    shared_pool();
    stream();
    device_lost();
    printf("libselsig C test: %d checks passed\n", checks);
    return 0;
}

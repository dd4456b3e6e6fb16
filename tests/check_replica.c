/* replica.h's pure parts: ring positions and the plan a generation restores
 * by; and a round whose barrier breaks (two ranks as threads on 127.0.0.1). */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "worker/train/comm/comm.h"
#include "worker/train/replica.h"
#include "worker/train/zero.h"

#define W 4

static uint64_t all[W * REPLICA_OFFER];
static int pos[W];
static struct replica_src src[W];

/* 2 nodes x 2 ranks: ranks 0,1 on node 0, ranks 2,3 on node 1. */
static void layout(void)
{
    memset(all, 0, sizeof(all));
    for (int r = 0; r < W; r++) {
        uint64_t *o = all + r * REPLICA_OFFER;
        o[OFFER_NODE] = (uint64_t)(r / 2);
        o[OFFER_LOCAL] = (uint64_t)(r % 2);
        o[OFFER_SEED] = 7;
    }
    ck_assert_int_eq(replica_positions(all, W, pos), 0);
}

/* A survivor at step, with its snapshot and the two replicas it holds of partner. */
static void survivor(int r, long step, long snap, int partner, long s0, long s1)
{
    uint64_t *o = all + r * REPLICA_OFFER;
    o[OFFER_FLOATS] = 1000;
    o[OFFER_HAS_STATE] = 1;
    o[OFFER_OLD_RANK] = (uint64_t)r + 1;
    o[OFFER_OLD_WORLD] = W;
    o[OFFER_STEP] = (uint64_t)step;
    o[OFFER_SNAP] = (uint64_t)(snap + 1);
    o[OFFER_PARTNER] = (uint64_t)(partner + 1);
    o[OFFER_SLOT0] = (uint64_t)(s0 + 1);
    o[OFFER_SLOT1] = (uint64_t)(s1 + 1);
}

/* The rank whose replicas rank r holds: its predecessor on the ring. */
static int partner_of(int r)
{
    for (int q = 0; q < W; q++)
        if (pos[q] == (pos[r] + W - 1) % W)
            return q;
    return -1;
}

START_TEST(positions_interleave_nodes)
{
    layout();
    /* (local, node) order: 0 (0,0), 2 (0,1), 1 (1,0), 3 (1,1) */
    ck_assert_int_eq(pos[0], 0);
    ck_assert_int_eq(pos[2], 1);
    ck_assert_int_eq(pos[1], 2);
    ck_assert_int_eq(pos[3], 3);
    for (int r = 0; r < W; r++) /* every holder is on the other node */
        ck_assert_int_ne(partner_of(r) / 2, r / 2);
}
END_TEST

/* The holders of docs/training.md's table "Two buddy rules" (muster-train's
 * column): node of each rank in, the holder of each rank (its successor on
 * the ring) out. */
static void expect_holders(const int *node, int world, const int *holder)
{
    uint64_t offers[W * REPLICA_OFFER];
    int p[W], local = 0;
    memset(offers, 0, sizeof(offers));
    for (int r = 0; r < world; r++) {
        local = r > 0 && node[r] == node[r - 1] ? local + 1 : 0;
        offers[r * REPLICA_OFFER + OFFER_NODE] = (uint64_t)node[r];
        offers[r * REPLICA_OFFER + OFFER_LOCAL] = (uint64_t)local;
    }
    ck_assert_int_eq(replica_positions(offers, world, p), 0);
    for (int r = 0; r < world; r++)
        for (int q = 0; q < world; q++)
            if (p[q] == (p[r] + 1) % world)
                ck_assert_msg(q == holder[r], "rank %d: holder %d, expected %d", r, q, holder[r]);
}

START_TEST(holders_of_the_documented_layouts)
{
    expect_holders((const int[]){0, 0, 1, 1}, 4, (const int[]){2, 3, 1, 0});
    expect_holders((const int[]){0, 1, 2}, 3, (const int[]){1, 2, 0});
    expect_holders((const int[]){0, 0, 0, 1}, 4, (const int[]){3, 2, 0, 1});
    expect_holders((const int[]){0, 0, 0}, 3, (const int[]){1, 2, 0});
}
END_TEST

START_TEST(fresh_start_has_nothing_in_memory)
{
    layout();
    struct replica_plan p;
    ck_assert_int_eq(replica_plan(all, W, pos, &p, src), 0);
    ck_assert_int_eq(p.step, -1);
    ck_assert_int_eq(p.survivors, 0);
}
END_TEST

START_TEST(replaced_rank_from_its_holder)
{
    layout();
    /* rank 3 died; the others finished update 26, their snapshots are 25; the
     * holder of 3 (its successor, rank 0) has 24 and 25. */
    for (int r = 0; r < 3; r++)
        survivor(r, 26, 25, partner_of(r), 24, 25);
    all[2 * REPLICA_OFFER + OFFER_SEED] = 9; /* a checkpoint's seed */
    all[0 * REPLICA_OFFER + OFFER_SEED] = 9;
    all[1 * REPLICA_OFFER + OFFER_SEED] = 9;
    all[1 * REPLICA_OFFER + OFFER_CKPT] = 21;
    struct replica_plan p;
    ck_assert_int_eq(replica_plan(all, W, pos, &p, src), 0);
    ck_assert_int_eq(p.step, 25);
    ck_assert_int_eq(p.survivors, 3);
    ck_assert_int_eq(p.seed, 9);
    ck_assert_int_eq(p.last_checkpoint, 20);
    ck_assert_int_eq(src[0].kind, SRC_SNAP);
    ck_assert_int_eq(src[0].rank, 0);
    ck_assert_int_eq(src[3].kind, SRC_HOLDER);
    ck_assert_int_eq(src[3].rank, 0); /* its successor on the ring: (local 1, node 1) -> (local 0, node 0) */
    ck_assert_int_eq(src[3].slot, 1);
    ck_assert(p.in_place);
    /* The holder has 26 too: nobody goes back. */
    all[0 * REPLICA_OFFER + OFFER_SLOT0] = 27;
    ck_assert_int_eq(replica_plan(all, W, pos, &p, src), 0);
    ck_assert_int_eq(p.step, 26);
    ck_assert_int_eq(src[1].kind, SRC_OWN);
    /* Survivors one step apart: the common step is the lower one. */
    survivor(1, 25, 24, partner_of(1), 24, 25);
    ck_assert_int_eq(replica_plan(all, W, pos, &p, src), 0);
    ck_assert_int_eq(p.step, 25);
    ck_assert_int_eq(src[1].kind, SRC_OWN);
    ck_assert_int_eq(src[2].kind, SRC_SNAP);
}
END_TEST

START_TEST(rank_and_holder_lost_falls_back)
{
    layout();
    /* ranks 3 and 0 (3's holder) died */
    survivor(1, 26, 25, partner_of(1), 24, 25);
    survivor(2, 26, 25, partner_of(2), 24, 25);
    struct replica_plan p;
    ck_assert_int_eq(replica_plan(all, W, pos, &p, src), 0);
    ck_assert_int_eq(p.step, -1);
    ck_assert_int_eq(p.lost, 3);
    ck_assert_int_eq(p.survivors, 2);
    /* A holder of someone else's replicas does not count. */
    layout();
    for (int r = 0; r < 3; r++)
        survivor(r, 26, 25, r == 0 ? 1 : partner_of(r), 24, 25);
    ck_assert_int_eq(replica_plan(all, W, pos, &p, src), 0);
    ck_assert_int_eq(p.step, -1);
}
END_TEST

/* The world changed: old world 2 (ranks 0, 1 on nodes 0, 1), new world 3. */
START_TEST(world_change_reslices)
{
    layout();
    /* grow: both old ranks survive as new ranks 0 and 2; new rank 1 is new */
    survivor(0, 9, 8, 1, 7, 8);
    survivor(2, 9, 8, 0, 7, 8);
    all[0 * REPLICA_OFFER + OFFER_OLD_WORLD] = 2;
    all[2 * REPLICA_OFFER + OFFER_OLD_WORLD] = 2;
    all[2 * REPLICA_OFFER + OFFER_OLD_RANK] = 2; /* old rank 1 */
    struct replica_plan p;
    ck_assert_int_eq(replica_plan(all, 3, pos, &p, src), 0);
    ck_assert_int_eq(p.step, 9);
    ck_assert_int_eq(p.old_world, 2);
    ck_assert(!p.in_place);
    ck_assert_int_eq(src[0].rank, 0);
    ck_assert_int_eq(src[1].rank, 2);
    ck_assert_int_eq(src[1].kind, SRC_OWN);
    /* shrink: old rank 1 is gone; new rank 0 (old rank 0) holds its replicas of 7 and 8 */
    layout();
    survivor(0, 9, 8, 1, 7, 8);
    all[0 * REPLICA_OFFER + OFFER_OLD_WORLD] = 2;
    ck_assert_int_eq(replica_plan(all, 1, pos, &p, src), 0);
    ck_assert_int_eq(p.step, 8);
    ck_assert_int_eq(src[0].kind, SRC_SNAP);
    ck_assert_int_eq(src[1].kind, SRC_HOLDER);
    ck_assert_int_eq(src[1].rank, 0);
    ck_assert_int_eq(src[1].slot, 1);
    /* survivors of different worlds: not restored from memory */
    layout();
    survivor(0, 9, 8, 1, 7, 8);
    survivor(1, 9, 8, 0, 7, 8);
    all[1 * REPLICA_OFFER + OFFER_OLD_WORLD] = 2;
    ck_assert_int_eq(replica_plan(all, W, pos, &p, src), -EINVAL);
}
END_TEST

START_TEST(barrier_broken_half_way)
{
    layout();
    /* rank 3 died in the barrier of round 25: rank 1 got through it (its
     * snapshot moved to 25), ranks 0 and 2 did not (24); all are at step 25.
     * Only step 25 is common: rank 0, 3's holder, must offer the replica of
     * 25 it received before its barrier broke. */
    survivor(0, 25, 24, 3, 24, 25);
    survivor(1, 25, 25, partner_of(1), 24, 25);
    survivor(2, 25, 24, partner_of(2), 24, 25);
    struct replica_plan p;
    ck_assert_int_eq(replica_plan(all, W, pos, &p, src), 0);
    ck_assert_int_eq(p.step, 25);
    ck_assert_int_eq(src[3].kind, SRC_HOLDER);
    ck_assert_int_eq(src[1].kind, SRC_OWN);
    /* Without it, no step is common although only one rank was lost. */
    survivor(0, 25, 24, 3, 24, -1);
    ck_assert_int_eq(replica_plan(all, W, pos, &p, src), 0);
    ck_assert_int_eq(p.step, -1);
}
END_TEST

START_TEST(offers_of_another_model_are_refused)
{
    layout();
    survivor(0, 3, 2, partner_of(0), 1, 2);
    survivor(2, 3, 2, partner_of(2), 1, 2);
    all[2 * REPLICA_OFFER + OFFER_FLOATS] = 999;
    struct replica_plan p;
    ck_assert_int_eq(replica_plan(all, W, pos, &p, src), -EINVAL);
}
END_TEST

/* ---- a round whose sender dies right after it ---- */

#define RF 1000 /* shard floats */

struct peer {
    const uint8_t *id;
    float state[3 * RF]; /* weights, m, v of step 5: one block, as struct zero holds them */
    float got[3 * RF];   /* what rank 0 sent it */
    int rc;
};

/* Rank 1 plays its part of round 5 by hand (the header, then its block to
 * its holder, rank 0), then dies. */
static void *dying_peer(void *arg)
{
    struct peer *p = arg;
    struct comm *c = NULL;
    p->rc = comm_init(&c, COMM_RING, 1, 2, p->id, 10000);
    if (p->rc)
        return NULL;
    struct {
        uint32_t magic, rank;
        uint64_t step, floats;
    } mine = {0x4d52504cu, 1, 5, RF}, theirs;
    p->rc = comm_shift(c, &mine, sizeof(mine), &theirs, sizeof(theirs));
    if (!p->rc)
        p->rc = comm_shift(c, p->state, sizeof(p->state), p->got, sizeof(p->got));
    comm_destroy(c); /* gone */
    return NULL;
}

/* Round 5 between rep (rank 0) and a dying peer (rank 1, p): the ring
 * formed, the round made, the peer gone; p->state is what it sent. */
static void round_with_dying_peer(struct replica *rep, struct peer *p)
{
    static uint8_t id[COMM_ID_BYTES];
    setenv("MUSTER_COMM_ADDR", "127.0.0.1", 1);
    ck_assert_int_eq(comm_unique_id(COMM_RING, id), 0);
    p->id = id;
    for (int i = 0; i < 3 * RF; i++)
        p->state[i] = (float)i;
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, dying_peer, p), 0);
    struct comm *c = NULL;
    ck_assert_int_eq(comm_init(&c, COMM_RING, 0, 2, id, 10000), 0);
    replica_attach(rep, c);
    replica_begin(rep, 5);
    ck_assert_int_eq(replica_wait(rep), 0); /* sent and received in full */
    pthread_join(t, NULL);
    ck_assert_int_eq(p->rc, 0);
}

/* The replica a holder received whole is offered, even though the sender
 * died at once: nothing after the transfer can take it back. */
START_TEST(holder_offers_a_replica_whose_sender_died)
{
    static struct peer p;
    static float block[3 * RF];
    struct zero z = {.rank = 0, .world = 2, .plan = {.total = RF}, .params = block, .m = block + RF,
                     .v = block + 2 * RF};
    struct replica rep;
    ck_assert_int_eq(replica_init(&rep, &z, 1, 0), 0);
    round_with_dying_peer(&rep, &p);
    comm_destroy(replica_detach(&rep));
    uint64_t o[REPLICA_OFFER];
    replica_offer(&rep, 1, 0, 2, RF, 5, 0, 0, 7, -1, o);
    ck_assert_int_eq(o[OFFER_PARTNER], 2);
    ck_assert_msg(o[OFFER_SLOT0] == 6 || o[OFFER_SLOT1] == 6, "slots offered: %d and %d", (int)o[OFFER_SLOT0] - 1,
                  (int)o[OFFER_SLOT1] - 1);
    const float *slot = rep.slot[o[OFFER_SLOT0] == 6 ? 0 : 1];
    ck_assert_int_eq(memcmp(slot, p.state, sizeof(p.state)), 0);
    replica_free(&rep);
    free(z.alt_params);
}
END_TEST

/* ---- a store that is not the zero's (the GPU trainer's kind) ---- */

struct test_store {
    float block[2][3 * RF];
    int cur, next;        /* the snapshot's block, the one set aside; -1: none */
    long step;            /* of the last round */
    int rounds, kept, dropped, reverted, fail;
};

static const float *ts_round(void *arg, long step)
{
    struct test_store *t = arg;
    t->rounds++;
    t->step = step;
    t->next = t->cur == 0 ? 1 : 0;
    return t->fail ? NULL : t->block[t->next];
}

static void ts_keep(void *arg, int keep)
{
    struct test_store *t = arg;
    if (keep)
        t->kept++;
    else
        t->dropped++;
    t->cur = keep ? t->next : -1;
}

static int ts_revert(void *arg)
{
    ((struct test_store *)arg)->reverted++;
    return 0;
}

static float *ts_inbox(void *arg) { return ((struct test_store *)arg)->block[0]; }

static int ts_received(void *arg)
{
    (void)arg;
    return 0;
}

/* The round sends the block the store sets aside (not any shard buffer),
 * the update keeps it as the snapshot, a store that cannot make a round
 * fails it, and a restore goes back through the store and drops the rest. */
START_TEST(store_blocks_are_sent_kept_and_reverted)
{
    static struct peer p;
    static struct test_store t = {.cur = -1, .next = -1};
    for (int i = 0; i < 3 * RF; i++) {
        t.block[0][i] = 0.5f * (float)i + 1.0f;
        t.block[1][i] = -1.0f;
    }
    const struct replica_store store = {ts_round, ts_keep, ts_revert, ts_inbox, ts_received, &t};
    struct replica rep;
    ck_assert_int_eq(replica_init_store(&rep, RF, 1, 0, &store), 0);
    round_with_dying_peer(&rep, &p);
    ck_assert_int_eq(t.rounds, 1);
    ck_assert_int_eq(t.step, 5);
    ck_assert_int_eq(memcmp(p.got, t.block[0], sizeof(p.got)), 0); /* the store's block went to the holder */
    replica_updated(&rep);
    ck_assert_int_eq(t.kept, 1);
    ck_assert_int_eq(t.cur, 0);
    uint64_t o[REPLICA_OFFER];
    replica_offer(&rep, 1, 0, 2, RF, 6, 0, 0, 7, -1, o);
    ck_assert_int_eq(o[OFFER_SNAP], 6); /* step 5's state, held by the store */
    t.fail = 1;
    replica_begin(&rep, 6);
    ck_assert_int_eq(replica_wait(&rep), -EIO);
    ck_assert_int_eq(replica_failed(&rep), -EIO);
    comm_destroy(replica_detach(&rep));
    /* alone again (world 1): this rank goes back to its snapshot of step 5 */
    struct replica_plan plan = {.step = 5, .old_world = 1, .in_place = 1, .lost = -1, .survivors = 1};
    struct replica_src me = {SRC_SNAP, 0, -1};
    int pos0 = 0;
    ck_assert_int_eq(replica_restore(&rep, &plan, &me, &pos0, 1), 0);
    ck_assert_int_eq(t.reverted, 1);
    ck_assert_int_eq(t.dropped, 1);
    ck_assert_int_eq(t.cur, -1);
    replica_free(&rep);
}
END_TEST

Suite *make_replica_suite(void)
{
    Suite *s = suite_create("replica");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, positions_interleave_nodes);
    tcase_add_test(tc, holders_of_the_documented_layouts);
    tcase_add_test(tc, fresh_start_has_nothing_in_memory);
    tcase_add_test(tc, replaced_rank_from_its_holder);
    tcase_add_test(tc, rank_and_holder_lost_falls_back);
    tcase_add_test(tc, world_change_reslices);
    tcase_add_test(tc, barrier_broken_half_way);
    tcase_add_test(tc, offers_of_another_model_are_refused);
    suite_add_tcase(s, tc);
    TCase *round = tcase_create("round");
    tcase_set_timeout(round, 30);
    tcase_add_test(round, holder_offers_a_replica_whose_sender_died);
    tcase_add_test(round, store_blocks_are_sent_kept_and_reverted);
    suite_add_tcase(s, round);
    return s;
}

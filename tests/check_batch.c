/*
 * batch: splitting the global batch over the world, and musterd refusing a
 * batch that does not divide when generation 1 forms, before any ASSIGN.
 */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "common/batch.h"
#include "daemon/rdv.h"

START_TEST(same_effective_batch_on_8_16_64_ranks)
{
    static const int worlds[] = {8, 16, 64};
    struct batch_plan p;
    char err[256];
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(batch_plan(512, 0, worlds[i], &p, err, sizeof(err)), 0);
        ck_assert_int_eq(p.accum, 1);
        ck_assert_int_eq(p.micro_batch * worlds[i] * p.accum, 512);
        ck_assert_int_eq(batch_plan(512, 4, worlds[i], &p, err, sizeof(err)), 0);
        ck_assert_int_eq(p.micro_batch, 4);
        ck_assert_int_eq(p.micro_batch * worlds[i] * p.accum, 512);
    }
    ck_assert_int_eq(batch_plan(512, 4, 8, &p, err, sizeof(err)), 0);
    ck_assert_int_eq(p.accum, 16);
    ck_assert_int_eq(batch_plan(512, 4, 64, &p, err, sizeof(err)), 0);
    ck_assert_int_eq(p.accum, 2);
}
END_TEST

START_TEST(batch_that_does_not_divide_names_the_numbers)
{
    struct batch_plan p;
    char err[256];
    ck_assert_int_eq(batch_plan(100, 0, 16, &p, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "batch 100 does not divide over 16 ranks: use a multiple of 16, e.g. 96 or 112");
    ck_assert_int_eq(batch_plan(8, 0, 16, &p, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "batch 8 does not divide over 16 ranks: use a multiple of 16, e.g. 16");
    /* Divides over the ranks, but not into micro-batches of 4. */
    ck_assert_int_eq(batch_plan(96, 4, 16, &p, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "batch 96 does not divide into micro-batches of 4 over 16 ranks (64 sequences per "
                          "micro-step): use a multiple of 64, e.g. 64 or 128, or a micro_batch that divides 6");
    ck_assert_int_eq(batch_plan(100, 4, 16, &p, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "use a multiple of 64, e.g. 64 or 128"));
    ck_assert_ptr_null(strstr(err, "micro_batch that divides"));
    ck_assert_int_eq(batch_plan(16, 0, 0, &p, err, sizeof(err)), -EINVAL);
}
END_TEST

/* ---- musterd at formation --------------------------------------------- */

static int nassign;
static void count_send(void *ctx, const char *node, const struct proto_msg *m) { nassign += m->type == PROTO_ASSIGN; }
static void no_disconnect(void *ctx, const char *node, const char *why) {}
static void no_change(void *ctx, int persist) {}

static void join(struct rdv *r, const char *name, uint32_t ndev)
{
    struct proto_hello h;
    char code[32], reason[PROTO_REASON_MAX];
    memset(&h, 0, sizeof(h));
    snprintf(h.node, sizeof(h.node), "%s", name);
    snprintf(h.addr, sizeof(h.addr), "127.0.0.1");
    h.free_port = 29500;
    h.ndevices = ndev;
    for (uint32_t i = 0; i < ndev; i++)
        h.devices[i] = i;
    ck_assert_int_eq(rdv_join(r, &h, 1000, code, reason), 0);
}

/* Two nodes of 8 (world 16) with the given batch; returns the state after both joined. */
static enum rdv_job_state form(int batch, int micro_batch, struct rdv *r, struct job_spec *spec)
{
    job_spec_defaults(spec);
    snprintf(spec->name, sizeof(spec->name), "b");
    spec->nodes = 2;
    spec->batch = batch;
    spec->micro_batch = micro_batch;
    json_t *job = json_pack("{s:s, s:i, s:i}", "name", "b", "nodes", 2, "batch", batch);
    struct rdv_ops ops = {.send = count_send, .disconnect = no_disconnect, .changed = no_change};
    nassign = 0;
    ck_assert_int_eq(rdv_init(r, spec, job, &ops, 1000), 0);
    json_decref(job);
    join(r, "a", 8);
    join(r, "b", 8);
    return r->state;
}

START_TEST(musterd_refuses_at_formation_before_any_rank_starts)
{
    static struct rdv r;
    struct job_spec spec;
    ck_assert_int_eq(form(100, 0, &r, &spec), RDV_FAILED);
    ck_assert_int_eq(nassign, 0);
    ck_assert_uint_eq(r.generation, 0);
    ck_assert_str_eq(r.reason, "batch 100 does not divide over 16 ranks: use a multiple of 16, e.g. 96 or 112");
    ck_assert_ptr_nonnull(strstr(r.events[(r.nevents - 1) % RDV_EVENTS].message, "batch 100 does not divide"));
    rdv_free(&r);

    ck_assert_int_eq(form(96, 0, &r, &spec), RDV_FORMING);
    ck_assert_int_eq(nassign, 2);
    ck_assert_uint_eq(r.generation, 1);
    rdv_free(&r);

    ck_assert_int_eq(form(96, 4, &r, &spec), RDV_FAILED);
    ck_assert_int_eq(nassign, 0);
    rdv_free(&r);
}
END_TEST

Suite *make_batch_suite(void)
{
    Suite *s = suite_create("batch");
    TCase *tc = tcase_create("batch");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, same_effective_batch_on_8_16_64_ranks);
    tcase_add_test(tc, batch_that_does_not_divide_names_the_numbers);
    tcase_add_test(tc, musterd_refuses_at_formation_before_any_rank_starts);
    suite_add_tcase(s, tc);
    return s;
}

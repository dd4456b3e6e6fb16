/*
 * Unit tests of proto/: every message round-trips; every decoder error is
 * produced from hand-built bytes and named exactly; partial frames ask for
 * more and truncated streams are errors; HMAC matches RFC 4231; and a
 * deterministic mutation loop shows the decoder answers a defined code for
 * anything; HEARTBEAT's fast path (proto/fastbeat.h) writes the bytes the
 * JSON encoder writes and reads nothing the JSON decoder would read
 * otherwise. Inputs are copied into buffers of their exact length so that
 * ASan catches any read past the end.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/server.h" /* SERVER_PREAUTH_FRAME_MAX */
#include "proto/check.h"
#include "proto/fastbeat.h"
#include "proto/proto.h"
#include "proto/realnum.h"

#define NTYPES PROTO_TYPE_MAX

/* ---- helpers ---- */

static uint8_t *copy_exact(const uint8_t *buf, size_t len)
{
    uint8_t *p = malloc(len ? len : 1);

    ck_assert_ptr_nonnull(p);
    if (len)
        memcpy(p, buf, len);
    return p;
}

/* proto_decode over an exact-size copy of buf[0..len). */
static int decode_exact(const uint8_t *buf, size_t len, struct proto_msg *m,
                        size_t *consumed)
{
    uint8_t *p = copy_exact(buf, len);
    int rc = proto_decode(p, len, m, consumed);

    free(p);
    return rc;
}

static void put_header(uint8_t *out, uint32_t len, uint16_t version, uint16_t type)
{
    out[0] = (uint8_t)(len >> 24);
    out[1] = (uint8_t)(len >> 16);
    out[2] = (uint8_t)(len >> 8);
    out[3] = (uint8_t)len;
    out[4] = (uint8_t)(version >> 8);
    out[5] = (uint8_t)version;
    out[6] = (uint8_t)(type >> 8);
    out[7] = (uint8_t)type;
}

/* Header bytes + payload bytes, built by hand. */
static size_t raw_frame(uint8_t *out, uint16_t version, uint16_t type,
                        const char *payload, size_t payload_len)
{
    put_header(out, (uint32_t)payload_len, version, type);
    memcpy(out + PROTO_HEADER_LEN, payload, payload_len);
    return PROTO_HEADER_LEN + payload_len;
}

/* Decode a version-1 frame of type with JSON text json; msg is cleared. */
static int decode_text(uint16_t type, const char *json)
{
    static uint8_t frame[PROTO_MAX_FRAME];
    struct proto_msg m;
    size_t n = raw_frame(frame, PROTO_VERSION, type, json, strlen(json));
    size_t consumed;
    int rc = decode_exact(frame, n, &m, &consumed);

    if (rc == PROTO_OK)
        ck_assert_uint_eq(consumed, n);
    proto_msg_clear(&m);
    return rc;
}

static int decode_json(uint16_t type, json_t *payload)
{
    char *text = json_dumps(payload, JSON_COMPACT);
    int rc;

    ck_assert_ptr_nonnull(text);
    rc = decode_text(type, text);
    free(text);
    return rc;
}

/* A valid message of each type, with non-trivial values in every field. */
static void sample(int type, struct proto_msg *m)
{
    memset(m, 0, sizeof(*m));
    m->type = (enum proto_type)type;
    switch (type) {
    case PROTO_HELLO: {
        struct proto_hello *h = &m->u.hello;
        strcpy(h->node, "gpu-node-07.rack_2");
        strcpy(h->addr, "10.1.2.3");
        h->kind = PROTO_DEV_GPU;
        h->ndevices = 8;
        for (uint32_t i = 0; i < 8; i++)
            h->devices[i] = 7 - i;
        h->device_mem_mb = 81559;
        h->generation = 12;
        h->free_port = 29501;
        strcpy(h->agent_version, "0.1.0");
        for (int i = 0; i < PROTO_NONCE_LEN; i++)
            h->nonce[i] = (uint8_t)(i * 5 + 3);
        h->session = 0x1234567890abcULL;
        h->ngpus = 8;
        for (uint32_t i = 0; i < 8; i++)
            h->gpus[i] = (struct proto_gpu){"NVIDIA H100 80GB HBM3", 81559, 80000 - i};
        h->host_mem_mb = 2064384;
        h->preflight = 1;
        strcpy(h->domain, "rack-7.nvl0");
        break;
    }
    case PROTO_CHALLENGE:
        for (int i = 0; i < PROTO_NONCE_LEN; i++)
            m->u.challenge.nonce[i] = (uint8_t)(i * 7 + 1);
        for (int i = 0; i < PROTO_HMAC_LEN; i++)
            m->u.challenge.hmac[i] = (uint8_t)(i * 11 + 2);
        break;
    case PROTO_RESPONSE:
        for (int i = 0; i < PROTO_HMAC_LEN; i++)
            m->u.response.hmac[i] = (uint8_t)(255 - i);
        break;
    case PROTO_WELCOME:
        m->u.welcome.heartbeat_interval_ms = 1000;
        m->u.welcome.heartbeat_timeout_ms = 5000;
        m->u.welcome.lease_ms = 10000;
        m->u.welcome.session = 0x1234567890abcULL;
        m->u.welcome.time_ms = 1795000000123;
        m->u.welcome.term = 17;
        m->u.welcome.job = json_pack("{s:s, s:i}", "name", "demo", "nodes", 2);
        ck_assert_ptr_nonnull(m->u.welcome.job);
        break;
    case PROTO_REJECT:
        strcpy(m->u.reject.code, "duplicate");
        strcpy(m->u.reject.reason, "node \"n1\" is connected from 10.0.0.2 \xc3\xbc\xe2\x82\xac");
        break;
    case PROTO_ASSIGN: {
        struct proto_assign *a = &m->u.assign;
        a->generation = 3;
        a->world_size = 16;
        a->nranks = 8;
        for (uint32_t i = 0; i < 8; i++) {
            a->ranks[i].rank = 8 + i;
            a->ranks[i].local_rank = i;
            a->ranks[i].device = 7 - i;
        }
        a->node_rank = 1;
        a->nnodes = 2;
        a->restart_count = 4;
        strcpy(a->master_addr, "10.1.2.2");
        a->master_port = 29500;
        a->term = 17;
        a->job = json_pack("{s:s, s:i, s:[i,i], s:f, s:{s:b}}", "name", "demo",
                           "nodes", 2, "dims", 1, 2, "lr", 3e-4, "opt", "zero", 1);
        ck_assert_ptr_nonnull(a->job);
        break;
    }
    case PROTO_UNIQUE_ID:
        m->u.unique_id.generation = 3;
        m->u.unique_id.term = 17;
        for (int i = 0; i < PROTO_UID_LEN; i++)
            m->u.unique_id.id[i] = (uint8_t)(i * 31);
        break;
    case PROTO_HEARTBEAT: {
        struct proto_heartbeat *h = &m->u.heartbeat;
        h->generation = 3;
        h->seq = 42;
        h->no_ack = 1;
        h->nranks = 3;
        h->ranks[0] = (struct proto_rank_beat){8, PROTO_RANK_RUNNING, 1200, 2.345, 12345.5, 0.125, 1000, 0, 51384,
                                               1u << 30, 1, PROTO_RESTORE_MEMORY, 1100, 1, 0.8125, 1, 1234, 5000, 1,
                                               "tr\"ain\\.py:88 in compute_loss \xc3\xbc\xe2\x82\xac",
                                               "all_reduce (distributed_c10d.py)", 2.5, 25,
                                               {0.5, 0.25, 0.125, 0.0625}};
        /* has_step_age with 0 ms: the step changed as the entry was sent */
        h->ranks[1] = (struct proto_rank_beat){9, PROTO_RANK_STARTING, 0, NAN, 0, 1, 0, 1, 0, 0, 0, PROTO_RESTORE_NONE, 0, 0,
                                               0, 1, 0, 0, 0, "", "", 0, 0, {0}};
        h->ranks[2] = (struct proto_rank_beat){10, PROTO_RANK_EXITED, 1199, 1e-7, 1e6, 1, 0, 0, 0, 0, 0,
                                               PROTO_RESTORE_NONE, 0, 0, 0, 0, 0, 0, 0, "", "", 0.1, 0,
                                               {1, 0, 0, 0}};
        break;
    }
    case PROTO_RANK_EXIT:
        m->u.rank_exit.generation = 3;
        m->u.rank_exit.rank = 9;
        m->u.rank_exit.exit_code = -1;
        m->u.rank_exit.signal = 6;
        strcpy(m->u.rank_exit.reason, "RuntimeError: CUDA error: an illegal memory access (train.py:12) \xe2\x82\xac");
        strcpy(m->u.rank_exit.detail, "Traceback (most recent call last):\n  File \"train.py\", line 12\n");
        break;
    case PROTO_COMMAND:
        m->u.command.generation = 4;
        m->u.command.action = PROTO_CMD_STOP;
        m->u.command.term = 17;
        break;
    case PROTO_ERROR:
        strcpy(m->u.error.code, "stale_generation");
        strcpy(m->u.error.reason, "generation 2 is older than 3");
        break;
    case PROTO_LOG_REQUEST:
        m->u.log_request = (struct proto_log_request){77, 9, 3, 123456, 0, PROTO_LOG_MAX};
        break;
    case PROTO_LOG_DATA: {
        struct proto_log_data *d = &m->u.log_data;
        d->data = strdup("step 1 loss 2.5\n\tq=\"\\\" \xc3\xbc\xe2\x82\xac ?\n");
        ck_assert_ptr_nonnull(d->data);
        d->id = 77;
        d->rank = 9;
        d->generation = 3;
        d->newest = 4;
        d->offset = 1000;
        d->next_offset = d->offset + strlen(d->data);
        d->size = d->next_offset + 50;
        break;
    }
    case PROTO_PREFLIGHT:
        m->u.preflight.fit = 0;
        m->u.preflight.trainer = 1;
        strcpy(m->u.preflight.reason, "data /data/shard0.bin: No such file or directory \xe2\x82\xac");
        m->u.preflight.has_checkpoint = 1;
        strcpy(m->u.preflight.checkpoint, "global_step40");
        break;
    case PROTO_STACKS: {
        struct proto_stacks *k = &m->u.stacks;
        k->generation = 3;
        k->rank = 9;
        k->pid = 4242;
        k->stopped = 1;
        k->text = strdup("process 4242:\nThread 0x7f (most recent call first):\n"
                         "  File \"train.py\", line 88 in compute_loss\n\t\\ \xe2\x82\xac\n");
        ck_assert_ptr_nonnull(k->text);
        strcpy(k->error, "its process is stopped (SIGSTOP or a debugger): it dumps when it continues");
        k->fr = strdup("0 default_pg 37 36 36:all_reduce 37:barrier\n1 undefined 2 2 2:all_gather");
        ck_assert_ptr_nonnull(k->fr);
        k->ras = strdup("NCCL RAS: rank 2 of NCCL communicator 0x7e57 (4 ranks; host 10.0.0.2, pid 4242, GPU 0) has "
                        "issued 99 AllReduce where 3 rank(s) have issued 100: it is behind, its peers wait for it");
        ck_assert_ptr_nonnull(k->ras);
        break;
    }
    case PROTO_MEM_FILE: {
        struct proto_mem_file *f = &m->u.mem_file;
        strcpy(f->owner, "node-b");
        strcpy(f->tag, "global_step120");
        strcpy(f->path, "global_step120/zero_pp_rank_1_mp_rank_00_optim_states.pt");
        f->begin = 1;
        f->restore = 1;
        f->len = 1000; /* not a multiple of 3: base64's padding; every byte value */
        f->data = malloc(f->len);
        ck_assert_ptr_nonnull(f->data);
        for (uint32_t i = 0; i < f->len; i++)
            f->data[i] = (uint8_t)(i * 7 + 3);
        f->offset = 4096;
        f->size = 8192;
        break;
    }
    case PROTO_MEM_FETCH:
        strcpy(m->u.mem_fetch.owner, "node-b");
        strcpy(m->u.mem_fetch.tag, "global_step120");
        break;
    default:
        ck_abort_msg("no sample for type %d", type);
    }
}

static int same_double(double a, double b)
{
    return (isnan(a) && isnan(b)) || a == b;
}

static void assert_msg_eq(const struct proto_msg *a, const struct proto_msg *b)
{
    ck_assert_int_eq(a->type, b->type);
    switch (a->type) {
    case PROTO_HELLO: {
        const struct proto_hello *x = &a->u.hello, *y = &b->u.hello;
        ck_assert_str_eq(x->node, y->node);
        ck_assert_str_eq(x->addr, y->addr);
        ck_assert_int_eq(x->kind, y->kind);
        ck_assert_uint_eq(x->ndevices, y->ndevices);
        for (uint32_t i = 0; i < x->ndevices; i++)
            ck_assert_uint_eq(x->devices[i], y->devices[i]);
        ck_assert_uint_eq(x->device_mem_mb, y->device_mem_mb);
        ck_assert_uint_eq(x->generation, y->generation);
        ck_assert_uint_eq(x->free_port, y->free_port);
        ck_assert_str_eq(x->agent_version, y->agent_version);
        ck_assert_uint_eq(x->session, y->session);
        ck_assert_uint_eq(x->ngpus, y->ngpus);
        for (uint32_t i = 0; i < x->ngpus; i++) {
            ck_assert_str_eq(x->gpus[i].name, y->gpus[i].name);
            ck_assert_uint_eq(x->gpus[i].total_mb, y->gpus[i].total_mb);
            ck_assert_uint_eq(x->gpus[i].free_mb, y->gpus[i].free_mb);
        }
        ck_assert_uint_eq(x->host_mem_mb, y->host_mem_mb);
        ck_assert_int_eq(x->preflight, y->preflight);
        ck_assert_str_eq(x->domain, y->domain);
        ck_assert_mem_eq(x->nonce, y->nonce, PROTO_NONCE_LEN);
        break;
    }
    case PROTO_CHALLENGE:
        ck_assert_mem_eq(a->u.challenge.nonce, b->u.challenge.nonce, PROTO_NONCE_LEN);
        ck_assert_mem_eq(a->u.challenge.hmac, b->u.challenge.hmac, PROTO_HMAC_LEN);
        break;
    case PROTO_RESPONSE:
        ck_assert_mem_eq(a->u.response.hmac, b->u.response.hmac, PROTO_HMAC_LEN);
        break;
    case PROTO_WELCOME:
        ck_assert_uint_eq(a->u.welcome.heartbeat_interval_ms, b->u.welcome.heartbeat_interval_ms);
        ck_assert_uint_eq(a->u.welcome.heartbeat_timeout_ms, b->u.welcome.heartbeat_timeout_ms);
        ck_assert_uint_eq(a->u.welcome.lease_ms, b->u.welcome.lease_ms);
        ck_assert_uint_eq(a->u.welcome.session, b->u.welcome.session);
        ck_assert_uint_eq(a->u.welcome.time_ms, b->u.welcome.time_ms);
        ck_assert_uint_eq(a->u.welcome.term, b->u.welcome.term);
        ck_assert_msg((!a->u.welcome.job && !b->u.welcome.job) || json_equal(a->u.welcome.job, b->u.welcome.job),
                      "job objects differ");
        break;
    case PROTO_PREFLIGHT:
        ck_assert_int_eq(a->u.preflight.fit, b->u.preflight.fit);
        ck_assert_int_eq(a->u.preflight.trainer, b->u.preflight.trainer);
        ck_assert_str_eq(a->u.preflight.reason, b->u.preflight.reason);
        ck_assert_int_eq(a->u.preflight.has_checkpoint, b->u.preflight.has_checkpoint);
        ck_assert_str_eq(a->u.preflight.checkpoint, b->u.preflight.checkpoint);
        break;
    case PROTO_REJECT:
        ck_assert_str_eq(a->u.reject.code, b->u.reject.code);
        ck_assert_str_eq(a->u.reject.reason, b->u.reject.reason);
        break;
    case PROTO_ASSIGN: {
        const struct proto_assign *x = &a->u.assign, *y = &b->u.assign;
        ck_assert_uint_eq(x->generation, y->generation);
        ck_assert_uint_eq(x->world_size, y->world_size);
        ck_assert_uint_eq(x->nranks, y->nranks);
        for (uint32_t i = 0; i < x->nranks; i++) {
            ck_assert_uint_eq(x->ranks[i].rank, y->ranks[i].rank);
            ck_assert_uint_eq(x->ranks[i].local_rank, y->ranks[i].local_rank);
            ck_assert_uint_eq(x->ranks[i].device, y->ranks[i].device);
        }
        ck_assert_uint_eq(x->node_rank, y->node_rank);
        ck_assert_uint_eq(x->nnodes, y->nnodes);
        ck_assert_uint_eq(x->restart_count, y->restart_count);
        ck_assert_str_eq(x->master_addr, y->master_addr);
        ck_assert_uint_eq(x->master_port, y->master_port);
        ck_assert_uint_eq(x->term, y->term);
        ck_assert_msg(json_equal(x->job, y->job), "job objects differ");
        break;
    }
    case PROTO_UNIQUE_ID:
        ck_assert_uint_eq(a->u.unique_id.generation, b->u.unique_id.generation);
        ck_assert_mem_eq(a->u.unique_id.id, b->u.unique_id.id, PROTO_UID_LEN);
        ck_assert_uint_eq(a->u.unique_id.term, b->u.unique_id.term);
        break;
    case PROTO_HEARTBEAT: {
        const struct proto_heartbeat *x = &a->u.heartbeat, *y = &b->u.heartbeat;
        ck_assert_uint_eq(x->generation, y->generation);
        ck_assert_uint_eq(x->seq, y->seq);
        ck_assert_int_eq(x->no_ack, y->no_ack);
        ck_assert_uint_eq(x->nranks, y->nranks);
        for (uint32_t i = 0; i < x->nranks; i++) {
            const struct proto_rank_beat *p = &x->ranks[i], *q = &y->ranks[i];
            ck_assert_uint_eq(p->rank, q->rank);
            ck_assert_int_eq(p->state, q->state);
            ck_assert_uint_eq(p->step, q->step);
            ck_assert_msg(same_double(p->loss, q->loss), "loss %.17g != %.17g", p->loss, q->loss);
            ck_assert_msg(p->tokens_per_s == q->tokens_per_s, "tokens_per_s %.17g != %.17g",
                          p->tokens_per_s, q->tokens_per_s);
            ck_assert_msg(p->comm_frac == q->comm_frac, "comm_frac %.17g != %.17g",
                          p->comm_frac, q->comm_frac);
            ck_assert_int_eq(p->checkpoint_step, q->checkpoint_step);
            ck_assert_int_eq(p->silent, q->silent);
            ck_assert_uint_eq(p->step_bytes, q->step_bytes);
            ck_assert_uint_eq(p->peak_mem, q->peak_mem);
            ck_assert_int_eq(p->rejoin, q->rejoin);
            ck_assert_int_eq(p->yielded, q->yielded);
            ck_assert_int_eq(p->restore_from, q->restore_from);
            ck_assert_uint_eq(p->restore_step, q->restore_step);
            ck_assert_msg(p->step_s == q->step_s, "step_s %.17g != %.17g", p->step_s, q->step_s);
            ck_assert_int_eq(p->has_step_age, q->has_step_age);
            ck_assert_uint_eq(p->step_age_ms, q->step_age_ms);
            ck_assert_uint_eq(p->total_steps, q->total_steps);
            ck_assert_str_eq(p->where, q->where);
            ck_assert_str_eq(p->waiting, q->waiting);
            ck_assert_int_eq(p->stopped, q->stopped);
        }
        ck_assert_uint_eq(x->free_port, y->free_port);
        break;
    }
    case PROTO_RANK_EXIT:
        ck_assert_uint_eq(a->u.rank_exit.generation, b->u.rank_exit.generation);
        ck_assert_uint_eq(a->u.rank_exit.rank, b->u.rank_exit.rank);
        ck_assert_int_eq(a->u.rank_exit.exit_code, b->u.rank_exit.exit_code);
        ck_assert_int_eq(a->u.rank_exit.signal, b->u.rank_exit.signal);
        ck_assert_str_eq(a->u.rank_exit.reason, b->u.rank_exit.reason);
        ck_assert_str_eq(a->u.rank_exit.detail, b->u.rank_exit.detail);
        break;
    case PROTO_COMMAND:
        ck_assert_uint_eq(a->u.command.generation, b->u.command.generation);
        ck_assert_int_eq(a->u.command.action, b->u.command.action);
        ck_assert_uint_eq(a->u.command.term, b->u.command.term);
        break;
    case PROTO_ERROR:
        ck_assert_str_eq(a->u.error.code, b->u.error.code);
        ck_assert_str_eq(a->u.error.reason, b->u.error.reason);
        break;
    case PROTO_LOG_REQUEST: {
        const struct proto_log_request *x = &a->u.log_request, *y = &b->u.log_request;
        ck_assert_uint_eq(x->id, y->id);
        ck_assert_uint_eq(x->rank, y->rank);
        ck_assert_uint_eq(x->generation, y->generation);
        ck_assert_uint_eq(x->offset, y->offset);
        ck_assert_uint_eq(x->tail, y->tail);
        ck_assert_uint_eq(x->max, y->max);
        break;
    }
    case PROTO_LOG_DATA: {
        const struct proto_log_data *x = &a->u.log_data, *y = &b->u.log_data;
        ck_assert_uint_eq(x->id, y->id);
        ck_assert_uint_eq(x->rank, y->rank);
        ck_assert_uint_eq(x->generation, y->generation);
        ck_assert_uint_eq(x->newest, y->newest);
        ck_assert_uint_eq(x->offset, y->offset);
        ck_assert_uint_eq(x->next_offset, y->next_offset);
        ck_assert_uint_eq(x->size, y->size);
        ck_assert_int_eq(x->error, y->error);
        ck_assert_str_eq(x->reason, y->reason);
        ck_assert_str_eq(x->data ? x->data : "", y->data ? y->data : "");
        break;
    }
    case PROTO_STACKS: {
        const struct proto_stacks *x = &a->u.stacks, *y = &b->u.stacks;
        ck_assert_uint_eq(x->generation, y->generation);
        ck_assert_uint_eq(x->rank, y->rank);
        ck_assert_uint_eq(x->pid, y->pid);
        ck_assert_int_eq(x->stopped, y->stopped);
        ck_assert_str_eq(x->error, y->error);
        ck_assert_str_eq(x->text ? x->text : "", y->text ? y->text : "");
        ck_assert_str_eq(x->fr ? x->fr : "", y->fr ? y->fr : "");
        ck_assert_str_eq(x->ras ? x->ras : "", y->ras ? y->ras : "");
        break;
    }
    case PROTO_MEM_FILE: {
        const struct proto_mem_file *x = &a->u.mem_file, *y = &b->u.mem_file;
        ck_assert_str_eq(x->owner, y->owner);
        ck_assert_str_eq(x->tag, y->tag);
        ck_assert_str_eq(x->path, y->path);
        ck_assert_int_eq(x->restore, y->restore);
        ck_assert_int_eq(x->begin, y->begin);
        ck_assert_int_eq(x->end, y->end);
        ck_assert_uint_eq(x->offset, y->offset);
        ck_assert_uint_eq(x->size, y->size);
        ck_assert_uint_eq(x->len, y->len);
        ck_assert(x->len == 0 || memcmp(x->data, y->data, x->len) == 0);
        break;
    }
    case PROTO_MEM_FETCH:
        ck_assert_str_eq(a->u.mem_fetch.owner, b->u.mem_fetch.owner);
        ck_assert_str_eq(a->u.mem_fetch.tag, b->u.mem_fetch.tag);
        break;
    default:
        ck_abort_msg("unexpected type %d", a->type);
    }
}

/* encode, decode (exact-size buffer), compare, and the whole frame used. */
static void roundtrip(const struct proto_msg *m)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg back;
    size_t consumed = 0;
    int n = proto_encode(m, buf, sizeof(buf));

    ck_assert_int_gt(n, PROTO_HEADER_LEN);
    ck_assert_int_eq(decode_exact(buf, (size_t)n, &back, &consumed), PROTO_OK);
    ck_assert_uint_eq(consumed, (size_t)n);
    assert_msg_eq(m, &back);
    proto_msg_clear(&back);
}

/* The JSON payload of the sample of type, as a jansson object. */
static json_t *sample_payload(int type)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m;
    json_error_t jerr;
    json_t *obj;
    int n;

    sample(type, &m);
    n = proto_encode(&m, buf, sizeof(buf));
    proto_msg_clear(&m);
    ck_assert_int_gt(n, 0);
    obj = json_loadb((const char *)buf + PROTO_HEADER_LEN, (size_t)n - PROTO_HEADER_LEN, 0, &jerr);
    ck_assert_ptr_nonnull(obj);
    return obj;
}

/* ---- round trips ---- */

START_TEST(roundtrip_each_type)
{
    struct proto_msg m;

    sample(_i, &m);
    roundtrip(&m);
    proto_msg_clear(&m);
}
END_TEST

START_TEST(roundtrip_edges)
{
    struct proto_msg m;

    /* Largest values and fullest arrays. */
    sample(PROTO_HELLO, &m);
    m.u.hello.ndevices = PROTO_MAX_LOCAL_RANKS;
    for (uint32_t i = 0; i < PROTO_MAX_LOCAL_RANKS; i++)
        m.u.hello.devices[i] = UINT32_MAX - i;
    m.u.hello.device_mem_mb = PROTO_U64_MAX;
    m.u.hello.generation = PROTO_U64_MAX;
    memset(m.u.hello.node, 'n', PROTO_NAME_MAX - 1);
    m.u.hello.node[PROTO_NAME_MAX - 1] = '\0';
    m.u.hello.kind = PROTO_DEV_CPU;
    m.u.hello.agent_version[0] = '\0';
    roundtrip(&m);

    sample(PROTO_HEARTBEAT, &m);
    m.u.heartbeat.nranks = PROTO_MAX_LOCAL_RANKS;
    for (uint32_t i = 0; i < PROTO_MAX_LOCAL_RANKS; i++)
        m.u.heartbeat.ranks[i] = (struct proto_rank_beat){
            UINT32_MAX - i, (enum proto_rank_state)(i % 4), PROTO_U64_MAX - i,
            1.0 / (i + 3), 1e300 / (i + 1), 1.0 / (i + 1), (uint64_t)i, (int)(i % 2), PROTO_U64_MAX - i,
            (uint64_t)i << 30, (int)(i % 3 == 0), (enum proto_restore)(i % (PROTO_RESTORE_MAX + 1)),
            i % (PROTO_RESTORE_MAX + 1) ? PROTO_U64_MAX - 2 * i : 0, /* a step only with a source */
            (int)(i % 5 == 1), 1e300 / (i + 1), (int)(i % 2), i % 2 ? PROTO_U64_MAX - i : 0, PROTO_U64_MAX - i,
            (int)(i % 3 == 1), {0}, {0}, PROTO_SPLIT_S_MAX / (i + 1), PROTO_U64_MAX - i,
            {1.0 / (i + 7), 1.0 / (i + 9), 1.0 / (i + 11), 1.0 / (i + 13)}};
    for (uint32_t i = 0; i < PROTO_MAX_LOCAL_RANKS; i++) { /* labels at their longest */
        memset(m.u.heartbeat.ranks[i].where, 'a' + (int)(i % 26), PROTO_WHERE_MAX - 1);
        memset(m.u.heartbeat.ranks[i].waiting, i % 2 ? '"' : '\\', PROTO_WAITING_MAX - 1);
    }
    roundtrip(&m);

    /* The daemon's answer to a heartbeat: no ranks. */
    m.u.heartbeat.nranks = 0;
    roundtrip(&m);

    sample(PROTO_ASSIGN, &m);
    m.u.assign.world_size = UINT32_MAX;
    m.u.assign.nranks = PROTO_MAX_LOCAL_RANKS;
    for (uint32_t i = 0; i < PROTO_MAX_LOCAL_RANKS; i++)
        m.u.assign.ranks[i] = (struct proto_rank_slot){UINT32_MAX - 1 - i,
                                                       PROTO_MAX_LOCAL_RANKS - 1 - i, i};
    roundtrip(&m);
    proto_msg_clear(&m);

    sample(PROTO_RANK_EXIT, &m);
    m.u.rank_exit.exit_code = 0;
    m.u.rank_exit.signal = 0;
    roundtrip(&m);
    m.u.rank_exit.exit_code = 255;
    roundtrip(&m);

    sample(PROTO_COMMAND, &m);
    for (int a = PROTO_CMD_STOP; a <= PROTO_CMD_MAX; a++) {
        m.u.command.action = (enum proto_command)a;
        roundtrip(&m);
    }

    sample(PROTO_ERROR, &m);
    memset(m.u.error.reason, 'r', PROTO_REASON_MAX - 1);
    m.u.error.reason[PROTO_REASON_MAX - 1] = '\0';
    memset(m.u.error.code, 'c', sizeof(m.u.error.code) - 1);
    m.u.error.code[sizeof(m.u.error.code) - 1] = '\0';
    roundtrip(&m);
    m.u.error.reason[0] = '\0';
    roundtrip(&m);
}
END_TEST

/* The session of WELCOME and HELLO: optional (absent = 0), at most 2^53 - 1. */
START_TEST(session_is_optional_and_bounded)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m;
    for (int type = PROTO_HELLO; type <= PROTO_WELCOME; type += PROTO_WELCOME - PROTO_HELLO) {
        sample(type, &m);
        uint64_t *session = type == PROTO_HELLO ? &m.u.hello.session : &m.u.welcome.session;
        *session = 0;
        int n = proto_encode(&m, buf, sizeof(buf));
        ck_assert_int_gt(n, 0);
        ck_assert_ptr_null(memmem(buf, (size_t)n, "session", 7)); /* absent on the wire */
        roundtrip(&m);
        *session = PROTO_U64_MAX;
        roundtrip(&m);
        *session = PROTO_U64_MAX + 1;
        ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
        proto_msg_clear(&m); /* WELCOME's sample holds a job */
    }
}
END_TEST

/* The leader's term on the frames a daemon sends: optional (absent = 0, as
 * a daemon without a store sends them, so that older agents read them), at
 * most 2^53 - 1. */
START_TEST(term_is_optional_and_bounded)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    static const int types[] = {PROTO_WELCOME, PROTO_ASSIGN, PROTO_UNIQUE_ID, PROTO_COMMAND};
    struct proto_msg m;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        sample(types[i], &m);
        uint64_t *term = types[i] == PROTO_WELCOME ? &m.u.welcome.term
                         : types[i] == PROTO_ASSIGN ? &m.u.assign.term
                         : types[i] == PROTO_UNIQUE_ID ? &m.u.unique_id.term
                                                       : &m.u.command.term;
        *term = 0;
        int n = proto_encode(&m, buf, sizeof(buf));
        ck_assert_int_gt(n, 0);
        ck_assert_msg(!memmem(buf, (size_t)n, "\"term\"", 6), "%s: term 0 is on the wire", proto_type_name(types[i]));
        roundtrip(&m);
        *term = 1;
        n = proto_encode(&m, buf, sizeof(buf));
        ck_assert_ptr_nonnull(memmem(buf, (size_t)n, "\"term\":1", 8));
        roundtrip(&m);
        *term = PROTO_U64_MAX;
        roundtrip(&m);
        *term = PROTO_U64_MAX + 1;
        ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
        proto_msg_clear(&m);
    }
}
END_TEST

/* The fullest HELLO (every device a GPU with the longest name, every number
 * at its largest) fits what musterd reads before authentication. */
START_TEST(fullest_hello_fits_before_authentication)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m;
    sample(PROTO_HELLO, &m);
    struct proto_hello *h = &m.u.hello;
    memset(h->node, 'n', PROTO_NAME_MAX - 1);
    h->node[PROTO_NAME_MAX - 1] = '\0';
    memset(h->addr, 'a', PROTO_NAME_MAX - 1);
    h->addr[PROTO_NAME_MAX - 1] = '\0';
    h->kind = PROTO_DEV_GPU;
    h->ndevices = h->ngpus = PROTO_MAX_LOCAL_RANKS;
    for (uint32_t i = 0; i < PROTO_MAX_LOCAL_RANKS; i++) {
        h->devices[i] = 1000000 + i;
        memset(h->gpus[i].name, 'G', PROTO_NAME_MAX - 1);
        h->gpus[i].name[PROTO_NAME_MAX - 1] = '\0';
        h->gpus[i].total_mb = h->gpus[i].free_mb = PROTO_U64_MAX;
    }
    h->device_mem_mb = h->generation = h->session = h->host_mem_mb = PROTO_U64_MAX;
    h->free_port = 65535;
    memset(h->agent_version, 'v', sizeof(h->agent_version) - 1);
    h->agent_version[sizeof(h->agent_version) - 1] = '\0';
    h->preflight = 1;
    int n = proto_encode(&m, buf, sizeof(buf));
    ck_assert_int_gt(n, 0);
    ck_assert_int_le(n, SERVER_PREAUTH_FRAME_MAX);
    roundtrip(&m);
}
END_TEST

/* The fullest LOG_DATA (every byte one that JSON escapes) still fits a
 * frame; the other shapes of both log messages travel too. */
START_TEST(roundtrip_log_edges)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m;

    sample(PROTO_LOG_DATA, &m);
    free(m.u.log_data.data);
    m.u.log_data.data = malloc(PROTO_LOG_MAX + 1);
    ck_assert_ptr_nonnull(m.u.log_data.data);
    for (size_t i = 0; i < PROTO_LOG_MAX; i++)
        m.u.log_data.data[i] = "\"\\\n\t"[i % 4];
    m.u.log_data.data[PROTO_LOG_MAX] = '\0';
    m.u.log_data.offset = PROTO_U64_MAX - PROTO_LOG_MAX;
    m.u.log_data.next_offset = m.u.log_data.size = PROTO_U64_MAX;
    m.u.log_data.generation = m.u.log_data.newest = PROTO_U64_MAX;
    m.u.log_data.id = m.u.log_data.rank = UINT32_MAX;
    ck_assert_int_le(proto_encode(&m, buf, sizeof(buf)), (int)PROTO_MAX_FRAME);
    roundtrip(&m);

    /* A NULL data reads as "" (a hand-built answer with no bytes). */
    free(m.u.log_data.data);
    m.u.log_data.data = NULL;
    m.u.log_data.next_offset = m.u.log_data.offset;
    m.u.log_data.error = PROTO_LOG_NO_LOG;
    strcpy(m.u.log_data.reason, "no log of rank 9 on node b");
    m.u.log_data.newest = 0;
    roundtrip(&m);
    proto_msg_clear(&m);

    sample(PROTO_LOG_REQUEST, &m);
    m.u.log_request.offset = 0;
    m.u.log_request.tail = UINT32_MAX;
    m.u.log_request.max = 1;
    m.u.log_request.generation = 0;
    roundtrip(&m);
}
END_TEST

/* Raw log bytes become LOG_DATA text byte for byte: what it refuses is replaced. */
START_TEST(log_sanitize_keeps_every_byte)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    char raw[] = "ok \xc3\xbc\n\xff\xfe bad\x00nul\x1b[31mred\r\n\xe2\x82";
    size_t len = sizeof(raw) - 1;
    struct proto_msg m;

    proto_log_sanitize(raw, len);
    ck_assert_uint_eq(strlen(raw), len);
    ck_assert_str_eq(raw, "ok \xc3\xbc\n?? bad nul [31mred \n??");

    sample(PROTO_LOG_DATA, &m);
    free(m.u.log_data.data);
    m.u.log_data.data = strdup(raw);
    m.u.log_data.next_offset = m.u.log_data.offset + len;
    m.u.log_data.size = m.u.log_data.next_offset;
    ck_assert_int_gt(proto_encode(&m, buf, sizeof(buf)), 0);
    roundtrip(&m);
    proto_msg_clear(&m);
}
END_TEST

START_TEST(non_finite_loss_travels_as_null)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m, back;
    size_t consumed;
    int n;

    sample(PROTO_HEARTBEAT, &m);
    m.u.heartbeat.ranks[0].loss = INFINITY;
    m.u.heartbeat.ranks[1].loss = -INFINITY;
    m.u.heartbeat.ranks[2].loss = NAN;
    n = proto_encode(&m, buf, sizeof(buf));
    ck_assert_int_gt(n, 0);
    ck_assert_ptr_nonnull(memmem(buf, (size_t)n, "\"loss\":null", 11));
    ck_assert_int_eq(decode_exact(buf, (size_t)n, &back, &consumed), PROTO_OK);
    for (int i = 0; i < 3; i++)
        ck_assert(isnan(back.u.heartbeat.ranks[i].loss));
    /* An integer is a number too. */
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT,
        "{\"generation\":1,\"seq\":1,\"ranks\":[{\"rank\":0,\"state\":\"running\","
        "\"step\":5,\"loss\":3,\"tokens_per_s\":100,\"comm_frac\":0}]}"), PROTO_OK);
}
END_TEST

START_TEST(encode_keeps_callers_job_reference)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m;
    size_t before;

    sample(PROTO_ASSIGN, &m);
    before = m.u.assign.job->refcount;
    ck_assert_int_gt(proto_encode(&m, buf, sizeof(buf)), 0);
    ck_assert_uint_eq(m.u.assign.job->refcount, before);
    proto_msg_clear(&m);
    ck_assert_ptr_null(m.u.assign.job);
    proto_msg_clear(&m); /* twice is safe */
    proto_msg_clear(NULL);
}
END_TEST

START_TEST(decoded_job_outlives_the_frame)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m, back;
    size_t consumed;
    int n;

    sample(PROTO_ASSIGN, &m);
    n = proto_encode(&m, buf, sizeof(buf));
    ck_assert_int_eq(decode_exact(buf, (size_t)n, &back, &consumed), PROTO_OK);
    ck_assert_uint_eq(back.u.assign.job->refcount, 1);
    ck_assert_str_eq(json_string_value(json_object_get(back.u.assign.job, "name")), "demo");
    proto_msg_clear(&back);
    proto_msg_clear(&m);
}
END_TEST

START_TEST(frame_layout_is_as_documented)
{
    uint8_t buf[256];
    struct proto_msg m;
    const char *want = "{\"generation\":4,\"action\":\"stop\"}";
    int n;

    sample(PROTO_COMMAND, &m);
    m.u.command.term = 0; /* PROTOCOL.md's example is a daemon's without a store */
    n = proto_encode(&m, buf, sizeof(buf));
    ck_assert_int_eq(n, PROTO_HEADER_LEN + (int)strlen(want));
    ck_assert_mem_eq(buf, "\x00\x00\x00\x20\x00\x02\x00\x0a", PROTO_HEADER_LEN);
    ck_assert_mem_eq(buf + PROTO_HEADER_LEN, want, strlen(want));
}
END_TEST

/* ---- encoder refusals ---- */

START_TEST(encode_refuses_what_would_not_decode)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m;

    sample(PROTO_HELLO, &m);
    strcpy(m.u.hello.node, "bad name");
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HELLO, &m);
    strcpy(m.u.hello.domain, "rack 7"); /* a placement label is a name */
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    memset(m.u.hello.node, 'a', sizeof(m.u.hello.node)); /* no NUL */
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HELLO, &m);
    m.u.hello.ndevices = 0;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    m.u.hello.ndevices = PROTO_MAX_LOCAL_RANKS + 1;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HELLO, &m);
    m.u.hello.generation = PROTO_U64_MAX + 1;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HELLO, &m);
    m.u.hello.kind = (enum proto_device_kind)2;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);

    sample(PROTO_HEARTBEAT, &m);
    m.u.heartbeat.nranks = PROTO_MAX_LOCAL_RANKS + 1;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HEARTBEAT, &m);
    m.u.heartbeat.ranks[0].state = (enum proto_rank_state)4;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HEARTBEAT, &m);
    m.u.heartbeat.ranks[0].tokens_per_s = NAN;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HEARTBEAT, &m);
    m.u.heartbeat.ranks[0].comm_frac = 1.0001;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);

    sample(PROTO_ASSIGN, &m);
    json_decref(m.u.assign.job);
    m.u.assign.job = json_array();
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    json_decref(m.u.assign.job);
    m.u.assign.job = NULL;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    m.u.assign.job = json_object();
    m.u.assign.nranks = PROTO_MAX_LOCAL_RANKS + 1;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    proto_msg_clear(&m);

    sample(PROTO_COMMAND, &m);
    m.u.command.action = (enum proto_command)0;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_RANK_EXIT, &m);
    m.u.rank_exit.exit_code = 1; /* and signal 9: which is it? */
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_REJECT, &m);
    strcpy(m.u.reject.reason, "cut \xe2\x82"); /* invalid UTF-8 */
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_REJECT, &m);
    strcpy(m.u.reject.code, "Auth");
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);

    sample(PROTO_LOG_REQUEST, &m);
    m.u.log_request.max = 0;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    m.u.log_request.max = PROTO_LOG_MAX + 1;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_LOG_REQUEST, &m);
    m.u.log_request.tail = 100; /* and offset 123456: which is it? */
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);

    struct {
        const char *data;
        int64_t next_delta; /* next_offset - offset - strlen(data) */
        int64_t size_delta; /* size - next_offset */
        enum proto_log_error error;
        const char *reason;
    } bad_data[] = {
        {"abc", 1, 0, PROTO_LOG_OK, ""},         /* next_offset is not offset + 3 */
        {"abc", -1, 0, PROTO_LOG_OK, ""},
        {"abc", 0, -1, PROTO_LOG_OK, ""},        /* more bytes than were written */
        {"a\x01", 0, 0, PROTO_LOG_OK, ""},        /* a control character */
        {"a\r\n", 0, 0, PROTO_LOG_OK, ""},
        {"cut \xe2\x82", 0, 0, PROTO_LOG_OK, ""}, /* invalid UTF-8 */
        {"abc", 0, 0, PROTO_LOG_NO_LOG, "none"}, /* an error carries no bytes */
        {"", 0, 0, PROTO_LOG_NO_LOG, ""},        /* and says why */
        {"", 0, 0, (enum proto_log_error)(PROTO_LOG_ERROR_MAX + 1), "x"},
    };
    for (size_t i = 0; i < sizeof(bad_data) / sizeof(bad_data[0]); i++) {
        sample(PROTO_LOG_DATA, &m);
        struct proto_log_data *d = &m.u.log_data;
        free(d->data);
        d->data = strdup(bad_data[i].data);
        d->next_offset = (uint64_t)((int64_t)(d->offset + strlen(d->data)) + bad_data[i].next_delta);
        d->size = (uint64_t)((int64_t)d->next_offset + bad_data[i].size_delta);
        d->error = bad_data[i].error;
        strcpy(d->reason, bad_data[i].reason);
        ck_assert_msg(proto_encode(&m, buf, sizeof(buf)) == PROTO_E_RANGE, "bad LOG_DATA %zu encoded", i);
        proto_msg_clear(&m);
    }
    sample(PROTO_LOG_DATA, &m);
    free(m.u.log_data.data);
    m.u.log_data.data = calloc(1, PROTO_LOG_MAX + 2);
    memset(m.u.log_data.data, 'x', PROTO_LOG_MAX + 1); /* one byte too many */
    m.u.log_data.next_offset = m.u.log_data.size = m.u.log_data.offset + PROTO_LOG_MAX + 1;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    proto_msg_clear(&m);

    m.type = (enum proto_type)0;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_TYPE);
    m.type = (enum proto_type)(PROTO_TYPE_MAX + 1);
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_TYPE);
}
END_TEST

START_TEST(encode_reports_nospace_for_every_short_buffer)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m;

    for (int t = PROTO_HELLO; t <= NTYPES; t++) {
        int n;
        sample(t, &m);
        n = proto_encode(&m, buf, sizeof(buf));
        ck_assert_int_gt(n, 0);
        for (int cap = 0; cap < n; cap++) {
            uint8_t *small = malloc((size_t)cap + 1);
            ck_assert_int_eq(proto_encode(&m, small, (size_t)cap), PROTO_E_NOSPACE);
            free(small);
        }
        ck_assert_int_eq(proto_encode(&m, buf, (size_t)n), n);
        proto_msg_clear(&m);
    }
}
END_TEST

START_TEST(encode_refuses_oversize_job)
{
    static uint8_t buf[2 * PROTO_MAX_FRAME];
    static char big[PROTO_MAX_PAYLOAD];
    struct proto_msg m;

    memset(big, 'x', sizeof(big) - 1);
    sample(PROTO_ASSIGN, &m);
    json_object_set_new(m.u.assign.job, "blob", json_string(big));
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    proto_msg_clear(&m);
}
END_TEST

/* ---- decoder: header errors, from hand-built bytes ---- */

START_TEST(header_errors_as_soon_as_header_is_there)
{
    uint8_t h[PROTO_HEADER_LEN];
    struct proto_msg m;
    size_t consumed = 99;

    put_header(h, PROTO_MAX_PAYLOAD + 1, PROTO_VERSION, PROTO_HELLO);
    ck_assert_int_eq(decode_exact(h, sizeof(h), &m, &consumed), PROTO_E_OVERSIZE);
    ck_assert_uint_eq(consumed, 0);
    put_header(h, UINT32_MAX, PROTO_VERSION, PROTO_HELLO);
    ck_assert_int_eq(decode_exact(h, sizeof(h), &m, &consumed), PROTO_E_OVERSIZE);
    put_header(h, PROTO_MAX_PAYLOAD, PROTO_VERSION, PROTO_HELLO);
    ck_assert_int_eq(decode_exact(h, sizeof(h), &m, &consumed), PROTO_NEED_MORE);

    put_header(h, 2, 0, PROTO_HELLO);
    ck_assert_int_eq(decode_exact(h, sizeof(h), &m, &consumed), PROTO_E_VERSION);
    put_header(h, 2, PROTO_VERSION + 1, PROTO_HELLO);
    ck_assert_int_eq(decode_exact(h, sizeof(h), &m, &consumed), PROTO_E_VERSION);
    put_header(h, 2, 0xffff, PROTO_HELLO);
    ck_assert_int_eq(decode_exact(h, sizeof(h), &m, &consumed), PROTO_E_VERSION);

    put_header(h, 2, PROTO_VERSION, 0);
    ck_assert_int_eq(decode_exact(h, sizeof(h), &m, &consumed), PROTO_E_TYPE);
    put_header(h, 2, PROTO_VERSION, PROTO_TYPE_MAX + 1);
    ck_assert_int_eq(decode_exact(h, sizeof(h), &m, &consumed), PROTO_E_TYPE);
    put_header(h, 2, PROTO_VERSION, 0xffff);
    ck_assert_int_eq(decode_exact(h, sizeof(h), &m, &consumed), PROTO_E_TYPE);
    ck_assert_uint_eq(consumed, 0);

    /* Same answers from a stream that ended there. */
    put_header(h, PROTO_MAX_PAYLOAD + 1, PROTO_VERSION, PROTO_HELLO);
    ck_assert_int_eq(proto_decode_eof(h, sizeof(h), &m, &consumed), PROTO_E_OVERSIZE);
}
END_TEST

/* ---- decoder: payload errors, from hand-written JSON ---- */

#define NONCE_OK "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define HELLO_OK "{\"node\":\"n1\",\"addr\":\"10.0.0.1\",\"kind\":\"gpu\",\"devices\":[0,1]," \
                 "\"device_mem_mb\":81920,\"generation\":0,\"free_port\":0,\"agent_version\":\"0.1.0\"," \
                 "\"nonce\":\"" NONCE_OK "\"}"

/* Attack: HELLO's domain (hot spares' placement label) of odd bytes and
 * lengths: only 1..63 characters of [A-Za-z0-9._-] decode. */
#define HELLO_DOMAIN(d) "{\"node\":\"n1\",\"addr\":\"10.0.0.1\",\"kind\":\"gpu\",\"devices\":[0,1]," \
                        "\"device_mem_mb\":81920,\"generation\":0,\"free_port\":0,\"agent_version\":\"0.1.0\"," \
                        "\"nonce\":\"" NONCE_OK "\",\"domain\":" d "}"
START_TEST(hello_domain_of_odd_bytes_is_refused)
{
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_DOMAIN("\"rack-7.nvl_0\"")), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_DOMAIN(
        "\"abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijk\"")), PROTO_OK); /* 63 */
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_DOMAIN(
        "\"abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijkl\"")), PROTO_E_RANGE); /* 64 */
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_DOMAIN("\"\"")), PROTO_E_RANGE); /* absent is none, empty is not */
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_DOMAIN("\"rack 7\"")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_DOMAIN("\"rack/7\"")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_DOMAIN("\"r\\u00e9\"")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_DOMAIN("\"r\\n7\"")), PROTO_E_RANGE);
    ck_assert_int_ne(decode_text(PROTO_HELLO, HELLO_DOMAIN("\"a\\u0000b\"")), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_DOMAIN("7")), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_DOMAIN("null")), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_DOMAIN("[\"r1\"]")), PROTO_E_FIELD_TYPE);
}
END_TEST
#undef HELLO_DOMAIN

START_TEST(hand_written_frames_decode)
{
    ck_assert_int_eq(decode_text(PROTO_HELLO, HELLO_OK), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_CHALLENGE, "{\"nonce\":\"" NONCE_OK "\",\"hmac\":\"" NONCE_OK "\"}"),
                     PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_RESPONSE, "{\"hmac\":\"" NONCE_OK "\"}"), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_WELCOME, "{\"lease_ms\":3,\"heartbeat_interval_ms\":1,"
                                                "\"heartbeat_timeout_ms\":2}"), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_REJECT, "{\"code\":\"auth\",\"reason\":\"\"}"), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, "{\"generation\":1,\"world_size\":1,"
        "\"ranks\":[{\"rank\":0,\"local_rank\":0,\"device\":0}],\"node_rank\":0,\"nnodes\":1,"
        "\"restart_count\":0,\"master_addr\":\"h\",\"master_port\":29500,\"job\":{}}"), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":0,\"seq\":0,\"ranks\":[]}"),
                     PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_RANK_EXIT, "{\"generation\":1,\"rank\":0,\"exit_code\":0,"
                                                  "\"signal\":0}"), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "{\"generation\":0,\"action\":\"shutdown\"}"),
                     PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_LOG_REQUEST, "{\"id\":1,\"rank\":0,\"generation\":0,"
                                                    "\"offset\":0,\"tail\":4096,\"max\":65536}"), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, "{\"id\":1,\"rank\":0,\"generation\":2,\"newest\":2,"
        "\"offset\":10,\"next_offset\":15,\"size\":20,\"error\":\"\",\"reason\":\"\",\"data\":\"ab\\n\\u00fc\"}"),
        PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, "{\"id\":1,\"rank\":0,\"generation\":0,\"newest\":0,"
        "\"offset\":0,\"next_offset\":0,\"size\":0,\"error\":\"no_log\",\"reason\":\"none\",\"data\":\"\"}"),
        PROTO_OK);
    /* Whitespace inside the object is fine. */
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "{ \"generation\" : 2 ,\n\"action\":\"start\" }"),
                     PROTO_OK);
}
END_TEST

START_TEST(json_errors)
{
    uint8_t frame[64];
    struct proto_msg m;
    size_t n;

    ck_assert_int_eq(decode_text(PROTO_COMMAND, ""), PROTO_E_JSON); /* zero length */
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "{"), PROTO_E_JSON);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "{\"generation\":1,}"), PROTO_E_JSON);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "[]"), PROTO_E_JSON);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "[{\"generation\":1,\"action\":\"stop\"}]"),
                     PROTO_E_JSON);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "\"stop\""), PROTO_E_JSON);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "42"), PROTO_E_JSON);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "null"), PROTO_E_JSON);
    /* Trailing bytes, whitespace included. */
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "{\"generation\":1,\"action\":\"stop\"} "),
                     PROTO_E_JSON);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "{\"generation\":1,\"action\":\"stop\"}x"),
                     PROTO_E_JSON);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "{\"generation\":1,\"action\":\"stop\"}{}"),
                     PROTO_E_JSON);
    /* Duplicate keys. */
    ck_assert_int_eq(decode_text(PROTO_COMMAND,
                                 "{\"generation\":1,\"action\":\"stop\",\"generation\":2}"),
                     PROTO_E_JSON);
    /* Invalid UTF-8, an escaped NUL, a raw NUL, a number out of jansson's range. */
    ck_assert_int_eq(decode_text(PROTO_ERROR, "{\"code\":\"x\",\"reason\":\"\xff\"}"), PROTO_E_JSON);
    ck_assert_int_eq(decode_text(PROTO_ERROR, "{\"code\":\"x\",\"reason\":\"a\\u0000b\"}"),
                     PROTO_E_JSON);
    n = raw_frame(frame, PROTO_VERSION, PROTO_COMMAND, "{\"generation\":1\0}", 17);
    ck_assert_int_eq(decode_exact(frame, n, &m, NULL), PROTO_E_JSON);
    ck_assert_int_eq(decode_text(PROTO_COMMAND,
                                 "{\"generation\":99999999999999999999,\"action\":\"stop\"}"),
                     PROTO_E_JSON);
}
END_TEST

START_TEST(missing_fields)
{
    ck_assert_int_eq(decode_text(PROTO_HELLO,
        "{\"addr\":\"10.0.0.1\",\"kind\":\"gpu\",\"devices\":[0],\"device_mem_mb\":1,"
        "\"generation\":0,\"agent_version\":\"x\"}"), PROTO_E_MISSING);
    ck_assert_int_eq(decode_text(PROTO_CHALLENGE, "{}"), PROTO_E_MISSING);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, "{\"generation\":1,\"world_size\":1,"
        "\"ranks\":[{\"rank\":0,\"local_rank\":0,\"device\":0}]}"), PROTO_E_MISSING);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, "{\"generation\":1,\"world_size\":1,"
        "\"ranks\":[{\"rank\":0,\"device\":0}],\"job\":{}}"), PROTO_E_MISSING);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":1,\"seq\":1,\"ranks\":"
        "[{\"rank\":0,\"state\":\"running\",\"loss\":1,\"tokens_per_s\":1,\"comm_frac\":0}]}"),
        PROTO_E_MISSING);
    ck_assert_int_eq(decode_text(PROTO_RANK_EXIT, "{\"generation\":1,\"rank\":0,\"exit_code\":0}"),
                     PROTO_E_MISSING);
}
END_TEST

/* Every field of every message (and of the nested objects), removed; the
 * optional fields (a rank's checkpoint_step, silent, rejoin, yielded, step_s,
 * step_age_ms, total_steps, where, waiting and stopped, STACKS' stopped and
 * error, MEM_FILE's restore, begin and end, a heartbeat's ack and
 * free_port, a rank exit's reason and detail, the session of HELLO and
 * WELCOME) decode as 0 or "" instead. */
START_TEST(every_field_is_required)
{
    for (int t = PROTO_HELLO; t <= NTYPES; t++) {
        json_t *base = sample_payload(t);
        const char *key;
        json_t *value;

        ck_assert_int_eq(decode_json((uint16_t)t, base), PROTO_OK);
        json_object_foreach(base, key, value) {
            json_t *copy = json_deep_copy(base);
            json_object_del(copy, key);
            int optional = (t == PROTO_RANK_EXIT && (!strcmp(key, "reason") || !strcmp(key, "detail"))) ||
                           (t == PROTO_HEARTBEAT && (!strcmp(key, "free_port") || !strcmp(key, "ack"))) ||
                           ((t == PROTO_HELLO || t == PROTO_WELCOME) && !strcmp(key, "session")) ||
                           (t == PROTO_HELLO && (!strcmp(key, "gpus") || !strcmp(key, "host_mem_mb") ||
                                                 !strcmp(key, "preflight") || !strcmp(key, "domain"))) ||
                           (t == PROTO_WELCOME && (!strcmp(key, "time_ms") || !strcmp(key, "job"))) ||
                           (t == PROTO_PREFLIGHT && (!strcmp(key, "trainer") || !strcmp(key, "checkpoint"))) ||
                           (t == PROTO_STACKS && (!strcmp(key, "stopped") || !strcmp(key, "error") || !strcmp(key, "fr") ||
                                                  !strcmp(key, "ras"))) ||
                           (t == PROTO_MEM_FILE && (!strcmp(key, "restore") || !strcmp(key, "begin") ||
                                                    !strcmp(key, "end"))) ||
                           ((t == PROTO_WELCOME || t == PROTO_ASSIGN || t == PROTO_UNIQUE_ID ||
                             t == PROTO_COMMAND) && !strcmp(key, "term"));
            ck_assert_msg(decode_json((uint16_t)t, copy) == (optional ? PROTO_OK : PROTO_E_MISSING),
                          "%s without %s", proto_type_name((enum proto_type)t), key);
            json_decref(copy);

            if (json_is_array(value) && json_is_object(json_array_get(value, 0))) {
                const char *inner;
                json_t *iv;
                json_object_foreach(json_array_get(value, 0), inner, iv) {
                    copy = json_deep_copy(base);
                    json_object_del(json_array_get(json_object_get(copy, key), 0), inner);
                    /* restore_from and restore_step go together, and so do split_s and its
                     * shares: one without the other is missing */
                    int want = !strcmp(inner, "checkpoint_step") || !strcmp(inner, "silent") ||
                                       !strcmp(inner, "step_bytes") || !strcmp(inner, "peak_mem") ||
                                       !strcmp(inner, "rejoin") || !strcmp(inner, "yielded") ||
                                       !strcmp(inner, "step_s") || !strcmp(inner, "step_age_ms") ||
                                       !strcmp(inner, "total_steps") || !strcmp(inner, "where") ||
                                       !strcmp(inner, "waiting") || !strcmp(inner, "stopped") ||
                                       !strcmp(inner, "split_steps")
                                   ? PROTO_OK
                                   : PROTO_E_MISSING;
                    ck_assert_msg(decode_json((uint16_t)t, copy) == want,
                                  "%s %s[0] without %s", proto_type_name((enum proto_type)t),
                                  key, inner);
                    json_decref(copy);
                }
            }
        }
        json_decref(base);
    }
}
END_TEST

static json_t *wrong_type_for(json_t *v)
{
    if (json_is_string(v))
        return json_integer(1);
    if (json_is_number(v) || json_is_null(v))
        return json_string("1");
    if (json_is_array(v))
        return json_object();
    return json_array();
}

/* Every field of every message given a value of another JSON type. */
START_TEST(every_field_checks_its_type)
{
    for (int t = PROTO_HELLO; t <= NTYPES; t++) {
        json_t *base = sample_payload(t);
        const char *key;
        json_t *value;

        json_object_foreach(base, key, value) {
            json_t *copy = json_deep_copy(base);
            json_object_set_new(copy, key, wrong_type_for(value));
            ck_assert_msg(decode_json((uint16_t)t, copy) == PROTO_E_FIELD_TYPE,
                          "%s with a wrong type for %s", proto_type_name((enum proto_type)t), key);
            json_decref(copy);

            if (json_is_array(value) && json_array_size(value) > 0) {
                json_t *first = json_array_get(value, 0);
                copy = json_deep_copy(base);
                json_array_set_new(json_object_get(copy, key), 0, wrong_type_for(first));
                ck_assert_msg(decode_json((uint16_t)t, copy) == PROTO_E_FIELD_TYPE,
                              "%s with a wrong type for %s[0]", proto_type_name((enum proto_type)t), key);
                json_decref(copy);
            }
            if (json_is_array(value) && json_is_object(json_array_get(value, 0))) {
                const char *inner;
                json_t *iv;
                json_object_foreach(json_array_get(value, 0), inner, iv) {
                    copy = json_deep_copy(base);
                    json_object_set_new(json_array_get(json_object_get(copy, key), 0), inner,
                                        wrong_type_for(iv));
                    ck_assert_msg(decode_json((uint16_t)t, copy) == PROTO_E_FIELD_TYPE,
                                  "%s with a wrong type for %s[0].%s",
                                  proto_type_name((enum proto_type)t), key, inner);
                    json_decref(copy);
                }
            }
        }
        json_decref(base);
    }
}
END_TEST

START_TEST(field_type_errors)
{
    ck_assert_int_eq(decode_text(PROTO_HELLO,
        "{\"node\":5,\"addr\":\"a\",\"kind\":\"gpu\",\"devices\":[0],\"device_mem_mb\":1,"
        "\"generation\":0,\"agent_version\":\"x\"}"), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HELLO,
        "{\"node\":\"n\",\"addr\":\"a\",\"kind\":\"gpu\",\"devices\":\"0,1\",\"device_mem_mb\":1,"
        "\"generation\":0,\"agent_version\":\"x\"}"), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HELLO,
        "{\"node\":\"n\",\"addr\":\"a\",\"kind\":\"gpu\",\"devices\":[0,\"1\"],\"device_mem_mb\":1,"
        "\"generation\":0,\"agent_version\":\"x\"}"), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HELLO,
        "{\"node\":\"n\",\"addr\":\"a\",\"kind\":1,\"devices\":[0],\"device_mem_mb\":1,"
        "\"generation\":0,\"agent_version\":\"x\"}"), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":1,\"seq\":1.5,\"ranks\":[]}"),
                     PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":null,\"seq\":1,\"ranks\":[]}"),
                     PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":1,\"seq\":1,\"ranks\":[1]}"),
                     PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":1,\"seq\":1,\"ranks\":"
        "[{\"rank\":0,\"state\":\"running\",\"step\":1,\"loss\":\"high\",\"tokens_per_s\":1,"
        "\"comm_frac\":0}]}"), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":1,\"seq\":1,\"ranks\":"
        "[{\"rank\":0,\"state\":\"running\",\"step\":1,\"loss\":1,\"tokens_per_s\":null,"
        "\"comm_frac\":0}]}"), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, "{\"generation\":1,\"world_size\":1,"
        "\"ranks\":[{\"rank\":0,\"local_rank\":0,\"device\":0}],\"node_rank\":0,\"nnodes\":1,\"restart_count\":0,\"master_addr\":\"h\",\"master_port\":29500,\"job\":[]}"), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, "{\"generation\":1,\"world_size\":1,"
        "\"ranks\":[{\"rank\":0,\"local_rank\":0,\"device\":0}],\"node_rank\":0,\"nnodes\":1,\"restart_count\":0,\"master_addr\":\"h\",\"master_port\":29500,\"job\":\"demo\"}"),
        PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_CHALLENGE, "{\"nonce\":5}"), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_WELCOME, "{\"heartbeat_interval_ms\":true,"
        "\"heartbeat_timeout_ms\":2,\"lease_ms\":3}"), PROTO_E_FIELD_TYPE);
}
END_TEST

/* HELLO with one field replaced by the JSON text value. */
static int hello_with(const char *field, const char *value)
{
    json_error_t jerr;
    json_t *base = json_loads(HELLO_OK, 0, &jerr);
    json_t *v = json_loads(value, JSON_DECODE_ANY, &jerr);
    int rc;

    ck_assert_ptr_nonnull(base);
    ck_assert_msg(v != NULL, "bad test value %s", value);
    json_object_set_new(base, field, v);
    rc = decode_json(PROTO_HELLO, base);
    json_decref(base);
    return rc;
}

START_TEST(range_errors)
{
    char text[1024];

    /* Bad hex: wrong digits, wrong case, wrong length. */
    ck_assert_int_eq(decode_text(PROTO_CHALLENGE, "{\"nonce\":\"zz112233445566778899aabbccddeeff"
                                                  "00112233445566778899aabbccddeeff\"}"), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_CHALLENGE, "{\"nonce\":\"00112233445566778899AABBCCDDEEFF"
                                                  "00112233445566778899aabbccddeeff\"}"), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_RESPONSE, "{\"hmac\":\"" NONCE_OK "0\"}"), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_RESPONSE, "{\"hmac\":\"\"}"), PROTO_E_RANGE);
    snprintf(text, sizeof(text), "{\"generation\":1,\"id\":\"%s%s%s%s\"}", NONCE_OK, NONCE_OK,
             NONCE_OK, NONCE_OK);
    ck_assert_int_eq(decode_text(PROTO_UNIQUE_ID, text), PROTO_OK);
    snprintf(text, sizeof(text), "{\"generation\":1,\"id\":\"%s%s%s%.62s\"}", NONCE_OK, NONCE_OK,
             NONCE_OK, NONCE_OK);
    ck_assert_int_eq(decode_text(PROTO_UNIQUE_ID, text), PROTO_E_RANGE);

    /* Node names, addresses, versions. */
    ck_assert_int_eq(hello_with("node", "\"bad name\""), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("node", "\"\""), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("node", "\"n/1\""), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("node", "\"n\xc3\xbc\""), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("node", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\""),
                     PROTO_E_RANGE); /* 64 bytes */
    ck_assert_int_eq(hello_with("node", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\""),
                     PROTO_OK); /* 63 bytes */
    ck_assert_int_eq(hello_with("addr", "\"\""), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("addr", "\"10.0.0.1 x\""), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("addr", "\"[fe80::1%eth0]\""), PROTO_OK);
    ck_assert_int_eq(hello_with("agent_version", "\"0123456789012345678901234567890\""), PROTO_OK);
    ck_assert_int_eq(hello_with("agent_version", "\"01234567890123456789012345678901\""),
                     PROTO_E_RANGE); /* 32 bytes does not fit */
    ck_assert_int_eq(hello_with("agent_version", "\"tab\\there\""), PROTO_E_RANGE);

    /* A PREFLIGHT's checkpoint name: bounded, UTF-8, no control character (it reaches terminals). */
    static const struct {
        const char *name; /* JSON string body */
        int rc;
    } ckpts[] = {{"", PROTO_OK}, {"step\\u00e9 40", PROTO_OK}, {"a\\u001b[2Jb", PROTO_E_RANGE},
                 {"a\\nb", PROTO_E_RANGE}, {"a\\u009bb", PROTO_E_RANGE}, {"a\\u007fb", PROTO_E_RANGE}};
    for (size_t i = 0; i < sizeof(ckpts) / sizeof(ckpts[0]); i++) {
        snprintf(text, sizeof(text), "{\"fit\":true,\"reason\":\"\",\"checkpoint\":\"%s\"}", ckpts[i].name);
        ck_assert_msg(decode_text(PROTO_PREFLIGHT, text) == ckpts[i].rc, "checkpoint \"%s\"", ckpts[i].name);
    }
    for (int len = 200; len <= 201; len++) {
        snprintf(text, sizeof(text), "{\"fit\":true,\"reason\":\"\",\"checkpoint\":\"%0*d\"}", len, 0);
        ck_assert_int_eq(decode_text(PROTO_PREFLIGHT, text), len == 200 ? PROTO_OK : PROTO_E_RANGE);
    }

    /* Negative counts, beyond 2^53-1, beyond u32. */
    ck_assert_int_eq(hello_with("generation", "-1"), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("device_mem_mb", "9007199254740991"), PROTO_OK);
    ck_assert_int_eq(hello_with("device_mem_mb", "9007199254740992"), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("devices", "[-1]"), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("devices", "[4294967296]"), PROTO_E_RANGE);

    /* Arrays: too long, empty, duplicates. */
    strcpy(text, "[0");
    for (int i = 1; i <= PROTO_MAX_LOCAL_RANKS; i++)
        sprintf(text + strlen(text), ",%d", i);
    strcat(text, "]");
    ck_assert_int_eq(hello_with("devices", text), PROTO_E_RANGE); /* 65 */
    ck_assert_int_eq(hello_with("devices", "[]"), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("devices", "[0,1,0]"), PROTO_E_RANGE);

    /* Unknown enum strings. */
    ck_assert_int_eq(hello_with("kind", "\"tpu\""), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("kind", "\"GPU\""), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "{\"generation\":1,\"action\":\"explode\"}"),
                     PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":1,\"seq\":1,\"ranks\":"
        "[{\"rank\":0,\"state\":\"dead\",\"step\":1,\"loss\":1,\"tokens_per_s\":1,"
        "\"comm_frac\":0}]}"), PROTO_E_RANGE);

    /* Strings that do not fit their buffer; codes that are not tokens. */
    snprintf(text, sizeof(text), "{\"code\":\"x\",\"reason\":\"%0512d\"}", 0);
    ck_assert_int_eq(decode_text(PROTO_REJECT, text), PROTO_E_RANGE);
    snprintf(text, sizeof(text), "{\"code\":\"x\",\"reason\":\"%0511d\"}", 0);
    ck_assert_int_eq(decode_text(PROTO_REJECT, text), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_ERROR, "{\"code\":\"\",\"reason\":\"r\"}"), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ERROR, "{\"code\":\"Auth\",\"reason\":\"r\"}"), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ERROR,
        "{\"code\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\",\"reason\":\"r\"}"), PROTO_E_RANGE);

    /* WELCOME: zero or beyond u32. */
    ck_assert_int_eq(decode_text(PROTO_WELCOME, "{\"heartbeat_interval_ms\":0,"
        "\"heartbeat_timeout_ms\":2,\"lease_ms\":3}"), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_WELCOME, "{\"heartbeat_interval_ms\":1,"
        "\"heartbeat_timeout_ms\":2,\"lease_ms\":4294967296}"), PROTO_E_RANGE);

    /* ASSIGN layout rules. */
#define ASSIGN_MORE(gen, ws, ranks, more) "{\"generation\":" gen ",\"world_size\":" ws ",\"ranks\":[" \
                               ranks "]," more ",\"job\":{}}"
#define ASSIGN(gen, ws, ranks) ASSIGN_MORE(gen, ws, ranks, "\"node_rank\":0,\"nnodes\":1,\"restart_count\":0," \
                                                         "\"master_addr\":\"h\",\"master_port\":29500")
#define SLOT(r, l, d) "{\"rank\":" r ",\"local_rank\":" l ",\"device\":" d "}"
    /* MASTER_PORT in 1..65535, a node_rank below nnodes, an address to reach rank 0 at. */
#define MORE(nr, nn, addr, port) "\"node_rank\":" nr ",\"nnodes\":" nn ",\"restart_count\":0,\"master_addr\":" \
                                 addr ",\"master_port\":" port
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN_MORE("1", "1", SLOT("0", "0", "0"), MORE("0", "1", "\"h\"", "0"))),
                     PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN_MORE("1", "1", SLOT("0", "0", "0"),
                                                           MORE("0", "1", "\"h\"", "65536"))), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN_MORE("1", "1", SLOT("0", "0", "0"), MORE("2", "2", "\"h\"", "1"))),
                     PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN_MORE("1", "1", SLOT("0", "0", "0"), MORE("0", "1", "\"\"", "1"))),
                     PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN_MORE("1", "1", SLOT("0", "0", "0"), MORE("1", "2", "\"h\"", "1"))),
                     PROTO_OK);
    ck_assert_int_eq(hello_with("free_port", "65536"), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("session", "9007199254740992"), PROTO_E_RANGE);
    ck_assert_int_eq(hello_with("session", "\"1\""), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":1,\"seq\":1,\"free_port\":70000,\"ranks\":[]}"),
                     PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":1,\"seq\":1,\"ranks\":"
        "[{\"rank\":0,\"state\":\"running\",\"step\":1,\"loss\":1,\"tokens_per_s\":1,"
        "\"comm_frac\":0,\"silent\":1}]}"), PROTO_E_FIELD_TYPE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":1,\"seq\":1,\"ranks\":"
        "[{\"rank\":0,\"state\":\"running\",\"step\":1,\"loss\":1,\"tokens_per_s\":1,"
        "\"comm_frac\":0,\"restore_from\":\"tape\",\"restore_step\":3}]}"), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":1,\"seq\":1,\"ranks\":"
        "[{\"rank\":0,\"state\":\"running\",\"step\":1,\"loss\":1,\"tokens_per_s\":1,"
        "\"comm_frac\":0,\"restore_step\":3}]}"), PROTO_E_MISSING);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "{\"generation\":2,\"action\":\"park\"}"), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN("1", "2", SLOT("1", "0", "0") "," SLOT("0", "1", "1"))),
                     PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN("0", "1", SLOT("0", "0", "0"))), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN("1", "0", SLOT("0", "0", "0"))), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN("1", "2", SLOT("2", "0", "0"))), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN("1", "2", SLOT("0", "1", "0"))), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN("1", "2", "")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN("1", "4", SLOT("1", "0", "0") "," SLOT("1", "1", "1"))),
                     PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN("1", "4", SLOT("0", "0", "0") "," SLOT("1", "0", "1"))),
                     PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, ASSIGN("1", "4", SLOT("0", "0", "3") "," SLOT("1", "1", "3"))),
                     PROTO_E_RANGE);

    /* HEARTBEAT entry bounds. */
#define BEAT(rank, tps, cf) "{\"rank\":" rank ",\"state\":\"running\",\"step\":1,\"loss\":null," \
                            "\"tokens_per_s\":" tps ",\"comm_frac\":" cf "}"
#define HB(entries) "{\"generation\":1,\"seq\":1,\"ranks\":[" entries "]}"
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, HB(BEAT("0", "0", "1"))), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, HB(BEAT("0", "0", "1.5"))), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, HB(BEAT("0", "0", "-0.1"))), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, HB(BEAT("0", "-1", "0"))), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, HB(BEAT("0", "1", "0") "," BEAT("0", "1", "0"))),
                     PROTO_E_RANGE);

    /* RANK_EXIT: exactly one of exit_code and signal says how it ended. */
#define EXIT(code, sig) "{\"generation\":1,\"rank\":0,\"exit_code\":" code ",\"signal\":" sig "}"
    ck_assert_int_eq(decode_text(PROTO_RANK_EXIT, EXIT("-1", "15")), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_RANK_EXIT, EXIT("3", "9")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_RANK_EXIT, EXIT("-1", "0")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_RANK_EXIT, EXIT("256", "0")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_RANK_EXIT, EXIT("-1", "-9")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_RANK_EXIT, EXIT("-1", "4294967296")), PROTO_E_RANGE);

    /* LOG_REQUEST: max 1..65536, offset or tail. */
#define LOGREQ(offset, tail, max) "{\"id\":1,\"rank\":0,\"generation\":0,\"offset\":" offset \
                                  ",\"tail\":" tail ",\"max\":" max "}"
    ck_assert_int_eq(decode_text(PROTO_LOG_REQUEST, LOGREQ("9007199254740991", "0", "1")), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_LOG_REQUEST, LOGREQ("9007199254740992", "0", "1")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_REQUEST, LOGREQ("0", "0", "0")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_REQUEST, LOGREQ("0", "0", "65537")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_REQUEST, LOGREQ("5", "5", "10")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_REQUEST, LOGREQ("0", "-1", "10")), PROTO_E_RANGE);

    /* LOG_DATA: offsets that agree with the bytes; known errors; log text only. */
#define LOGDATA(off, next, size, error, reason, data) "{\"id\":1,\"rank\":0,\"generation\":1,\"newest\":1," \
    "\"offset\":" off ",\"next_offset\":" next ",\"size\":" size ",\"error\":\"" error "\",\"reason\":\"" \
    reason "\",\"data\":\"" data "\"}"
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("4", "7", "7", "", "", "abc")), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("4", "8", "8", "", "", "abc")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("4", "7", "6", "", "", "abc")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("4", "3", "7", "", "", "")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("4", "6", "7", "", "", "a\\u0007")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("4", "6", "7", "", "", "a\\r")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("4", "4", "7", "gone", "x", "")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("4", "4", "7", "no_log", "", "")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("4", "7", "7", "no_log", "x", "abc")), PROTO_E_RANGE);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("9", "9", "9", "beyond_end", "past 9", "")), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("0", "0", "0", "unreadable", "EIO", "")), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("0", "0", "0", "busy", "later", "")), PROTO_OK);
    ck_assert_int_eq(decode_text(PROTO_LOG_DATA, LOGDATA("0", "0", "0", "Busy", "later", "")), PROTO_E_RANGE);
    {
        /* Data one byte over PROTO_LOG_MAX. */
        static char big[PROTO_LOG_MAX + 400];
        char num[32];
        snprintf(num, sizeof(num), "%d", PROTO_LOG_MAX + 1);
        snprintf(big, sizeof(big), "{\"id\":1,\"rank\":0,\"generation\":1,\"newest\":1,\"offset\":0,"
                 "\"next_offset\":%s,\"size\":%s,\"error\":\"\",\"reason\":\"\",\"data\":\"", num, num);
        size_t at = strlen(big);
        memset(big + at, 'x', PROTO_LOG_MAX + 1);
        strcpy(big + at + PROTO_LOG_MAX + 1, "\"}");
        ck_assert_int_eq(decode_text(PROTO_LOG_DATA, big), PROTO_E_RANGE);
    }
}
END_TEST

/* A rank entry's progress and place: step_s finite and >= 0, step_age_ms a
 * u64, labels 1..cap-1 bytes of UTF-8 without control characters. */
START_TEST(rank_progress_fields_are_bounded)
{
#define BEAT_WITH(more) "{\"generation\":1,\"seq\":1,\"ranks\":[{\"rank\":0,\"state\":\"running\",\"step\":1," \
                        "\"loss\":null,\"tokens_per_s\":0,\"comm_frac\":0," more "}]}"
    static const struct {
        const char *payload;
        int rc;
    } cases[] = {
        {BEAT_WITH("\"step_s\":0.25,\"step_age_ms\":0,\"total_steps\":9007199254740991"), PROTO_OK},
        {BEAT_WITH("\"step_s\":-0.5"), PROTO_E_RANGE},
        {BEAT_WITH("\"step_s\":1e999"), PROTO_E_JSON},
        {BEAT_WITH("\"step_s\":null"), PROTO_E_FIELD_TYPE},
        {BEAT_WITH("\"step_age_ms\":-1"), PROTO_E_RANGE},
        {BEAT_WITH("\"step_age_ms\":1.5"), PROTO_E_FIELD_TYPE},
        {BEAT_WITH("\"step_age_ms\":9007199254740992"), PROTO_E_RANGE},
        {BEAT_WITH("\"total_steps\":-3"), PROTO_E_RANGE},
        {BEAT_WITH("\"where\":\"\""), PROTO_E_RANGE},
        {BEAT_WITH("\"waiting\":\"\""), PROTO_E_RANGE},
        {BEAT_WITH("\"where\":\"a\\tb\""), PROTO_E_RANGE},
        {BEAT_WITH("\"where\":\"a\\nb\""), PROTO_E_RANGE},
        {BEAT_WITH("\"where\":\"a\\u007fb\""), PROTO_E_RANGE},
        {BEAT_WITH("\"where\":\"a\\u0085b\""), PROTO_E_RANGE},
        {BEAT_WITH("\"where\":\"a\\u00a0b \\u20ac\""), PROTO_OK},
        {BEAT_WITH("\"where\":\"a\\\\b \\\"c\\\"\""), PROTO_OK},
        {BEAT_WITH("\"stopped\":1"), PROTO_E_FIELD_TYPE},
        {BEAT_WITH("\"stopped\":false"), PROTO_OK},
#define SHARES(c, l, g, d) "\"compute_frac\":" c ",\"collective_frac\":" l ",\"gpu_frac\":" g ",\"data_frac\":" d
        /* the time split: split_s in (0, 3600] with its four shares, each 0..1, together <= 1 */
        {BEAT_WITH("\"split_s\":1.5,\"split_steps\":12," SHARES("0.5", "0.25", "0.125", "0.125")), PROTO_OK},
        {BEAT_WITH("\"split_s\":3600," SHARES("1", "0", "0", "0")), PROTO_OK},
        {BEAT_WITH("\"split_s\":3600.5," SHARES("1", "0", "0", "0")), PROTO_E_RANGE},
        {BEAT_WITH("\"split_s\":0," SHARES("1", "0", "0", "0")), PROTO_E_RANGE},
        {BEAT_WITH("\"split_s\":-1," SHARES("1", "0", "0", "0")), PROTO_E_RANGE},
        {BEAT_WITH("\"split_s\":1," SHARES("0.5", "0.5", "0.25", "0")), PROTO_E_RANGE},
        {BEAT_WITH("\"split_s\":1," SHARES("1.5", "0", "0", "0")), PROTO_E_RANGE},
        {BEAT_WITH("\"split_s\":1," SHARES("-0.1", "0", "0", "0")), PROTO_E_RANGE},
        {BEAT_WITH("\"split_s\":1," SHARES("0.5", "0.5", "0", "null")), PROTO_E_FIELD_TYPE},
        {BEAT_WITH("\"split_s\":1,\"split_steps\":-2," SHARES("1", "0", "0", "0")), PROTO_E_RANGE},
        {BEAT_WITH("\"split_s\":1,\"compute_frac\":1"), PROTO_E_MISSING},
        {BEAT_WITH(SHARES("1", "0", "0", "0")), PROTO_E_MISSING},
        {BEAT_WITH("\"split_steps\":3"), PROTO_E_MISSING},
#undef SHARES
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_msg(decode_text(PROTO_HEARTBEAT, cases[i].payload) == cases[i].rc, "case %zu (%s): %d, not %d",
                      i, cases[i].payload, decode_text(PROTO_HEARTBEAT, cases[i].payload), cases[i].rc);

    /* Lengths: 255 bytes of where and 127 of waiting fit, one more does not. */
    static char text[1024], label[300];
    for (int w = 0; w < 2; w++) {
        size_t cap = w ? PROTO_WAITING_MAX : PROTO_WHERE_MAX;
        for (size_t len = cap - 1; len <= cap; len++) {
            memset(label, 'x', len);
            label[len] = '\0';
            snprintf(text, sizeof(text), BEAT_WITH("\"%s\":\"%s\""), w ? "waiting" : "where", label);
            ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), len < cap ? PROTO_OK : PROTO_E_RANGE);
        }
    }
#undef BEAT_WITH

    /* The encoder refuses the same. */
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m;
    sample(PROTO_HEARTBEAT, &m);
    m.u.heartbeat.ranks[1].step_s = -1;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    m.u.heartbeat.ranks[1].step_s = INFINITY;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HEARTBEAT, &m);
    m.u.heartbeat.ranks[2].step_age_ms = 5; /* without has_step_age it would not come back */
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HEARTBEAT, &m);
    strcpy(m.u.heartbeat.ranks[0].where, "cut \xe2\x82");
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HEARTBEAT, &m);
    strcpy(m.u.heartbeat.ranks[0].waiting, "esc\x1b[31m");
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HEARTBEAT, &m);
    memset(m.u.heartbeat.ranks[0].waiting, 'w', sizeof(m.u.heartbeat.ranks[0].waiting)); /* no NUL */
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HEARTBEAT, &m);
    m.u.heartbeat.ranks[1].split[PROTO_SPLIT_GPU] = 0.5; /* a share without a window */
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    sample(PROTO_HEARTBEAT, &m);
    m.u.heartbeat.ranks[0].split[PROTO_SPLIT_DATA] = NAN;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
}
END_TEST

/* STACKS: a text (log text, at most PROTO_STACKS_MAX bytes) or an error
 * saying why there is none; a text only from a process (pid > 0). */
START_TEST(stacks_are_bounded)
{
#define STACKS(pid, more) "{\"generation\":2,\"rank\":1,\"pid\":" pid "," more "}"
    static const struct {
        const char *payload;
        int rc;
    } cases[] = {
        {STACKS("77", "\"text\":\"process 77:\\n  File \\\"t.py\\\", line 3\\n\""), PROTO_OK},
        {STACKS("0", "\"text\":\"\",\"error\":\"the rank has no stack hook\""), PROTO_OK},
        {STACKS("77", "\"stopped\":true,\"text\":\"\",\"error\":\"its process is stopped\""), PROTO_OK},
        {STACKS("77", "\"text\":\"\""), PROTO_E_RANGE},                  /* neither text nor why */
        {STACKS("0", "\"text\":\"x\",\"error\":\"e\""), PROTO_E_RANGE},  /* a text from no process */
        {STACKS("2147483647", "\"text\":\"x\""), PROTO_OK},
        {STACKS("2147483648", "\"text\":\"x\""), PROTO_E_RANGE},
        {STACKS("-1", "\"text\":\"x\""), PROTO_E_RANGE},
        {STACKS("7", "\"text\":\"a\\rb\""), PROTO_E_RANGE},
        {STACKS("7", "\"text\":\"a\\u001b[31m\""), PROTO_E_RANGE},
        {STACKS("7", "\"text\":\"x\",\"stopped\":\"yes\""), PROTO_E_FIELD_TYPE},
        {STACKS("7", "\"text\":5"), PROTO_E_FIELD_TYPE},
        {STACKS("7", "\"error\":\"e\""), PROTO_E_MISSING},
        {STACKS("7", "\"text\":\"x\",\"where\":\"t.py:1\""), PROTO_E_UNKNOWN_FIELD},
        {"{\"generation\":2,\"pid\":7,\"text\":\"x\"}", PROTO_E_MISSING},
        {STACKS("7", "\"text\":\"x\",\"fr\":\"0 default_pg 3 2 3:all_reduce\""), PROTO_OK},
        {STACKS("7", "\"text\":\"x\",\"fr\":\"\""), PROTO_OK},
        {STACKS("0", "\"text\":\"\",\"error\":\"e\",\"fr\":\"0 a 1 1\""), PROTO_E_RANGE}, /* from no process */
        {STACKS("7", "\"text\":\"x\",\"fr\":\"a\\u0007b\""), PROTO_E_RANGE},
        {STACKS("7", "\"text\":\"x\",\"fr\":[1]"), PROTO_E_FIELD_TYPE},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_msg(decode_text(PROTO_STACKS, cases[i].payload) == cases[i].rc, "case %zu (%s): %d, not %d", i,
                      cases[i].payload, decode_text(PROTO_STACKS, cases[i].payload), cases[i].rc);
#undef STACKS

    /* PROTO_STACKS_MAX bytes fit and travel; one more does not; an error of 511 bytes fits. */
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m, back;
    for (size_t len = PROTO_STACKS_MAX; len <= PROTO_STACKS_MAX + 1; len++) {
        sample(PROTO_STACKS, &m);
        free(m.u.stacks.text);
        m.u.stacks.text = malloc(len + 1);
        ck_assert_ptr_nonnull(m.u.stacks.text);
        for (size_t i = 0; i < len; i++)
            m.u.stacks.text[i] = "\"\\\n"[i % 3]; /* each one escaped: the worst case */
        m.u.stacks.text[len] = '\0';
        memset(m.u.stacks.error, 'e', PROTO_REASON_MAX - 1);
        m.u.stacks.error[PROTO_REASON_MAX - 1] = '\0';
        free(m.u.stacks.fr); /* the longest summary, each byte escaped, fits beside the longest text */
        m.u.stacks.fr = malloc(PROTO_FR_MAX + 1);
        ck_assert_ptr_nonnull(m.u.stacks.fr);
        for (size_t i = 0; i < PROTO_FR_MAX; i++)
            m.u.stacks.fr[i] = "\"\\\n"[i % 3];
        m.u.stacks.fr[PROTO_FR_MAX] = '\0';
        free(m.u.stacks.ras); /* and the longest RAS findings */
        m.u.stacks.ras = malloc(PROTO_RAS_MAX + 1);
        ck_assert_ptr_nonnull(m.u.stacks.ras);
        for (size_t i = 0; i < PROTO_RAS_MAX; i++)
            m.u.stacks.ras[i] = "\"\\\n"[i % 3];
        m.u.stacks.ras[PROTO_RAS_MAX] = '\0';
        int n = proto_encode(&m, buf, sizeof(buf));
        if (len > PROTO_STACKS_MAX) {
            ck_assert_int_eq(n, PROTO_E_RANGE);
        } else {
            ck_assert_int_gt(n, 0);
            ck_assert_int_eq(decode_exact(buf, (size_t)n, &back, NULL), PROTO_OK);
            assert_msg_eq(&m, &back);
            proto_msg_clear(&back);
        }
        proto_msg_clear(&m);
    }
    /* COMMAND stacks is an action like the others. */
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "{\"generation\":2,\"action\":\"stacks\"}"), PROTO_OK);
    ck_assert_str_eq(proto_command_name(PROTO_CMD_STACKS), "stacks");
}
END_TEST

START_TEST(unknown_fields)
{
    ck_assert_int_eq(decode_text(PROTO_HELLO,
        "{\"node\":\"n1\",\"addr\":\"10.0.0.1\",\"kind\":\"gpu\",\"devices\":[0,1],\"gpu_count\":2,"
        "\"device_mem_mb\":81920,\"generation\":0,\"free_port\":0,\"agent_version\":\"0.1.0\"}"),
        PROTO_E_UNKNOWN_FIELD);
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, "{\"generation\":1,\"world_size\":1,\"ranks\":"
        "[{\"rank\":0,\"local_rank\":0,\"device\":0,\"host\":\"h\"}],\"job\":{}}"),
        PROTO_E_UNKNOWN_FIELD);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, "{\"generation\":1,\"seq\":1,\"ranks\":"
        "[{\"rank\":0,\"state\":\"running\",\"step\":1,\"loss\":1,\"tokens_per_s\":1,"
        "\"comm_frac\":0,\"lr\":0.1}]}"), PROTO_E_UNKNOWN_FIELD);
    ck_assert_int_eq(decode_text(PROTO_COMMAND, "{\"generation\":1,\"action\":\"stop\",\"Action\":1}"),
                     PROTO_E_UNKNOWN_FIELD);
    /* The job spec is the daemon's business: any object passes through. */
    ck_assert_int_eq(decode_text(PROTO_ASSIGN, "{\"generation\":1,\"world_size\":1,\"ranks\":"
        "[{\"rank\":0,\"local_rank\":0,\"device\":0}],\"node_rank\":0,\"nnodes\":1,\"restart_count\":0,\"master_addr\":\"h\",\"master_port\":29500,\"job\":{\"anything\":[1,{}]}}"), PROTO_OK);

    for (int t = PROTO_HELLO; t <= NTYPES; t++) {
        json_t *obj = sample_payload(t);
        json_object_set_new(obj, "extra", json_integer(1));
        ck_assert_msg(decode_json((uint16_t)t, obj) == PROTO_E_UNKNOWN_FIELD, "%s with extra",
                      proto_type_name((enum proto_type)t));
        json_decref(obj);
    }
}
END_TEST

/* ---- decoder: streams ---- */

START_TEST(every_prefix_needs_more)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    struct proto_msg m, back;

    for (int t = PROTO_HELLO; t <= NTYPES; t++) {
        size_t consumed;
        int n;

        sample(t, &m);
        n = proto_encode(&m, buf, sizeof(buf));
        ck_assert_int_gt(n, 0);
        for (size_t len = 0; len < (size_t)n; len++) {
            uint8_t *p = copy_exact(buf, len);
            consumed = 99;
            ck_assert_int_eq(proto_decode(p, len, &back, &consumed), PROTO_NEED_MORE);
            ck_assert_uint_eq(consumed, 0);
            ck_assert_int_eq(proto_decode_eof(p, len, &back, &consumed),
                             len == 0 ? PROTO_NEED_MORE : PROTO_E_TRUNCATED);
            free(p);
        }
        ck_assert_int_eq(proto_decode_eof(buf, (size_t)n, &back, &consumed), PROTO_OK);
        ck_assert_uint_eq(consumed, (size_t)n);
        proto_msg_clear(&back);
        proto_msg_clear(&m);
    }
}
END_TEST

START_TEST(frames_back_to_back)
{
    static uint8_t buf[3 * 4096];
    struct proto_msg a, b, got;
    size_t used = 0, consumed;
    int n1, n2, n3;

    sample(PROTO_HEARTBEAT, &a);
    sample(PROTO_ASSIGN, &b);
    n1 = proto_encode(&a, buf, sizeof(buf));
    ck_assert_int_gt(n1, 0);
    n2 = proto_encode(&b, buf + n1, sizeof(buf) - (size_t)n1);
    ck_assert_int_gt(n2, 0);
    n3 = proto_encode(&a, buf + n1 + n2, sizeof(buf) - (size_t)(n1 + n2));
    ck_assert_int_gt(n3, 0);
    /* The third frame is cut short: the stream holds 2.5 frames. */
    size_t total = (size_t)(n1 + n2 + n3 / 2);
    uint8_t *p = copy_exact(buf, total);

    ck_assert_int_eq(proto_decode(p, total, &got, &consumed), PROTO_OK);
    ck_assert_uint_eq(consumed, (size_t)n1);
    assert_msg_eq(&a, &got);
    proto_msg_clear(&got);
    used += consumed;
    ck_assert_int_eq(proto_decode(p + used, total - used, &got, &consumed), PROTO_OK);
    ck_assert_uint_eq(consumed, (size_t)n2);
    assert_msg_eq(&b, &got);
    proto_msg_clear(&got);
    used += consumed;
    ck_assert_int_eq(proto_decode(p + used, total - used, &got, &consumed), PROTO_NEED_MORE);
    ck_assert_int_eq(proto_decode_eof(p + used, total - used, &got, &consumed), PROTO_E_TRUNCATED);
    free(p);
    proto_msg_clear(&b);
}
END_TEST

/* A bad payload still has a known end: a receiver may skip it. */
START_TEST(payload_error_reports_frame_length)
{
    static uint8_t buf[4096];
    const char *bad = "{\"generation\":1,\"action\":\"explode\"}";
    struct proto_msg m, got;
    size_t n1 = raw_frame(buf, PROTO_VERSION, PROTO_COMMAND, bad, strlen(bad));
    size_t consumed;
    int n2;

    sample(PROTO_COMMAND, &m);
    n2 = proto_encode(&m, buf + n1, sizeof(buf) - n1);
    ck_assert_int_gt(n2, 0);
    ck_assert_int_eq(decode_exact(buf, n1 + (size_t)n2, &got, &consumed), PROTO_E_RANGE);
    ck_assert_uint_eq(consumed, n1);
    ck_assert_int_eq(got.type, 0);
    ck_assert_int_eq(decode_exact(buf + n1, (size_t)n2, &got, &consumed), PROTO_OK);
    assert_msg_eq(&m, &got);
}
END_TEST

/* ---- authentication ---- */

static void from_hex(const char *hex, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned int byte;
        ck_assert_int_eq(sscanf(hex + 2 * i, "%2x", &byte), 1);
        out[i] = (uint8_t)byte;
    }
}

START_TEST(hmac_matches_rfc4231)
{
    uint8_t out[PROTO_HMAC_LEN], want[PROTO_HMAC_LEN], key1[20];
    const char *data2 = "what do ya want for nothing?";

    /* RFC 4231, test case 2. */
    from_hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", want, sizeof(want));
    ck_assert_int_eq(proto_hmac_raw((const uint8_t *)"Jefe", 4, (const uint8_t *)data2,
                                    strlen(data2), out), PROTO_OK);
    ck_assert_mem_eq(out, want, sizeof(want));

    /* RFC 4231, test case 1. */
    memset(key1, 0x0b, sizeof(key1));
    from_hex("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", want, sizeof(want));
    ck_assert_int_eq(proto_hmac_raw(key1, sizeof(key1), (const uint8_t *)"Hi There", 8, out),
                     PROTO_OK);
    ck_assert_mem_eq(out, want, sizeof(want));
}
END_TEST

START_TEST(hkdf_matches_rfc5869)
{
    uint8_t ikm[22], salt[13], info[10], okm[42], want[42];

    /* RFC 5869, test case 1. */
    memset(ikm, 0x0b, sizeof(ikm));
    for (unsigned i = 0; i < sizeof(salt); i++)
        salt[i] = (uint8_t)i;
    for (unsigned i = 0; i < sizeof(info); i++)
        info[i] = (uint8_t)(0xf0 + i);
    from_hex("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865", want,
             sizeof(want));
    ck_assert_int_eq(proto_hkdf(ikm, sizeof(ikm), salt, sizeof(salt), info, sizeof(info), okm, sizeof(okm)),
                     PROTO_OK);
    ck_assert_mem_eq(okm, want, sizeof(want));
    ck_assert_int_eq(proto_hkdf(ikm, sizeof(ikm), salt, sizeof(salt), info, sizeof(info), okm, 0), PROTO_E_RANGE);
}
END_TEST

static const uint8_t TOKEN[] = "cluster-token-0123456789";
#define TOKEN_LEN (sizeof(TOKEN) - 1)

/* A handshake's binding as both sides compute it: a HELLO encoded, decoded
 * back (the daemon's view) and a daemon nonce. */
static void handshake_bind(struct proto_bind *agent, struct proto_bind *daemon, uint8_t *frame, size_t *len)
{
    struct proto_msg m, d;
    size_t used;

    sample(PROTO_HELLO, &m);
    ck_assert_int_eq(proto_nonce(m.u.hello.nonce), PROTO_OK);
    int n = proto_encode(&m, frame, PROTO_MAX_FRAME);
    ck_assert_int_gt(n, 0);
    *len = (size_t)n;
    ck_assert_int_eq(proto_bind_hello(agent, frame, *len, &m.u.hello), PROTO_OK);
    ck_assert_int_eq(proto_decode(frame, *len, &d, &used), PROTO_OK);
    ck_assert_int_eq(proto_bind_hello(daemon, frame, used, &d.u.hello), PROTO_OK);
    ck_assert_int_eq(proto_nonce(daemon->daemon_nonce), PROTO_OK);
    memcpy(agent->daemon_nonce, daemon->daemon_nonce, PROTO_NONCE_LEN);
    ck_assert_mem_eq(agent, daemon, sizeof(*agent));
}

START_TEST(proofs_bind_the_connection)
{
    static uint8_t frame[PROTO_MAX_FRAME];
    struct proto_bind a, d, x;
    uint8_t pd[PROTO_HMAC_LEN], pa[PROTO_HMAC_LEN];
    size_t len;

    handshake_bind(&a, &d, frame, &len);
    ck_assert_int_eq(proto_proof(TOKEN, TOKEN_LEN, &d, PROTO_SIDE_DAEMON, pd), PROTO_OK);
    ck_assert_int_eq(proto_proof(TOKEN, TOKEN_LEN, &a, PROTO_SIDE_AGENT, pa), PROTO_OK);
    ck_assert_int_eq(proto_proof_verify(TOKEN, TOKEN_LEN, &a, PROTO_SIDE_DAEMON, pd), 1);
    ck_assert_int_eq(proto_proof_verify(TOKEN, TOKEN_LEN, &d, PROTO_SIDE_AGENT, pa), 1);
    /* A proof is one side's: reflected back it does not verify. */
    ck_assert(memcmp(pd, pa, PROTO_HMAC_LEN) != 0);
    ck_assert_int_eq(proto_proof_verify(TOKEN, TOKEN_LEN, &a, PROTO_SIDE_AGENT, pd), 0);
    ck_assert_int_eq(proto_proof_verify(TOKEN, TOKEN_LEN, &d, PROTO_SIDE_DAEMON, pa), 0);
    /* Every bit of the proof counts, and so does the token. */
    for (int bit = 0; bit < 8 * PROTO_HMAC_LEN; bit++) {
        pd[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        ck_assert_int_eq(proto_proof_verify(TOKEN, TOKEN_LEN, &a, PROTO_SIDE_DAEMON, pd), 0);
        pd[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    ck_assert_int_eq(proto_proof_verify(TOKEN, TOKEN_LEN - 1, &a, PROTO_SIDE_DAEMON, pd), 0);
    ck_assert_int_eq(proto_proof(TOKEN, 0, &d, PROTO_SIDE_DAEMON, pd), PROTO_E_RANGE);
    ck_assert_int_eq(proto_proof_verify(TOKEN, 0, &a, PROTO_SIDE_DAEMON, pd), 0);
    /* Another connection (either nonce), another node, another session, a
     * HELLO changed on the way: the proof does not carry over. */
    x = a, x.agent_nonce[5] ^= 1;
    ck_assert_int_eq(proto_proof_verify(TOKEN, TOKEN_LEN, &x, PROTO_SIDE_DAEMON, pd), 0);
    x = a, x.daemon_nonce[31] ^= 0x80;
    ck_assert_int_eq(proto_proof_verify(TOKEN, TOKEN_LEN, &x, PROTO_SIDE_DAEMON, pd), 0);
    x = a, snprintf(x.node, sizeof(x.node), "gpu-node-08.rack_2");
    ck_assert_int_eq(proto_proof_verify(TOKEN, TOKEN_LEN, &x, PROTO_SIDE_DAEMON, pd), 0);
    x = a, x.session++;
    ck_assert_int_eq(proto_proof_verify(TOKEN, TOKEN_LEN, &x, PROTO_SIDE_DAEMON, pd), 0);
    struct proto_msg h;
    size_t used;
    uint8_t *addr = memmem(frame, len, "10.1.2.3", 8); /* the HELLO's address, as a relay could change it */
    ck_assert_ptr_nonnull(addr);
    addr[7] = '4';
    ck_assert_int_eq(proto_decode(frame, len, &h, &used), PROTO_OK);
    ck_assert_int_eq(proto_bind_hello(&x, frame, len, &h.u.hello), PROTO_OK);
    memcpy(x.daemon_nonce, a.daemon_nonce, PROTO_NONCE_LEN);
    ck_assert_int_eq(proto_proof_verify(TOKEN, TOKEN_LEN, &x, PROTO_SIDE_DAEMON, pd), 0);
}
END_TEST

/* A sealed frame of msg under ch into out: its length. */
static size_t seal_msg(struct proto_channel *ch, const struct proto_msg *m, uint8_t *out)
{
    int n = proto_encode(m, out, PROTO_MAX_SEALED - PROTO_MAC_LEN);
    ck_assert_int_gt(n, 0);
    int k = proto_seal(ch, out, (size_t)n, PROTO_MAX_SEALED);
    ck_assert_int_eq(k, n + PROTO_MAC_LEN);
    return (size_t)k;
}

START_TEST(channel_carries_frames_both_ways)
{
    static uint8_t hello[PROTO_MAX_FRAME], buf[PROTO_MAX_SEALED];
    struct proto_bind a, d;
    size_t len, used;
    struct proto_msg m, got;

    handshake_bind(&a, &d, hello, &len);
    struct proto_channel *ca = proto_channel_new(TOKEN, TOKEN_LEN, &a, PROTO_SIDE_AGENT);
    struct proto_channel *cd = proto_channel_new(TOKEN, TOKEN_LEN, &d, PROTO_SIDE_DAEMON);
    ck_assert_ptr_nonnull(ca);
    ck_assert_ptr_nonnull(cd);
    ck_assert_ptr_null(proto_channel_new(TOKEN, 0, &a, PROTO_SIDE_AGENT));
    for (int round = 0; round < 3; round++) {
        for (int t = PROTO_WELCOME; t <= PROTO_TYPE_MAX; t++) {
            sample(t, &m);
            struct proto_channel *tx = t % 2 ? ca : cd, *rx = t % 2 ? cd : ca;
            size_t n = seal_msg(tx, &m, buf);
            /* Every prefix needs more; the whole frame opens to the message. */
            for (size_t k = 0; k < n; k += 1 + k / 3)
                ck_assert_int_eq(proto_open(rx, buf, k, &got, &used), PROTO_NEED_MORE);
            ck_assert_int_eq(proto_open(rx, buf, n, &got, &used), PROTO_OK);
            ck_assert_uint_eq(used, n);
            assert_msg_eq(&m, &got);
            proto_msg_clear(&got);
            proto_msg_clear(&m);
        }
    }
    proto_channel_free(ca);
    proto_channel_free(cd);
    proto_channel_free(NULL);
}
END_TEST

START_TEST(channel_refuses_forged_replayed_reordered)
{
    static uint8_t hello[PROTO_MAX_FRAME], f1[PROTO_MAX_SEALED], f2[PROTO_MAX_SEALED], f3[PROTO_MAX_SEALED];
    struct proto_bind a, d, other;
    size_t len, used;
    struct proto_msg m, got;

    handshake_bind(&a, &d, hello, &len);
    struct proto_channel *ca = proto_channel_new(TOKEN, TOKEN_LEN, &a, PROTO_SIDE_AGENT);
    sample(PROTO_COMMAND, &m);
    size_t n1 = seal_msg(ca, &m, f1);
    size_t n2 = seal_msg(ca, &m, f2); /* the same command again: only the count differs */
    size_t n3 = seal_msg(ca, &m, f3);
    ck_assert_uint_eq(n1, n2);
    ck_assert(memcmp(f1, f2, n1) != 0);
    proto_msg_clear(&m);

    /* Any byte changed, header, payload or MAC, fails (and a fresh channel
     * reads the original after that, so it is the change that failed). */
    for (size_t i = 0; i < n1; i++) {
        struct proto_channel *cd = proto_channel_new(TOKEN, TOKEN_LEN, &d, PROTO_SIDE_DAEMON);
        f1[i] ^= 0x20;
        int rc = proto_open(cd, f1, n1, &got, &used);
        ck_assert_msg(rc == PROTO_E_MAC || (i < PROTO_HEADER_LEN && rc < 0) || rc == PROTO_NEED_MORE,
                      "byte %zu changed: %s", i, proto_strerror(rc));
        ck_assert_uint_eq(used, 0);
        f1[i] ^= 0x20;
        ck_assert_int_eq(proto_open(cd, f1, n1, &got, &used), PROTO_OK);
        proto_msg_clear(&got);
        proto_channel_free(cd);
    }

    struct proto_channel *cd = proto_channel_new(TOKEN, TOKEN_LEN, &d, PROTO_SIDE_DAEMON);
    /* Out of order: the second frame first. */
    ck_assert_int_eq(proto_open(cd, f2, n2, &got, &used), PROTO_E_MAC);
    ck_assert_int_eq(proto_open(cd, f1, n1, &got, &used), PROTO_OK);
    proto_msg_clear(&got);
    /* Replayed: the first again. */
    ck_assert_int_eq(proto_open(cd, f1, n1, &got, &used), PROTO_E_MAC);
    /* One left out: the third after the first. */
    ck_assert_int_eq(proto_open(cd, f3, n3, &got, &used), PROTO_E_MAC);
    ck_assert_int_eq(proto_open(cd, f2, n2, &got, &used), PROTO_OK);
    proto_msg_clear(&got);
    proto_channel_free(cd);

    /* Reflected: the agent's own frame back to it. */
    struct proto_channel *ra = proto_channel_new(TOKEN, TOKEN_LEN, &a, PROTO_SIDE_AGENT);
    ck_assert_int_eq(proto_open(ra, f1, n1, &got, &used), PROTO_E_MAC);
    proto_channel_free(ra);
    /* Another connection's keys (another nonce), or another token. */
    other = d, other.daemon_nonce[0] ^= 1;
    cd = proto_channel_new(TOKEN, TOKEN_LEN, &other, PROTO_SIDE_DAEMON);
    ck_assert_int_eq(proto_open(cd, f1, n1, &got, &used), PROTO_E_MAC);
    proto_channel_free(cd);
    cd = proto_channel_new((const uint8_t *)"another-token", 13, &d, PROTO_SIDE_DAEMON);
    ck_assert_int_eq(proto_open(cd, f1, n1, &got, &used), PROTO_E_MAC);
    proto_channel_free(cd);

    /* A plain frame (an injected one cannot be sealed) is refused as such. */
    cd = proto_channel_new(TOKEN, TOKEN_LEN, &d, PROTO_SIDE_DAEMON);
    sample(PROTO_COMMAND, &m);
    int n = proto_encode(&m, f3, sizeof(f3));
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(proto_open(cd, f3, (size_t)n, &got, &used), PROTO_E_MAC);
    /* Shorter than a MAC: no sealed frame at all. */
    put_header(f3, 4, PROTO_VERSION, PROTO_COMMAND);
    ck_assert_int_eq(proto_open(cd, f3, PROTO_HEADER_LEN + 4, &got, &used), PROTO_E_MAC);
    /* Header errors come first, as in proto_decode. */
    put_header(f3, 40, PROTO_VERSION - 1, PROTO_COMMAND);
    ck_assert_int_eq(proto_open(cd, f3, PROTO_HEADER_LEN, &got, &used), PROTO_E_VERSION);
    put_header(f3, PROTO_MAX_PAYLOAD + PROTO_MAC_LEN + 1, PROTO_VERSION, PROTO_COMMAND);
    ck_assert_int_eq(proto_open(cd, f3, PROTO_HEADER_LEN, &got, &used), PROTO_E_OVERSIZE);
    /* What proto_seal takes: one whole encoded frame, with room. */
    n = proto_encode(&m, f3, sizeof(f3));
    ck_assert_int_eq(proto_seal(cd, f3, (size_t)n - 1, sizeof(f3)), PROTO_E_RANGE);
    ck_assert_int_eq(proto_seal(cd, f3, (size_t)n, (size_t)n + PROTO_MAC_LEN - 1), PROTO_E_NOSPACE);
    proto_channel_free(cd);
}
END_TEST

/* An authentic frame whose payload is bad (a peer's bug, not an attack)
 * is reported like proto_decode's: skipped by its length, stream in step. */
START_TEST(channel_payload_error_keeps_step)
{
    static uint8_t hello[PROTO_MAX_FRAME], buf[2 * PROTO_MAX_SEALED];
    struct proto_bind a, d;
    size_t len, used;
    struct proto_msg m, got;
    const char *bad = "{\"generation\":1}";

    handshake_bind(&a, &d, hello, &len);
    struct proto_channel *ca = proto_channel_new(TOKEN, TOKEN_LEN, &a, PROTO_SIDE_AGENT);
    struct proto_channel *cd = proto_channel_new(TOKEN, TOKEN_LEN, &d, PROTO_SIDE_DAEMON);
    size_t n1 = raw_frame(buf, PROTO_VERSION, PROTO_COMMAND, bad, strlen(bad));
    int k = proto_seal(ca, buf, n1, sizeof(buf));
    ck_assert_int_gt(k, 0);
    sample(PROTO_HEARTBEAT, &m);
    size_t n2 = seal_msg(ca, &m, buf + k);
    ck_assert_int_eq(proto_open(cd, buf, (size_t)k + n2, &got, &used), PROTO_E_MISSING);
    ck_assert_uint_eq(used, (size_t)k);
    ck_assert_int_eq(proto_open(cd, buf + used, n2, &got, &used), PROTO_OK);
    assert_msg_eq(&m, &got);
    proto_msg_clear(&got);
    proto_msg_clear(&m);
    proto_channel_free(ca);
    proto_channel_free(cd);
}
END_TEST

START_TEST(nonces_differ)
{
    uint8_t a[PROTO_NONCE_LEN], b[PROTO_NONCE_LEN];

    ck_assert_int_eq(proto_nonce(a), PROTO_OK);
    ck_assert_int_eq(proto_nonce(b), PROTO_OK);
    ck_assert(memcmp(a, b, PROTO_NONCE_LEN) != 0);
}
END_TEST

/* ---- names ---- */

START_TEST(names_are_distinct)
{
    for (int a = PROTO_E_MAC; a <= PROTO_NEED_MORE; a++) {
        ck_assert_str_ne(proto_strerror(a), proto_strerror(-100));
        for (int b = PROTO_E_MAC; b < a; b++)
            ck_assert_str_ne(proto_strerror(a), proto_strerror(b));
    }
    for (int t = PROTO_HELLO; t <= NTYPES; t++)
        ck_assert_str_ne(proto_type_name((enum proto_type)t), "unknown");
    ck_assert_str_eq(proto_type_name(PROTO_UNIQUE_ID), "UNIQUE_ID");
    ck_assert_str_eq(proto_type_name((enum proto_type)0), "unknown");
    ck_assert_str_eq(proto_type_name((enum proto_type)(PROTO_TYPE_MAX + 1)), "unknown");
    ck_assert_str_eq(proto_rank_state_name(PROTO_RANK_STOPPING), "stopping");
    ck_assert_str_eq(proto_rank_state_name((enum proto_rank_state)9), "unknown");
    ck_assert_str_eq(proto_command_name(PROTO_CMD_CHECKPOINT), "checkpoint");
    ck_assert_str_eq(proto_command_name((enum proto_command)0), "unknown");
    ck_assert_str_eq(proto_type_name(PROTO_LOG_DATA), "LOG_DATA");
    ck_assert_str_eq(proto_log_error_name(PROTO_LOG_OK), "ok");
    ck_assert_str_eq(proto_log_error_name(PROTO_LOG_NO_LOG), "no_log");
    ck_assert_str_eq(proto_log_error_name((enum proto_log_error)9), "unknown");
    ck_assert_int_eq(proto_valid_name("node-1.rack_2"), 1);
    ck_assert_int_eq(proto_valid_name(""), 0);
    ck_assert_int_eq(proto_valid_name(NULL), 0);
}
END_TEST

/* ---- mutation loop ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng(void)
{
    /* xorshift64*: deterministic, good enough to pick bytes. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1du;
}

static int decoder_code(int rc)
{
    switch (rc) {
    case PROTO_OK: case PROTO_NEED_MORE: case PROTO_E_OVERSIZE: case PROTO_E_VERSION:
    case PROTO_E_TYPE: case PROTO_E_JSON: case PROTO_E_MISSING: case PROTO_E_FIELD_TYPE:
    case PROTO_E_RANGE: case PROTO_E_UNKNOWN_FIELD:
        return 1;
    }
    return 0;
}

/* Mutate frame[0..*len) in place (capacity cap). */
static void mutate(uint8_t *frame, size_t *len, size_t cap)
{
    static const char *const tokens[] = {"-1", "null", "\"\"", "[]", "{}", "0", "1e999",
        "9007199254740992", "\"x\"", "true", "1.5", "\"stop\"", "\\u0000", ",", "}", "\""};
    size_t pos = *len ? (size_t)(rng() % *len) : 0;

    switch (rng() % 6) {
    case 0: /* flip one bit */
        if (*len)
            frame[pos] ^= (uint8_t)(1u << (rng() % 8));
        break;
    case 1: /* any byte */
        if (*len)
            frame[pos] = (uint8_t)rng();
        break;
    case 2: /* cut */
        *len = pos;
        break;
    case 3: /* drop a run */ {
        size_t run = 1 + (size_t)(rng() % 8);
        if (pos + run > *len)
            run = *len - pos;
        memmove(frame + pos, frame + pos + run, *len - pos - run);
        *len -= run;
        break;
    }
    default: /* splice in a JSON token */ {
        const char *tok = tokens[rng() % (sizeof(tokens) / sizeof(tokens[0]))];
        size_t tl = strlen(tok);
        if (pos < PROTO_HEADER_LEN || *len + tl > cap)
            break;
        memmove(frame + pos + tl, frame + pos, *len - pos);
        memcpy(frame + pos, tok, tl);
        *len += tl;
        break;
    }
    }
}

/* Values a field may be swapped for: each JSON type, edges of each bound. */
static const char *const values[] = {"-1", "0", "1", "4294967296", "9007199254740991",
    "9007199254740992", "-0.5", "0.5", "1.5", "1e300", "null", "true", "\"\"", "\"x\"",
    "\"stop\"", "\"running\"", "\"gpu\"", "[]", "[0]", "[0,0]", "{}",
    "{\"rank\":0,\"local_rank\":0,\"device\":0}"};

/* A field-level change: drop, retype or add a key, at top level or inside
 * the first element of an array of objects. */
static void mutate_fields(json_t *obj)
{
    json_t *target = obj, *v;
    const char *key, *pick = NULL;
    size_t n = 0, want;

    json_object_foreach(obj, key, v) {
        if (json_is_array(v) && json_is_object(json_array_get(v, 0)) && rng() % 2)
            target = json_array_get(v, 0);
    }
    want = json_object_size(target) ? (size_t)(rng() % json_object_size(target)) : 0;
    json_object_foreach(target, key, v) {
        if (n++ == want)
            pick = key;
    }
    switch (rng() % 4) {
    case 0:
        if (pick)
            json_object_del(target, pick);
        break;
    case 1:
        json_object_set_new(target, "extra", json_integer(1));
        break;
    default:
        if (pick) {
            json_error_t jerr;
            json_t *nv = json_loads(values[rng() % (sizeof(values) / sizeof(values[0]))],
                                    JSON_DECODE_ANY, &jerr);
            ck_assert_ptr_nonnull(nv);
            json_object_set_new(target, pick, nv);
        }
        break;
    }
}

START_TEST(mutated_frames_get_a_defined_answer)
{
    static uint8_t seeds[NTYPES + 1][8192], frame[8192 + 512], again[PROTO_MAX_FRAME];
    int seed_len[NTYPES + 1];
    int seen[16] = {0};
    struct proto_msg m, back;

    for (int t = PROTO_HELLO; t <= NTYPES; t++) {
        sample(t, &m);
        seed_len[t] = proto_encode(&m, seeds[t], sizeof(seeds[t]));
        ck_assert_int_gt(seed_len[t], 0);
        proto_msg_clear(&m);
    }
    for (int iter = 0; iter < 20000; iter++) {
        int t = PROTO_HELLO + iter % NTYPES;
        size_t len = (size_t)seed_len[t], consumed = 0;
        int steps = 1 + (int)(rng() % 4), rc, rc_eof;

        if (iter % 3 == 0) {
            json_error_t jerr;
            json_t *obj = json_loadb((const char *)seeds[t] + PROTO_HEADER_LEN,
                                     len - PROTO_HEADER_LEN, 0, &jerr);
            ck_assert_ptr_nonnull(obj);
            for (int s = 0; s < steps; s++)
                mutate_fields(obj);
            memcpy(frame, seeds[t], PROTO_HEADER_LEN);
            len = PROTO_HEADER_LEN + json_dumpb(obj, (char *)frame + PROTO_HEADER_LEN,
                                                sizeof(frame) - PROTO_HEADER_LEN, JSON_COMPACT);
            ck_assert_uint_le(len, sizeof(frame));
            json_decref(obj);
        } else {
            memcpy(frame, seeds[t], len);
            for (int s = 0; s < steps; s++)
                mutate(frame, &len, sizeof(frame));
        }
        /* Most of the time keep the length prefix honest, so that the
         * mutations reach the JSON and field checks. */
        if (len >= PROTO_HEADER_LEN && rng() % 4 != 0) {
            uint32_t plen = (uint32_t)(len - PROTO_HEADER_LEN);
            frame[0] = (uint8_t)(plen >> 24);
            frame[1] = (uint8_t)(plen >> 16);
            frame[2] = (uint8_t)(plen >> 8);
            frame[3] = (uint8_t)plen;
        }

        uint8_t *p = copy_exact(frame, len);
        rc = proto_decode(p, len, &m, &consumed);
        ck_assert_msg(decoder_code(rc), "iteration %d: code %d", iter, rc);
        seen[-rc + 2]++;
        if (rc == PROTO_OK) {
            int n;
            ck_assert_uint_gt(consumed, PROTO_HEADER_LEN - 1);
            ck_assert_uint_le(consumed, len);
            /* Whatever decodes, encodes, and comes back the same. */
            n = proto_encode(&m, again, sizeof(again));
            ck_assert_msg(n > 0, "iteration %d: re-encode gave %d", iter, n);
            ck_assert_int_eq(proto_decode(again, (size_t)n, &back, &consumed), PROTO_OK);
            assert_msg_eq(&m, &back);
            proto_msg_clear(&back);
            proto_msg_clear(&m);
        } else {
            ck_assert_int_eq(m.type, 0);
        }
        rc_eof = proto_decode_eof(p, len, &m, &consumed);
        ck_assert_int_eq(rc_eof, rc == PROTO_NEED_MORE && len > 0 ? PROTO_E_TRUNCATED : rc);
        proto_msg_clear(&m);
        free(p);
    }
    /* The loop reached every stage of the decoder. */
    ck_assert_int_gt(seen[2 - PROTO_OK], 100);
    ck_assert_int_gt(seen[2 - PROTO_NEED_MORE], 0);
    ck_assert_int_gt(seen[2 - PROTO_E_OVERSIZE], 0);
    ck_assert_int_gt(seen[2 - PROTO_E_JSON], 0);
    ck_assert_int_gt(seen[2 - PROTO_E_MISSING], 0);
    ck_assert_int_gt(seen[2 - PROTO_E_FIELD_TYPE], 0);
    ck_assert_int_gt(seen[2 - PROTO_E_RANGE], 0);
    ck_assert_int_gt(seen[2 - PROTO_E_UNKNOWN_FIELD], 0);
}
END_TEST

/* An ASSIGN whose job comes rendered writes the bytes of one that renders it. */
/* Memory checkpoints: HEARTBEAT's list and ASSIGN's choice survive a round
 * trip (the choice by both ways of writing an ASSIGN); bad lists are refused. */
/* m: a HEARTBEAT of generation gen, number seq, with no rank entries and nothing optional. */
static void bare_beat(struct proto_msg *m, uint64_t gen, uint64_t seq)
{
    memset(m, 0, sizeof(*m));
    proto_heartbeat_start(m);
    m->u.heartbeat.generation = gen;
    m->u.heartbeat.seq = seq;
}

/* A one-rank ASSIGN that names a memory checkpoint (memckpt to be filled in); m owns its job. */
static void memckpt_assign(struct proto_msg *m)
{
    memset(m, 0, sizeof(*m));
    m->type = PROTO_ASSIGN;
    m->u.assign.generation = 2;
    m->u.assign.world_size = 1;
    m->u.assign.nranks = 1;
    m->u.assign.nnodes = 1;
    snprintf(m->u.assign.master_addr, sizeof(m->u.assign.master_addr), "10.0.0.1");
    m->u.assign.master_port = 29500;
    m->u.assign.job = json_pack("{s:s}", "name", "j");
    m->u.assign.has_memckpt = 1;
}

START_TEST(memory_checkpoints_on_the_wire)
{
    static struct proto_msg m, back;
    static uint8_t buf[PROTO_MAX_FRAME];
    size_t consumed;
    bare_beat(&m, 3, 9);
    m.u.heartbeat.has_memckpt = 1;
    m.u.heartbeat.nmemckpt = 2;
    strcpy(m.u.heartbeat.memckpt[0], "step10");
    strcpy(m.u.heartbeat.memckpt[1], "global \"step\" 15");
    m.u.heartbeat.has_drained = 1; /* and those drained to checkpoint_dir (worker/agent/memdrain.h) */
    m.u.heartbeat.ndrained = 1;
    strcpy(m.u.heartbeat.drained[0], "step10");
    int n = proto_encode(&m, buf, sizeof(buf));
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(decode_exact(buf, (size_t)n, &back, &consumed), PROTO_OK);
    ck_assert_int_eq(back.u.heartbeat.has_memckpt, 1);
    ck_assert_uint_eq(back.u.heartbeat.nmemckpt, 2);
    ck_assert_str_eq(back.u.heartbeat.memckpt[1], "global \"step\" 15");
    ck_assert_int_eq(back.u.heartbeat.has_drained, 1);
    ck_assert_uint_eq(back.u.heartbeat.ndrained, 1);
    ck_assert_str_eq(back.u.heartbeat.drained[0], "step10");
    proto_msg_clear(&back);
    m.u.heartbeat.has_drained = 0;
    m.u.heartbeat.ndrained = 0;
    m.u.heartbeat.nmemckpt = 0; /* an empty list is a list: "none complete here" */
    n = proto_encode(&m, buf, sizeof(buf));
    ck_assert_int_eq(decode_exact(buf, (size_t)n, &back, &consumed), PROTO_OK);
    ck_assert_int_eq(back.u.heartbeat.has_memckpt, 1);
    ck_assert_uint_eq(back.u.heartbeat.nmemckpt, 0);
    proto_msg_clear(&back);
    m.u.heartbeat.has_memckpt = 0; /* absent: the fast path's frame, without the key */
    n = proto_encode(&m, buf, sizeof(buf));
    ck_assert_ptr_null(memmem(buf, (size_t)n, "memory_checkpoints", 18));
    strcpy(m.u.heartbeat.memckpt[1], "step10"); /* the same name twice */
    m.u.heartbeat.has_memckpt = 1;
    m.u.heartbeat.nmemckpt = 2;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    strcpy(m.u.heartbeat.memckpt[1], "bad\nname");
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);

    const char *head = "{\"generation\":1,\"seq\":1,\"ranks\":[],\"memory_checkpoints\":";
    char text[4096];
    snprintf(text, sizeof(text), "%s[\"a\",\"b\"]}", head);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_OK);
    snprintf(text, sizeof(text), "%s\"a\"}", head);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_E_FIELD_TYPE);
    snprintf(text, sizeof(text), "%s[1]}", head);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_E_FIELD_TYPE);
    snprintf(text, sizeof(text), "%s[\"\"]}", head);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_E_RANGE);
    snprintf(text, sizeof(text), "%s[\"a\",\"a\"]}", head);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_E_RANGE);
    snprintf(text, sizeof(text), "%s[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}", head);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_E_RANGE);
    char longname[PROTO_CKPT_NAME_MAX + 1];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    snprintf(text, sizeof(text), "%s[\"%s\"]}", head, longname);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_E_RANGE);

    /* ASSIGN: rendered with its job text or through jansson, the same frame and the same choice */
    static uint8_t a[PROTO_MAX_FRAME], b[PROTO_MAX_FRAME];
    memckpt_assign(&m);
    strcpy(m.u.assign.memckpt, "step \"10\"");
    int na = proto_encode(&m, a, sizeof(a));
    char *job = json_dumps(m.u.assign.job, JSON_COMPACT);
    m.u.assign.job_text = job;
    int nb = proto_encode(&m, b, sizeof(b));
    ck_assert_int_gt(na, 0);
    ck_assert_int_eq(na, nb);
    ck_assert(memcmp(a, b, (size_t)na) == 0);
    ck_assert_int_eq(decode_exact(b, (size_t)nb, &back, &consumed), PROTO_OK);
    ck_assert_int_eq(back.u.assign.has_memckpt, 1);
    ck_assert_str_eq(back.u.assign.memckpt, "step \"10\"");
    proto_msg_clear(&back);
    m.u.assign.memckpt[0] = '\0'; /* "none complete on every node" */
    nb = proto_encode(&m, b, sizeof(b));
    ck_assert_int_eq(decode_exact(b, (size_t)nb, &back, &consumed), PROTO_OK);
    ck_assert_int_eq(back.u.assign.has_memckpt, 1);
    ck_assert_str_eq(back.u.assign.memckpt, "");
    proto_msg_clear(&back);
    strcpy(m.u.assign.memckpt, "bad\x7fname");
    ck_assert_int_eq(proto_encode(&m, b, sizeof(b)), PROTO_E_RANGE);
    free(job);
    json_decref(m.u.assign.job);
}
END_TEST

/* HEARTBEAT spare_note: the agent's words on its warm spare, on the JSON path both ways; UTF-8, one string. */
START_TEST(heartbeat_spare_note_on_the_wire)
{
    const char *note = "importing cupy touched the CUDA driver (libcuda.so.1 mapped)";
    static struct proto_msg m, back;
    static uint8_t wire[PROTO_MAX_FRAME];
    bare_beat(&m, 2, 4);
    snprintf(m.u.heartbeat.spare_note, sizeof(m.u.heartbeat.spare_note), "%s", note);
    int len = proto_encode(&m, wire, sizeof(wire));
    ck_assert_ptr_nonnull(len > 0 ? memmem(wire, (size_t)len, "\"spare_note\":\"importing cupy", 26) : NULL);
    size_t used;
    ck_assert_int_eq(decode_exact(wire, (size_t)len, &back, &used), PROTO_OK);
    ck_assert_str_eq(back.u.heartbeat.spare_note, note);
    proto_msg_clear(&back);
    m.u.heartbeat.spare_note[0] = '\0'; /* none: not written */
    len = proto_encode(&m, wire, sizeof(wire));
    ck_assert_int_gt(len, 0);
    ck_assert_ptr_null(memmem(wire, (size_t)len, "spare_note", 10));
    strcpy(m.u.heartbeat.spare_note, "bad \xff byte");
    ck_assert_int_eq(proto_encode(&m, wire, sizeof(wire)), PROTO_E_RANGE);
    strcpy(m.u.heartbeat.spare_note, "bad \033]0;title\a escape");
    ck_assert_int_eq(proto_encode(&m, wire, sizeof(wire)), PROTO_E_RANGE);
    char long_note[PROTO_REASON_MAX + 3];
    snprintf(long_note, sizeof(long_note), "\"%0*d\"", PROTO_REASON_MAX, 0);
    const struct { const char *value; int rc; } bad[] = {
        {"7", PROTO_E_FIELD_TYPE}, {"\"\"", PROTO_E_RANGE} /* "" is written as absent */, {long_note, PROTO_E_RANGE},
        /* it reaches events and terminals: no second line, no escape, C0, DEL or C1 (CSI as U+009B) */
        {"\"a\\nnode b: forged\"", PROTO_E_RANGE}, {"\"tab\\there\"", PROTO_E_RANGE},
        {"\"\\u001b[2Jgone\"", PROTO_E_RANGE}, {"\"del\\u007f\"", PROTO_E_RANGE},
        {"\"\\u009b2Jgone\"", PROTO_E_RANGE}, {"\"caf\\u00e9 \\u00a0ok\"", PROTO_OK},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[1024];
        snprintf(text, sizeof(text), "{\"generation\":1,\"seq\":1,\"ranks\":[],\"spare_note\":%s}", bad[i].value);
        ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), bad[i].rc);
    }
}
END_TEST

/* Drains (worker/agent/memdrain.h): HEARTBEAT memory_drained's bounds, ASSIGN memory_checkpoint_drained. */
START_TEST(memory_drains_on_the_wire)
{
    static struct proto_msg m, back;
    static uint8_t buf[PROTO_MAX_FRAME];
    size_t consumed;
    int n;
    const char *head = "{\"generation\":1,\"seq\":1,\"ranks\":[]";
    char text[4096];
    snprintf(text, sizeof(text), "%s,\"memory_drained\":[]}", head);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_OK);
    snprintf(text, sizeof(text), "%s,\"memory_drained\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}", head);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_E_RANGE); /* 9 > PROTO_MEMCKPT_MAX */
    snprintf(text, sizeof(text), "%s,\"memory_drained\":[\"\"]}", head);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_E_RANGE);
    snprintf(text, sizeof(text), "%s,\"memory_drained\":[\"step10\",\"step10\"]}", head); /* each once */
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_E_RANGE);

    /* ASSIGN memory_checkpoint_drained: only beside a checkpoint it names, never with a buddy's */
    memckpt_assign(&m);
    strcpy(m.u.assign.memckpt, "step20");
    m.u.assign.memckpt_drained = 1;
    n = proto_encode(&m, buf, sizeof(buf));
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(decode_exact(buf, (size_t)n, &back, &consumed), PROTO_OK);
    ck_assert_int_eq(back.u.assign.memckpt_drained, 1);
    proto_msg_clear(&back);
    strcpy(m.u.assign.memckpt_from, "a");
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    m.u.assign.memckpt_from[0] = '\0';
    m.u.assign.memckpt[0] = '\0';
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    json_decref(m.u.assign.job);
}
END_TEST

/* Replicas (worker/agent/memrep.h): the holder's report, ASSIGN's source, MEM_FILE's paths, bytes and bounds. */
START_TEST(memory_replicas_on_the_wire)
{
    static struct proto_msg m, back;
    static uint8_t buf[PROTO_MAX_FRAME];
    size_t consumed;
    bare_beat(&m, 3, 9);
    strcpy(m.u.heartbeat.replica_of, "b");
    m.u.heartbeat.nreplica = 2;
    strcpy(m.u.heartbeat.replica[0], "step5");
    strcpy(m.u.heartbeat.replica[1], "step10");
    int n = proto_encode(&m, buf, sizeof(buf));
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(decode_exact(buf, (size_t)n, &back, &consumed), PROTO_OK);
    ck_assert_str_eq(back.u.heartbeat.replica_of, "b");
    ck_assert_uint_eq(back.u.heartbeat.nreplica, 2);
    ck_assert_str_eq(back.u.heartbeat.replica[1], "step10");
    ck_assert_int_eq(back.u.heartbeat.has_memckpt, 0);
    proto_msg_clear(&back);
    strcpy(m.u.heartbeat.replica_of, "b/c"); /* a node name */
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    const char *head = "{\"generation\":1,\"seq\":1,\"ranks\":[]";
    char text[4096];
    snprintf(text, sizeof(text), "%s,\"memory_replicas\":[\"a\"]}", head); /* whose? */
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_E_RANGE);
    snprintf(text, sizeof(text), "%s,\"memory_replica_of\":\"b\"}", head); /* and which? */
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_E_MISSING);
    snprintf(text, sizeof(text), "%s,\"memory_replica_of\":\"b\",\"memory_replicas\":[]}", head);
    ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), PROTO_OK);

    /* ASSIGN memory_checkpoint_from: only beside a checkpoint it names */
    memckpt_assign(&m);
    strcpy(m.u.assign.memckpt, "step10");
    strcpy(m.u.assign.memckpt_from, "a");
    n = proto_encode(&m, buf, sizeof(buf));
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(decode_exact(buf, (size_t)n, &back, &consumed), PROTO_OK);
    ck_assert_str_eq(back.u.assign.memckpt_from, "a");
    proto_msg_clear(&back);
    m.u.assign.memckpt[0] = '\0';
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
    json_decref(m.u.assign.job);

    /* MEM_FILE: paths inside the checkpoint only */
    static const char *const good[] = {"a", "a/b", "global_step5/zero_pp_rank_0.pt", "x..y", ".hidden/f"};
    static const char *const bad[] = {"", "/abs", "a//b", "a/", "..", "../x", "a/../b", "./a", "a/.", "a\nb"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        ck_assert_msg(proto_valid_mem_path(good[i]), "%s refused", good[i]);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(!proto_valid_mem_path(bad[i]), "%s taken", bad[i]);
    const char *f = "{\"owner\":\"b\",\"tag\":\"step5\",\"path\":\"%s\",\"offset\":%d,\"size\":%d,\"data\":\"%s\"}";
    snprintf(text, sizeof(text), f, "x/y", 0, 3, "AQID");
    ck_assert_int_eq(decode_text(PROTO_MEM_FILE, text), PROTO_OK);
    snprintf(text, sizeof(text), f, "../y", 0, 3, "AQID");
    ck_assert_int_eq(decode_text(PROTO_MEM_FILE, text), PROTO_E_RANGE);
    snprintf(text, sizeof(text), f, "/etc/passwd", 0, 3, "AQID");
    ck_assert_int_eq(decode_text(PROTO_MEM_FILE, text), PROTO_E_RANGE);
    snprintf(text, sizeof(text), f, "x", 1, 3, "AQID"); /* past its size */
    ck_assert_int_eq(decode_text(PROTO_MEM_FILE, text), PROTO_E_RANGE);
    static const char *const not_b64[] = {"AQI", "AQ=D", "A===", "AQJ=", "AQ\\u0000D", "AQ*D", "AQ==AQID"};
    for (size_t i = 0; i < sizeof(not_b64) / sizeof(not_b64[0]); i++) {
        snprintf(text, sizeof(text), f, "x", 0, 9, not_b64[i]);
        ck_assert_msg(decode_text(PROTO_MEM_FILE, text) < 0, "data %s taken", not_b64[i]);
    }
    snprintf(text, sizeof(text), f, "x", 0, 9, "AQ==");
    ck_assert_int_eq(decode_text(PROTO_MEM_FILE, text), PROTO_OK);
    snprintf(text, sizeof(text), "{\"owner\":\"b\",\"tag\":\"step5\",\"end\":true,\"path\":\"x\",\"offset\":0,"
             "\"size\":0,\"data\":\"\"}"); /* an end names no file */
    ck_assert_int_eq(decode_text(PROTO_MEM_FILE, text), PROTO_E_RANGE);
    /* the largest piece fits a frame, one byte more does not encode */
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MEM_FILE;
    strcpy(m.u.mem_file.owner, "b");
    strcpy(m.u.mem_file.tag, "step5");
    strcpy(m.u.mem_file.path, "x");
    static uint8_t data[PROTO_MEMDATA_MAX + 1];
    m.u.mem_file.data = data;
    m.u.mem_file.len = PROTO_MEMDATA_MAX;
    m.u.mem_file.size = PROTO_MEMDATA_MAX + 1;
    n = proto_encode(&m, buf, sizeof(buf));
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(decode_exact(buf, (size_t)n, &back, &consumed), PROTO_OK);
    ck_assert_uint_eq(back.u.mem_file.len, PROTO_MEMDATA_MAX);
    proto_msg_clear(&back);
    m.u.mem_file.len = PROTO_MEMDATA_MAX + 1;
    ck_assert_int_eq(proto_encode(&m, buf, sizeof(buf)), PROTO_E_RANGE);
}
END_TEST

START_TEST(assign_with_rendered_job_is_the_same_frame)
{
    static struct proto_msg m;
    static uint8_t a[PROTO_MAX_FRAME], b[PROTO_MAX_FRAME];
    memset(&m, 0, sizeof(m));
    m.type = PROTO_ASSIGN;
    m.u.assign.generation = 7;
    m.u.assign.world_size = 16;
    m.u.assign.nranks = 2;
    m.u.assign.ranks[1].rank = 9;
    m.u.assign.ranks[1].local_rank = 1;
    m.u.assign.ranks[1].device = 3;
    m.u.assign.ranks[0].rank = 8;
    m.u.assign.nnodes = 8;
    m.u.assign.node_rank = 4;
    snprintf(m.u.assign.master_addr, sizeof(m.u.assign.master_addr), "10.0.0.1");
    m.u.assign.master_port = 29500;
    json_t *job = json_pack("{s:s, s:i, s:[i,i], s:{s:f, s:b}, s:s}", "name", "j\u00e9b \"x\"", "nodes", 8, "list", 1, 2,
                            "nested", "lr", 0.0003, "on", 1, "rank_cmd", "python3 train.py --x=1");
    ck_assert_ptr_nonnull(job);
    m.u.assign.job = job;
    char *text = json_dumps(job, JSON_COMPACT);
    int na = 0, nb = 0;
    /* Every slot count; an address JSON escapes ('"', '\\') takes jansson's way, as do the others. */
    static const char *const addrs[] = {"10.0.0.1", "gpu-07.cluster.example", "a\"b", "c\\d", "{}[]:,"};
    for (uint32_t nranks = 1; nranks <= PROTO_MAX_LOCAL_RANKS; nranks += nranks < 4 ? 1 : 15) {
        for (size_t k = 0; k < 2 * sizeof(addrs) / sizeof(addrs[0]); k++) {
            m.u.assign.term = k % 2 ? 0 : 9007199254740991ULL; /* a leader's term, or none */
            m.u.assign.nranks = nranks;
            for (uint32_t i = 0; i < nranks; i++) {
                m.u.assign.ranks[i].rank = 8 * nranks + i;
                m.u.assign.ranks[i].local_rank = i;
                m.u.assign.ranks[i].device = nranks - 1 - i;
            }
            m.u.assign.world_size = 16 * nranks;
            snprintf(m.u.assign.master_addr, sizeof(m.u.assign.master_addr), "%s", addrs[k / 2]);
            m.u.assign.job_text = NULL;
            na = proto_encode(&m, a, sizeof(a));
            m.u.assign.job_text = text;
            nb = proto_encode(&m, b, sizeof(b));
            ck_assert_int_gt(na, 0);
            ck_assert_int_eq(na, nb);
            ck_assert_msg(memcmp(a, b, (size_t)na) == 0, "rendered: %.*s\ngiven:    %.*s", na - 8,
                          (const char *)a + 8, nb - 8, (const char *)b + 8);
        }
    }
    for (int cap = 0; cap < nb; cap += 7)
        ck_assert_int_eq(proto_encode(&m, a, (size_t)cap), PROTO_E_NOSPACE);
    struct proto_msg back;
    ck_assert_int_eq(decode_exact(b, (size_t)nb, &back, NULL), PROTO_OK);
    ck_assert(json_equal(back.u.assign.job, job));
    ck_assert_ptr_null(back.u.assign.job_text);
    proto_msg_clear(&back);
    free(text);
    json_decref(job);
}
END_TEST

/* ---- HEARTBEAT's fast path against the JSON codec ---- */

/* A heartbeat with every kind of field and awkward reals. */
static void varied_heartbeat(struct proto_msg *m, uint32_t nranks, uint64_t salt)
{
    static const double reals[] = {0.0, 1.0, 0.1, 1e20, 1e-5, 123456789.125, 2.5e-300, 1e300,
                                   0.30000000000000004, 7.0, 1e15, 1e17, -0.0, 4.9e-324};
    const size_t nr = sizeof(reals) / sizeof(reals[0]);
    memset(m, 0, sizeof(*m));
    m->type = PROTO_HEARTBEAT;
    struct proto_heartbeat *h = &m->u.heartbeat;
    h->generation = salt * 7919 % 1000003;
    h->seq = salt % 3 ? salt : PROTO_U64_MAX;
    h->free_port = salt % 2 ? (uint32_t)(29500 + salt % 100) : 0;
    h->no_ack = salt % 3 != 1;
    h->nranks = nranks;
    for (uint32_t i = 0; i < nranks; i++) {
        struct proto_rank_beat *b = &h->ranks[i];
        uint64_t k = salt + i;
        b->rank = (uint32_t)(k % 5 ? 8 * salt + i : UINT32_MAX - i);
        b->state = (enum proto_rank_state)(k % (PROTO_RANK_STATE_MAX + 1));
        b->step = k * 1000003 % (PROTO_U64_MAX / 3);
        b->loss = k % 6 == 0 ? NAN : k % 2 ? reals[k % nr] : -reals[(k + 3) % nr];
        b->tokens_per_s = fabs(reals[(k + 1) % nr]) * (double)(k % 4);
        b->comm_frac = fabs(reals[(k + 2) % nr]) > 1 ? 0.25 : fabs(reals[(k + 2) % nr]);
        b->checkpoint_step = k % 3 ? k * 10 : 0;
        b->silent = k % 4 == 1;
        b->step_bytes = k % 5 == 2 ? PROTO_U64_MAX : 0;
        b->peak_mem = k % 2 ? k << 20 : 0;
        b->rejoin = k % 3 == 1;
        b->yielded = k % 7 == 3;
        b->restore_from = (enum proto_restore)(k % (PROTO_RESTORE_MAX + 1));
        b->restore_step = b->restore_from != PROTO_RESTORE_NONE ? k : 0;
        static const char *const labels[] = {"", "train.py:88 in compute_loss", "all_reduce (distributed_c10d.py)",
                                             "/a/b.py:1 in <module> \xc3\xbc", "x"};
        const size_t nl = sizeof(labels) / sizeof(labels[0]);
        b->step_s = k % 3 ? fabs(reals[(k + 4) % nr]) : 0;
        b->has_step_age = k % 4 != 2;
        b->step_age_ms = b->has_step_age ? k * 37 % 100000 : 0;
        b->total_steps = k % 5 == 1 ? k * 1000 : 0;
        strcpy(b->where, labels[k % nl]);
        strcpy(b->waiting, labels[(k + 3) % nl]);
        if (salt % 3 == 0 && i == 0) /* an escape in every third: the fast path leaves those to jansson */
            strcpy(b->where, salt % 2 ? "q\"uo\\te \xc3\xbc" : "\\");
        b->stopped = k % 6 == 5;
    }
}

/* Both decoders over an exact copy of the payload: the fast one reads it
 * only if the JSON one reads the same message. Answers whether it did. */
static int fast_agrees(const uint8_t *payload, size_t n)
{
    static struct proto_msg fast, json;
    uint8_t *p = copy_exact(payload, n);
    memset(&fast, 0, sizeof(fast));
    memset(&json, 0, sizeof(json));
    fast.type = json.type = PROTO_HEARTBEAT;
    int took = fastbeat_decode(p, n, &fast) == 0;
    int rc = proto_decode_payload_json(p, n, &json);
    free(p);
    if (took) {
        ck_assert_msg(rc == PROTO_OK, "the fast path read %.*s, which the JSON decoder refuses (%d)", (int)n,
                      (const char *)payload, rc);
        ck_assert_msg(memcmp(&fast.u.heartbeat, &json.u.heartbeat, sizeof(fast.u.heartbeat)) == 0,
                      "the two decoders read %.*s differently", (int)n, (const char *)payload);
    } else {
        struct proto_heartbeat zero;
        memset(&zero, 0, sizeof(zero));
        ck_assert_msg(memcmp(&fast.u.heartbeat, &zero, sizeof(zero)) == 0, "a refused payload left fields set");
    }
    proto_msg_clear(&json);
    return took;
}

/* "ack" asks for the daemon's answer or waives it; both decoders read it
 * alike, and anything but a boolean is refused. */
START_TEST(heartbeat_ack_is_read_by_both_decoders)
{
    static const char *const head = "{\"generation\":1,\"seq\":5,";
    static const char *const tail = "\"ranks\":[]}";
    char text[128];
    struct { const char *ack; int rc, no_ack; } cases[] = {
        {"", PROTO_OK, 0}, {"\"ack\":true,", PROTO_OK, 0}, {"\"ack\":false,", PROTO_OK, 1},
        {"\"ack\":0,", PROTO_E_FIELD_TYPE, 0}, {"\"ack\":\"no\",", PROTO_E_FIELD_TYPE, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(text, sizeof(text), "%s%s%s", head, cases[i].ack, tail);
        ck_assert_int_eq(decode_text(PROTO_HEARTBEAT, text), cases[i].rc);
        if (cases[i].rc != PROTO_OK)
            continue;
        ck_assert_int_eq(fast_agrees((const uint8_t *)text, strlen(text)), 1);
        static struct proto_msg m;
        memset(&m, 0, sizeof(m));
        m.type = PROTO_HEARTBEAT;
        ck_assert_int_eq(fastbeat_decode((const uint8_t *)text, strlen(text), &m), 0);
        ck_assert_int_eq(m.u.heartbeat.no_ack, cases[i].no_ack);
    }
}
END_TEST

/* An agent beating every interval, answered 3 ms after each heartbeat that
 * asks, asks once per ack period: every other beat with the defaults, every
 * fifth at 200 ms / 2 s, every beat when the period is one interval, and
 * again on the next beat when an answer does not come. */
START_TEST(agent_asks_once_per_ack_period)
{
    struct { uint32_t interval, timeout, every_nth; } cases[] = {{1000, 5000, 2}, {200, 2000, 5}, {1000, 1500, 1}};
    for (size_t c = 0; c < 3; c++) {
        const uint32_t iv = cases[c].interval, every = proto_ack_every_ms(iv, cases[c].timeout, 10000);
        uint64_t beats = 0; /* since WELCOME */
        int asked = 0;
        for (int beat = 1; beat <= 60; beat++) {
            if (proto_ack_due(++beats, iv, every)) {
                ck_assert_msg(beat % cases[c].every_nth == 0, "case %zu asked on beat %d", c, beat);
                beats = 0; /* answered before the next beat */
                asked++;
            }
        }
        ck_assert_int_eq(asked, 60 / cases[c].every_nth);
    }
    /* Unanswered: every later heartbeat asks. */
    ck_assert(proto_ack_due(2, 1000, 2000));
    ck_assert(proto_ack_due(3, 1000, 2000));
    ck_assert(proto_ack_due(4, 1000, 2000));
    ck_assert(!proto_ack_due(1, 1000, 2000));
}
END_TEST

/* An agent beating every interval whose asking heartbeats are answered after
 * any latency below one interval (a busy daemon, a long path), the latency
 * changing from answer to answer: the daemon's frames are never lease_ms
 * apart (the lease holds), and the first heartbeat that asks after an answer
 * is sent at most ack_every_ms after that answer (the stall bound of
 * PROTOCOL.md). With lease_ms at its least, twice the interval, every
 * heartbeat asks. */
START_TEST(asking_holds_the_lease_whatever_the_answer_latency)
{
    struct { uint32_t interval, timeout, lease; } cases[] = {
        {1000, 5000, 10000}, {1000, 5000, 2000}, {100, 1000, 200}, {50, 100, 100},
        {200, 2000, 10000}, {1000, 4000, 10000}, {2400, 5000, 10000}, {1000, 60000, 4000},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const uint32_t iv = cases[c].interval, lease = cases[c].lease;
        const uint32_t every = proto_ack_every_ms(iv, cases[c].timeout, lease);
        uint64_t last_rx = 100000, answer_at = 0; /* WELCOME; the answer on its way (0: none) */
        uint64_t longest = 0, beats = 0;
        for (uint32_t beat = 1; beat <= 400; beat++) {
            const uint64_t now = 100000 + (uint64_t)beat * iv + beat % 3; /* timers jitter a little */
            if (answer_at && answer_at <= now) { /* came before this beat */
                longest = answer_at - last_rx > longest ? answer_at - last_rx : longest;
                last_rx = answer_at;
                answer_at = 0;
                beats = 0;
            }
            const int ask = proto_ack_due(++beats, iv, every);
            ck_assert_msg(ask || now + iv <= last_rx + every + 3,
                          "case %zu: beat %u (%llu ms after the last answer) does not ask, the next one is past "
                          "ack_every_ms %u", c, beat, (unsigned long long)(now - last_rx), every);
            if (ask && !answer_at)
                answer_at = now + (uint64_t)beat * 7919 % iv; /* 0 .. interval-1 ms later */
        }
        ck_assert_msg(longest < lease, "case %zu: the daemon's frames %llu ms apart, lease %u ms", c,
                      (unsigned long long)longest, lease);
    }
}
END_TEST

/* An agent notices a stalled stream at most ack_every_ms after the last
 * answer (its next question) plus the stall time of PROTOCOL.md step 10 (a
 * quarter of the timeout, at least 200 ms): within three quarters of the
 * timeout, so that a quarter is left to resume before the daemon's deadline;
 * or, where even one interval does not fit, asking on every heartbeat as
 * before answers were asked for. */
START_TEST(ack_period_leaves_the_stall_seen_within_three_quarters_of_the_timeout)
{
    for (uint32_t iv = 50; iv <= 2000; iv += 50)
        for (uint32_t to = iv + 1; to <= 12000; to += 37) {
            const uint32_t p = proto_ack_every_ms(iv, to, 3600000), stall = to / 4 > 200 ? to / 4 : 200;
            ck_assert_msg(p == iv || (uint64_t)p + stall <= (uint64_t)to * 3 / 4,
                          "interval %u, timeout %u: asks every %u ms, a stall is seen %u ms after the last answer",
                          iv, to, p, p + stall);
        }
}
END_TEST

/* How often an agent asks: whole intervals within half the timeout, three
 * quarters of it less the stall time, and half the lease, and at least one
 * interval. */
START_TEST(ack_period_fits_the_timeout_and_the_lease)
{
    ck_assert_uint_eq(proto_ack_every_ms(1000, 5000, 10000), 2000); /* the defaults: every other beat */
    ck_assert_uint_eq(proto_ack_every_ms(200, 2000, 10000), 1000);
    ck_assert_uint_eq(proto_ack_every_ms(1000, 60000, 4000), 2000); /* the lease is the bound */
    ck_assert_uint_eq(proto_ack_every_ms(1000, 1500, 10000), 1000); /* never less than one interval */
    ck_assert_uint_eq(proto_ack_every_ms(300, 1000, 100000), 300);
    ck_assert_uint_eq(proto_ack_every_ms(100, 600, 10000), 200); /* 450 - 200 ms of stall time */
    ck_assert_uint_eq(proto_ack_every_ms(100, 400, 10000), 100);
    ck_assert_uint_eq(proto_ack_every_ms(0, 1000, 1000), 0);
    static const uint32_t leases[] = {0, 10000, 3600000}; /* 0: twice the interval */
    for (uint32_t iv = 50; iv <= 5000; iv += 50)
        for (uint32_t to = iv + 1; to <= 20000; to += 997)
            for (size_t l = 0; l < 3; l++) {
                uint32_t lease = leases[l] ? leases[l] : 2 * iv;
                uint32_t p = proto_ack_every_ms(iv, to, lease), room = to / 2 < lease / 2 ? to / 2 : lease / 2;
                const uint32_t seen = to * 3 / 4 > proto_stall_ms(to) ? to * 3 / 4 - proto_stall_ms(to) : 0;
                room = room < seen ? room : seen;
                ck_assert_uint_ge(p, iv);
                ck_assert_uint_eq(p % iv, 0);
                ck_assert(p == iv || p <= room);   /* within the room, or the one interval */
                ck_assert_uint_gt(p + iv, room);    /* and the most whole intervals that fit */
            }
}
END_TEST

/* proto_decode writes a heartbeat's head and the entries in use, not the
 * whole message: decoded over the bytes of an earlier message, by either
 * decoder, it reads byte for byte as over zeroes; a frame not all here
 * writes its type alone, and an error zeroes it. */
START_TEST(heartbeat_decoded_over_old_bytes_reads_as_over_zeroes)
{
    static struct proto_msg m, clean, dirty;
    static uint8_t frame[PROTO_MAX_FRAME];
    const size_t head = offsetof(struct proto_heartbeat, ranks);
    for (uint32_t nranks = 0; nranks <= PROTO_MAX_LOCAL_RANKS; nranks += nranks < 9 ? 1 : 11) {
        for (uint64_t salt = 1; salt <= 6; salt++) { /* salt 3 and 6: an escape, read by jansson */
            varied_heartbeat(&m, nranks, salt);
            int n = proto_encode(&m, frame, sizeof(frame));
            ck_assert_int_gt(n, 0);
            memset(&clean, 0, sizeof(clean));
            memset(&dirty, 0xa5, sizeof(dirty));
            ck_assert_int_eq(decode_exact(frame, (size_t)n, &clean, NULL), PROTO_OK);
            ck_assert_int_eq(decode_exact(frame, (size_t)n, &dirty, NULL), PROTO_OK);
            ck_assert_int_eq(dirty.type, PROTO_HEARTBEAT);
            ck_assert_uint_eq(dirty.u.heartbeat.nranks, nranks);
            ck_assert_mem_eq(&dirty.u.heartbeat, &clean.u.heartbeat, head + nranks * sizeof(m.u.heartbeat.ranks[0]));
            assert_msg_eq(&m, &dirty);
            /* The frame less its last byte: more is needed, and the message is no type. */
            memset(&dirty, 0xa5, sizeof(dirty));
            ck_assert_int_eq(decode_exact(frame, (size_t)n - 1, &dirty, NULL), PROTO_NEED_MORE);
            ck_assert_int_eq(dirty.type, 0);
            proto_msg_clear(&dirty);
        }
    }
    /* A bad payload after a good start (the fast path wrote entries, then refused). */
    static const char bad[] = "{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":0,\"state\":\"running\",\"step\":1,"
                              "\"loss\":1.5,\"tokens_per_s\":2.0,\"comm_frac\":0.5},{\"rank\":1}]}";
    size_t n = raw_frame(frame, PROTO_VERSION, PROTO_HEARTBEAT, bad, strlen(bad));
    memset(&dirty, 0xa5, sizeof(dirty));
    memset(&clean, 0, sizeof(clean));
    ck_assert_int_eq(decode_exact(frame, n, &dirty, NULL), PROTO_E_MISSING);
    ck_assert_mem_eq(&dirty, &clean, sizeof(dirty));
}
END_TEST

START_TEST(fastbeat_writes_what_jansson_writes_and_reads_it_back)
{
    static struct proto_msg m, back;
    static uint8_t fast[PROTO_MAX_FRAME], json[PROTO_MAX_FRAME];
    for (uint32_t nranks = 0; nranks <= PROTO_MAX_LOCAL_RANKS; nranks += nranks < 9 ? 1 : 11) {
        for (uint64_t salt = 1; salt <= 12; salt++) {
            varied_heartbeat(&m, nranks, salt);
            ck_assert_int_eq(proto_check(&m), PROTO_OK);
            int nf = fastbeat_encode(&m.u.heartbeat, fast, sizeof(fast));
            int nj = proto_encode_payload_json(&m, json, sizeof(json));
            ck_assert_int_gt(nf, 0);
            ck_assert_int_eq(nf, nj);
            ck_assert_msg(memcmp(fast, json, (size_t)nf) == 0, "fast:  %.*s\njson:  %.*s", nf, (const char *)fast,
                          nj, (const char *)json);
            /* It reads back what it wrote, but for a string with an escape, which it leaves to jansson. */
            int escaped = salt % 3 == 0 && nranks > 0;
            ck_assert_int_eq(fast_agrees(fast, (size_t)nf), !escaped);
            if (escaped) {
                ck_assert_int_eq(fastbeat_encode(&m.u.heartbeat, fast, (size_t)nf - 1), PROTO_E_NOSPACE);
                continue;
            }
            memset(&back, 0, sizeof(back));
            back.type = PROTO_HEARTBEAT;
            ck_assert_int_eq(fastbeat_decode(fast, (size_t)nf, &back), 0);
            ck_assert_uint_eq(back.u.heartbeat.nranks, nranks);
            ck_assert_uint_eq(back.u.heartbeat.seq, m.u.heartbeat.seq);
            ck_assert_int_eq(back.u.heartbeat.no_ack, m.u.heartbeat.no_ack);
            for (uint32_t i = 0; i < nranks; i++) {
                const struct proto_rank_beat *a = &m.u.heartbeat.ranks[i], *b = &back.u.heartbeat.ranks[i];
                ck_assert(isnan(a->loss) ? isnan(b->loss) : a->loss == b->loss);
                ck_assert(a->tokens_per_s == b->tokens_per_s && a->comm_frac == b->comm_frac);
                ck_assert_uint_eq(a->step, b->step);
                ck_assert_int_eq(a->restore_from, b->restore_from);
                ck_assert(a->step_s == b->step_s);
                ck_assert_uint_eq(a->step_age_ms, b->step_age_ms);
                ck_assert_str_eq(a->where, b->where);
                ck_assert_str_eq(a->waiting, b->waiting);
            }
            /* Every buffer too short by one byte or more is refused. */
            ck_assert_int_eq(fastbeat_encode(&m.u.heartbeat, fast, (size_t)nf - 1), PROTO_E_NOSPACE);
        }
    }
}
END_TEST

/* strtod's answer, as the fast path used to take it: the whole text read,
 * HUGE_VAL (overflow) refused, an underflow's rounding kept. */
static int strtod_reads(const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (*end != '\0' || (errno == ERANGE && (v == HUGE_VAL || v == -HUGE_VAL)))
        return 0;
    *out = v;
    return 1;
}

static void real_reads_as_strtod(const char *text)
{
    double want = 0, got = 0;
    int ok_want = strtod_reads(text, &want), ok_got = proto_read_real(text, strlen(text), &got);
    ck_assert_msg(ok_got == ok_want, "%s: read %d, strtod %d", text, ok_got, ok_want);
    if (ok_want)
        ck_assert_msg(memcmp(&got, &want, sizeof(got)) == 0, "%s: read %a, strtod %a", text, got, want);
}

START_TEST(reals_are_read_as_strtod_reads_them)
{
    static const char *const edges[] = {
        "0.0", "-0.0", "0e0", "1e0", "-1.5", "0.1", "2.5", "1E5", "1e-5",
        "9007199254740993.0",         /* halfway between two doubles: ties to even */
        "9007199254740995.0",
        "2.2250738585072011e-308",    /* just below the smallest normal */
        "2.2250738585072014e-308",    /* the smallest normal */
        "4.9406564584124654e-324",    /* the smallest subnormal */
        "2.4703282292062327e-324",    /* below half of it: zero */
        "2.4703282292062328e-324",    /* above half of it: the smallest subnormal */
        "1e-400", "-1e-400",          /* underflow: zero, taken as strtod gives it */
        "1.7976931348623157e308",     /* the largest double */
        "1.7976931348623158e308",     /* rounds down to it */
        "1.7976931348623159e308",     /* beyond: refused */
        "1e400", "-1e400",
        "123456789012345678901234567890.5e-10",
        "0.30000000000000000000000000000000000000000000000000000000000000000000000000000001",
        "7.2057594037927933e16", "3.0517578125e-05", "1.00000000000000011102230246251565404236316680908203125",
        "1.00000000000000011102230246251565404236316680908203124",
        "1.00000000000000011102230246251565404236316680908203126",
    };
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
        real_reads_as_strtod(edges[i]);

    /* Every double printed as agents and JSON encoders print it, and shorter. */
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    char text[512];
    static const char *const formats[] = {"%.17g", "%.16g", "%.15g", "%.9g", "%.3e", "%.20e"};
    for (int i = 0; i < 20000; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        double v;
        memcpy(&v, &rng, sizeof(v));
        if (!isfinite(v))
            continue;
        snprintf(text, sizeof(text), formats[i % 6], v);
        real_reads_as_strtod(text);
        /* figures of the size trainers report */
        snprintf(text, sizeof(text), "%.17g", (double)(rng >> 11) / 9007199254740992.0 * (i % 2 ? 1e5 : 10.0));
        real_reads_as_strtod(text);
    }
    /* Random digit strings: long mantissas, exponents over the whole range and past it. */
    for (int i = 0; i < 20000; i++) {
        size_t n = 0;
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        if (rng & 1)
            text[n++] = '-';
        int digits = 1 + (int)((rng >> 8) % 40), point = (int)((rng >> 16) % (uint64_t)(digits + 1));
        for (int d = 0; d < digits; d++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            if (d == point && d > 0)
                text[n++] = '.';
            text[n++] = (char)('0' + (d == 0 && digits > 1 && point != 1 ? 1 + rng % 9 : rng % 10));
        }
        n += (size_t)snprintf(text + n, sizeof(text) - n, "e%d", (int)((rng >> 20) % 700) - 350);
        real_reads_as_strtod(text);
    }
}
END_TEST

START_TEST(fastbeat_leaves_the_unusual_to_the_json_decoder)
{
    static const struct {
        const char *payload;
        int fast; /* 1: the fast path reads it; 0: the JSON decoder must */
    } cases[] = {
        {"{\"generation\":1,\"seq\":2,\"ranks\":[]}", 1},
        {"{\"ranks\":[],\"seq\":2,\"generation\":1}", 1},
        {"{\"generation\":1,\"seq\":2,\"free_port\":0,\"ranks\":[]}", 1},
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"comm_frac\":0,\"tokens_per_s\":5,\"loss\":-0,"
         "\"step\":0,\"state\":\"running\",\"rank\":3,\"silent\":false,\"rejoin\":false}]}", 1},
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"running\",\"step\":0,\"loss\":1E+2,"
         "\"tokens_per_s\":0.5e1,\"comm_frac\":1}]}", 1},
        {"{ \"generation\":1,\"seq\":2,\"ranks\":[]}", 0},                   /* whitespace */
        {"{\"generation\":1,\"seq\":2,\"ranks\":[]}\n", 0},                  /* after the object */
        {"{\"generation\":1,\"\\u0073eq\":2,\"ranks\":[]}", 0},              /* an escaped key */
        {"{\"generation\":1,\"seq\":2,\"seq\":2,\"ranks\":[]}", 0},          /* a key twice */
        {"{\"generation\":1,\"seq\":2}", 0},                                 /* missing */
        {"{\"generation\":1,\"seq\":2,\"ranks\":[],\"x\":1}", 0},            /* unknown */
        {"{\"generation\":1.0,\"seq\":2,\"ranks\":[]}", 0},                  /* a real for an integer */
        {"{\"generation\":01,\"seq\":2,\"ranks\":[]}", 0},                   /* leading zero */
        {"{\"generation\":9007199254740992,\"seq\":2,\"ranks\":[]}", 0},     /* 2^53 */
        {"{\"generation\":1,\"seq\":2,\"free_port\":65536,\"ranks\":[]}", 0}, /* proto_check */
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"running\",\"step\":0,\"loss\":1e999,"
         "\"tokens_per_s\":1,\"comm_frac\":0}]}", 0},                        /* overflows */
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"running\",\"step\":0,"
         "\"loss\":1234567890123456,\"tokens_per_s\":1,\"comm_frac\":0}]}", 0}, /* 16 digits in a number */
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"Running\",\"step\":0,\"loss\":1,"
         "\"tokens_per_s\":1,\"comm_frac\":0}]}", 0},
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"running\",\"step\":0,\"loss\":1,"
         "\"tokens_per_s\":1,\"comm_frac\":0,\"restore_step\":4}]}", 0},      /* half a pair */
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"running\",\"step\":0,\"loss\":1,"
         "\"tokens_per_s\":1,\"comm_frac\":0,\"where\":\"t.py:3 in f \xe2\x82\xac\",\"stopped\":true}]}", 1},
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"running\",\"step\":0,\"loss\":1,"
         "\"tokens_per_s\":1,\"comm_frac\":0,\"where\":\"t.py:3 \\\"f\\\"\"}]}", 0},   /* an escape */
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"running\",\"step\":0,\"loss\":1,"
         "\"tokens_per_s\":1,\"comm_frac\":0,\"waiting\":\"\"}]}", 0},        /* an empty label */
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"running\",\"step\":0,\"loss\":1,"
         "\"tokens_per_s\":1,\"comm_frac\":0,\"where\":\"a\x7f\"}]}", 0},     /* DEL: proto_check */
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"running\",\"step\":0,\"loss\":1,"
         "\"tokens_per_s\":1,\"comm_frac\":0,\"where\":\"a\xe2\x82\"}]}", 0},  /* cut UTF-8 */
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"running\",\"step\":0,\"loss\":1,"
         "\"tokens_per_s\":1,\"comm_frac\":0,\"step_age_ms\":0,\"step_s\":2.5}]}", 1},
        {"{\"generation\":1,\"seq\":2,\"ranks\":[{\"rank\":3,\"state\":\"running\",\"step\":0,\"loss\":1,"
         "\"tokens_per_s\":1,\"comm_frac\":0},{\"rank\":3,\"state\":\"running\",\"step\":0,\"loss\":1,"
         "\"tokens_per_s\":1,\"comm_frac\":0}]}", 0},                        /* a rank twice */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_msg(fast_agrees((const uint8_t *)cases[i].payload, strlen(cases[i].payload)) == cases[i].fast,
                      "case %zu (%s): expected the %s path", i, cases[i].payload,
                      cases[i].fast ? "fast" : "JSON");
}
END_TEST

/* Deterministic mutations of valid heartbeats: whatever the fast path reads, the JSON decoder reads alike. */
START_TEST(fastbeat_agrees_on_mutated_payloads)
{
    static struct proto_msg m;
    static uint8_t base[PROTO_MAX_FRAME], buf[PROTO_MAX_FRAME];
    static const char tokens[] = "{}[]:,\"0123456789.eE+- \\atrunlfsx";
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    unsigned taken = 0, tried = 0;
    for (uint64_t salt = 1; salt <= 40; salt++) {
        varied_heartbeat(&m, (uint32_t)(salt % 4), salt);
        int n = fastbeat_encode(&m.u.heartbeat, base, sizeof(base));
        ck_assert_int_gt(n, 0);
        for (int round = 0; round < 500; round++) {
            size_t len = (size_t)n;
            memcpy(buf, base, len);
            int edits = 1 + round % 3;
            for (int e = 0; e < edits; e++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                size_t at = (size_t)(rng >> 16) % (len + 1);
                char t = tokens[(rng >> 40) % (sizeof(tokens) - 1)];
                switch (rng % 3) {
                case 0: if (at < len) buf[at] = (uint8_t)t; break;                          /* replace */
                case 1: if (at < len) memmove(buf + at, buf + at + 1, len - at - 1), len--; break; /* delete */
                default: memmove(buf + at + 1, buf + at, len - at), buf[at] = (uint8_t)t, len++; /* insert */
                }
            }
            taken += (unsigned)fast_agrees(buf, len);
            tried++;
        }
    }
    /* Not vacuous: some mutations (a digit for a digit) stay valid and fast. */
    ck_assert_uint_gt(taken, tried / 50);
    ck_assert_uint_lt(taken, tried);
}
END_TEST

Suite *make_proto_suite(void)
{
    Suite *s = suite_create("proto");
    TCase *tc;

    tc = tcase_create("roundtrip");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, roundtrip_each_type, PROTO_HELLO, PROTO_TYPE_MAX + 1);
    tcase_add_test(tc, roundtrip_edges);
    tcase_add_test(tc, session_is_optional_and_bounded);
    tcase_add_test(tc, term_is_optional_and_bounded);
    tcase_add_test(tc, fullest_hello_fits_before_authentication);
    tcase_add_test(tc, roundtrip_log_edges);
    tcase_add_test(tc, log_sanitize_keeps_every_byte);
    tcase_add_test(tc, non_finite_loss_travels_as_null);
    tcase_add_test(tc, encode_keeps_callers_job_reference);
    tcase_add_test(tc, decoded_job_outlives_the_frame);
    tcase_add_test(tc, frame_layout_is_as_documented);
    suite_add_tcase(s, tc);

    tc = tcase_create("encode");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, encode_refuses_what_would_not_decode);
    tcase_add_test(tc, encode_reports_nospace_for_every_short_buffer);
    tcase_add_test(tc, encode_refuses_oversize_job);
    tcase_add_test(tc, assign_with_rendered_job_is_the_same_frame);
    tcase_add_test(tc, memory_checkpoints_on_the_wire);
    tcase_add_test(tc, memory_replicas_on_the_wire);
    tcase_add_test(tc, heartbeat_spare_note_on_the_wire);
    tcase_add_test(tc, memory_drains_on_the_wire);
    suite_add_tcase(s, tc);

    tc = tcase_create("fastbeat");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fastbeat_writes_what_jansson_writes_and_reads_it_back);
    tcase_add_test(tc, heartbeat_decoded_over_old_bytes_reads_as_over_zeroes);
    tcase_add_test(tc, fastbeat_leaves_the_unusual_to_the_json_decoder);
    tcase_add_test(tc, fastbeat_agrees_on_mutated_payloads);
    tcase_add_test(tc, reals_are_read_as_strtod_reads_them);
    suite_add_tcase(s, tc);

    tc = tcase_create("decode_errors");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, header_errors_as_soon_as_header_is_there);
    tcase_add_test(tc, hand_written_frames_decode);
    tcase_add_test(tc, hello_domain_of_odd_bytes_is_refused);
    tcase_add_test(tc, json_errors);
    tcase_add_test(tc, missing_fields);
    tcase_add_test(tc, every_field_is_required);
    tcase_add_test(tc, field_type_errors);
    tcase_add_test(tc, every_field_checks_its_type);
    tcase_add_test(tc, range_errors);
    tcase_add_test(tc, rank_progress_fields_are_bounded);
    tcase_add_test(tc, stacks_are_bounded);
    tcase_add_test(tc, unknown_fields);
    tcase_add_test(tc, heartbeat_ack_is_read_by_both_decoders);
    tcase_add_test(tc, ack_period_fits_the_timeout_and_the_lease);
    tcase_add_test(tc, ack_period_leaves_the_stall_seen_within_three_quarters_of_the_timeout);
    tcase_add_test(tc, agent_asks_once_per_ack_period);
    tcase_add_test(tc, asking_holds_the_lease_whatever_the_answer_latency);
    suite_add_tcase(s, tc);

    tc = tcase_create("stream");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, every_prefix_needs_more);
    tcase_add_test(tc, frames_back_to_back);
    tcase_add_test(tc, payload_error_reports_frame_length);
    suite_add_tcase(s, tc);

    tc = tcase_create("auth");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, hmac_matches_rfc4231);
    tcase_add_test(tc, hkdf_matches_rfc5869);
    tcase_add_test(tc, proofs_bind_the_connection);
    tcase_add_test(tc, channel_carries_frames_both_ways);
    tcase_add_test(tc, channel_refuses_forged_replayed_reordered);
    tcase_add_test(tc, channel_payload_error_keeps_step);
    tcase_add_test(tc, nonces_differ);
    tcase_add_test(tc, names_are_distinct);
    suite_add_tcase(s, tc);

    tc = tcase_create("mutation");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, mutated_frames_get_a_defined_answer);
    suite_add_tcase(s, tc);

    return s;
}

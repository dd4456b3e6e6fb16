/*
 * etcd: the v3 JSON gateway's requests and answers (daemon/etcd_codec.h),
 * checked on raw text as etcd 3.4 writes it, and the leader election's
 * state machine (daemon/leader.h) driven with a fake clock.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "daemon/etcd_codec.h"
#include "daemon/leader.h"

START_TEST(endpoints_parse_and_refuse)
{
    struct etcd_endpoints ep;
    char err[256];
    ck_assert_int_eq(etcd_endpoints_parse("etcd://a:2379,10.0.0.2:2380,[::1]:2379", &ep, err, sizeof(err)), 0);
    ck_assert_int_eq(ep.n, 3);
    ck_assert_str_eq(ep.url[0], "http://a:2379");
    ck_assert_str_eq(ep.url[1], "http://10.0.0.2:2380");
    ck_assert_str_eq(ep.url[2], "http://[::1]:2379");
    ck_assert_int_eq(ep.tls, 0);
    ck_assert_int_eq(etcd_endpoints_parse("http://a:2379", &ep, err, sizeof(err)), 0);
    ck_assert_str_eq(ep.url[0], "http://a:2379");
    ck_assert_int_eq(ep.tls, 0);
    ck_assert_int_eq(etcd_endpoints_parse("https://a:2379,b:2379", &ep, err, sizeof(err)), 0);
    ck_assert_str_eq(ep.url[1], "https://b:2379");
    ck_assert_int_eq(ep.tls, 1);
    ck_assert_int_eq(etcd_endpoints_parse("etcds://a:2379", &ep, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "https://"));
    ck_assert_int_eq(etcd_endpoints_parse("etcd://a:2379,b", &ep, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "'b'"));
    ck_assert_int_eq(etcd_endpoints_parse("etcd://a:0", &ep, err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(etcd_endpoints_parse("etcd://a b:1", &ep, err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(etcd_endpoints_parse("etcd://a:1,", &ep, err, sizeof(err)), -EINVAL);
}
END_TEST

START_TEST(base64_round_trips_and_refuses)
{
    const char *cases[] = {"", "a", "ab", "abc", "/muster/job/leader", "{\"x\": 1}\n"};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *b = etcd_b64(cases[i], strlen(cases[i]));
        char *back;
        size_t len;
        ck_assert_ptr_nonnull(b);
        ck_assert_uint_eq(strlen(b) % 4, 0);
        ck_assert_int_eq(etcd_unb64(b, &back, &len), 0);
        ck_assert_uint_eq(len, strlen(cases[i]));
        ck_assert_mem_eq(back, cases[i], len);
        free(b);
        free(back);
    }
    char *b = etcd_b64("muster", 6);
    ck_assert_str_eq(b, "bXVzdGVy");
    free(b);
    char *out;
    size_t len;
    ck_assert_int_eq(etcd_unb64("bXVzdGVy!", &out, &len), -EINVAL);
    ck_assert_int_eq(etcd_unb64("bXV", &out, &len), -EINVAL);
    ck_assert_int_eq(etcd_unb64("b=Vz", &out, &len), -EINVAL);
}
END_TEST

/* A request body's field, as JSON. */
static json_t *body(char *text)
{
    ck_assert_ptr_nonnull(text);
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    free(text);
    ck_assert_ptr_nonnull(j);
    return j;
}

static void assert_b64(json_t *v, const char *want)
{
    char *got;
    size_t len;
    ck_assert(json_is_string(v));
    ck_assert_int_eq(etcd_unb64(json_string_value(v), &got, &len), 0);
    ck_assert_str_eq(got, want);
    free(got);
}

START_TEST(requests_encode_keys_and_int64s)
{
    json_t *j = body(etcd_body_campaign("/muster/j/leader", "h:29470", 7271239828514847495LL));
    json_t *cmp = json_array_get(json_object_get(j, "compare"), 0);
    assert_b64(json_object_get(cmp, "key"), "/muster/j/leader");
    ck_assert_str_eq(json_string_value(json_object_get(cmp, "target")), "CREATE");
    ck_assert_str_eq(json_string_value(json_object_get(cmp, "create_revision")), "0");
    json_t *put = json_object_get(json_array_get(json_object_get(j, "success"), 0), "request_put");
    assert_b64(json_object_get(put, "value"), "h:29470");
    ck_assert_str_eq(json_string_value(json_object_get(put, "lease")), "7271239828514847495");
    json_t *rng = json_object_get(json_array_get(json_object_get(j, "failure"), 0), "request_range");
    assert_b64(json_object_get(rng, "key"), "/muster/j/leader");
    json_decref(j);

    j = body(etcd_body_put_if("/muster/j/leader", 42, "/muster/j/state", "{}"));
    cmp = json_array_get(json_object_get(j, "compare"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(cmp, "create_revision")), "42");
    put = json_object_get(json_array_get(json_object_get(j, "success"), 0), "request_put");
    assert_b64(json_object_get(put, "key"), "/muster/j/state");
    ck_assert_ptr_null(json_object_get(put, "lease"));
    ck_assert_ptr_null(json_object_get(j, "failure"));
    json_decref(j);

    j = body(etcd_body_watch("/k", 12));
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "create_request"), "start_revision")), "12");
    json_decref(j);
    j = body(etcd_body_watch("/k", 0));
    ck_assert_ptr_null(json_object_get(json_object_get(j, "create_request"), "start_revision"));
    json_decref(j);
    j = body(etcd_body_grant(3));
    ck_assert_str_eq(json_string_value(json_object_get(j, "TTL")), "3");
    json_decref(j);
}
END_TEST

#define HDR "\"header\":{\"cluster_id\":\"11285155084006346727\",\"revision\":\"5\",\"raft_term\":\"2\"}"

START_TEST(answers_parse_as_etcd_writes_them)
{
    char err[256];
    int64_t id, ttl, rev;
    int ok;
    struct etcd_kv kv;
    const char *grant = "{" HDR ",\"ID\":\"7271239828514847495\",\"TTL\":\"3\"}";
    ck_assert_int_eq(etcd_parse_grant(grant, strlen(grant), &id, &ttl, err, sizeof(err)), 0);
    ck_assert_int_eq(id, 7271239828514847495LL);
    ck_assert_int_eq(ttl, 3);

    const char *kept = "{\"result\":{" HDR ",\"ID\":\"7\",\"TTL\":\"3\"}}";
    ck_assert_int_eq(etcd_parse_keepalive(kept, strlen(kept), &ttl, err, sizeof(err)), 0);
    ck_assert_int_eq(ttl, 3);
    /* An ended lease: TTL left out (its default, 0). */
    const char *gone = "{\"result\":{" HDR ",\"ID\":\"7\"}}";
    ck_assert_int_eq(etcd_parse_keepalive(gone, strlen(gone), &ttl, err, sizeof(err)), 0);
    ck_assert_int_eq(ttl, 0);

    const char *won = "{" HDR ",\"succeeded\":true,\"responses\":[{\"response_put\":{\"header\":{\"revision\":\"5\"}}}]}";
    ck_assert_int_eq(etcd_parse_txn(won, strlen(won), &ok, &rev, &kv, err, sizeof(err)), 0);
    ck_assert_int_eq(ok, 1);
    ck_assert_int_eq(rev, 5);
    ck_assert_int_eq(kv.present, 0);

    const char *lost = "{" HDR ",\"responses\":[{\"response_range\":{\"header\":{\"revision\":\"5\"},\"kvs\":[{\"key\":"
                       "\"bXVzdGVyL2ovbGVhZGVy\",\"create_revision\":\"4\",\"mod_revision\":\"4\",\"version\":\"1\","
                       "\"value\":\"aDoyOTQ3MA==\",\"lease\":\"99\"}],\"count\":\"1\"}}]}";
    ck_assert_int_eq(etcd_parse_txn(lost, strlen(lost), &ok, &rev, &kv, err, sizeof(err)), 0);
    ck_assert_int_eq(ok, 0);
    ck_assert_int_eq(kv.present, 1);
    ck_assert_str_eq(kv.value, "h:29470");
    ck_assert_int_eq(kv.create_rev, 4);
    ck_assert_int_eq(kv.lease, 99);
    etcd_kv_free(&kv);

    const char *none = "{" HDR "}";
    ck_assert_int_eq(etcd_parse_range(none, strlen(none), &rev, &kv, err, sizeof(err)), 0);
    ck_assert_int_eq(kv.present, 0);

    struct etcd_watch_msg m;
    const char *created = "{\"result\":{" HDR ",\"created\":true}}";
    ck_assert_int_eq(etcd_parse_watch(created, strlen(created), &m, err, sizeof(err)), 0);
    ck_assert_int_eq(m.created, 1);
    ck_assert_int_eq(m.deleted, 0);
    const char *del = "{\"result\":{\"header\":{\"revision\":\"6\"},\"events\":[{\"type\":\"DELETE\",\"kv\":"
                      "{\"key\":\"bXVzdGVyL2ovbGVhZGVy\",\"mod_revision\":\"6\"}}]}}";
    ck_assert_int_eq(etcd_parse_watch(del, strlen(del), &m, err, sizeof(err)), 0);
    ck_assert_int_eq(m.deleted, 1);
    ck_assert_int_eq(m.revision, 6);
    /* A put (type left out: PUT is the default) is no deletion. */
    const char *put = "{\"result\":{\"header\":{\"revision\":\"7\"},\"events\":[{\"kv\":{\"key\":\"eA==\"}}]}}";
    ck_assert_int_eq(etcd_parse_watch(put, strlen(put), &m, err, sizeof(err)), 0);
    ck_assert_int_eq(m.deleted, 0);
    ck_assert_int_eq(m.put, 1); /* the leader's watch of its own key steps down on it */
    ck_assert_int_eq(etcd_parse_watch(del, strlen(del), &m, err, sizeof(err)), 0);
    ck_assert_int_eq(m.put, 0);
    ck_assert_int_eq(etcd_parse_watch(created, strlen(created), &m, err, sizeof(err)), 0);
    ck_assert_int_eq(m.put, 0);
}
END_TEST

/* A member's status, with a raft leader and without (as 3.4 answers when two
 * of three members are gone: no "leader", the reason among "errors"). */
START_TEST(status_says_whether_a_member_knows_a_leader)
{
    char err[256], why[128];
    int has = -1;
    const char *led = "{" HDR ",\"version\":\"3.4.23\",\"leader\":\"13668033151171901709\",\"raftTerm\":\"2\"}";
    ck_assert_int_eq(etcd_parse_status(led, strlen(led), &has, why, sizeof(why), err, sizeof(err)), 0);
    ck_assert_int_eq(has, 1);
    ck_assert_str_eq(why, "");
    const char *lost = "{" HDR ",\"version\":\"3.4.23\",\"raftTerm\":\"2\",\"errors\":[\"etcdserver: no leader\"]}";
    ck_assert_int_eq(etcd_parse_status(lost, strlen(lost), &has, why, sizeof(why), err, sizeof(err)), 0);
    ck_assert_int_eq(has, 0);
    ck_assert_str_eq(why, "etcdserver: no leader");
    const char *zero = "{" HDR ",\"leader\":\"0\"}";
    ck_assert_int_eq(etcd_parse_status(zero, strlen(zero), &has, why, sizeof(why), err, sizeof(err)), 0);
    ck_assert_int_eq(has, 0);
    /* Not a status: named. */
    const char *bad[] = {"{" HDR ",\"leader\":\"x1\"}", "{" HDR ",\"leader\":7}", "{" HDR ",\"errors\":\"no\"}",
                         "{\"leader\":\"1\"}", "[]"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(etcd_parse_status(bad[i], strlen(bad[i]), &has, why, sizeof(why), err, sizeof(err)), -EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "status"));
    }
}
END_TEST

/* etcd's auth: the token of /v3/auth/authenticate, and the refusals that
 * call for a new one. */
START_TEST(auth_token_and_refusals)
{
    char err[256], token[64];
    char *body = etcd_body_auth("muster", "p\"w");
    ck_assert_str_eq(body, "{\"name\":\"muster\",\"password\":\"p\\\"w\"}");
    free(body);
    const char *ok = "{" HDR ",\"token\":\"XsJvPAcVEHMLWFdC.13\"}";
    ck_assert_int_eq(etcd_parse_auth(ok, strlen(ok), token, sizeof(token), err, sizeof(err)), 0);
    ck_assert_str_eq(token, "XsJvPAcVEHMLWFdC.13");
    const char *wrong = "{\"error\":\"etcdserver: authentication failed, invalid user ID or password\",\"code\":3,"
                        "\"message\":\"etcdserver: authentication failed, invalid user ID or password\"}";
    ck_assert_int_eq(etcd_parse_auth(wrong, strlen(wrong), token, sizeof(token), err, sizeof(err)), -EIO);
    ck_assert_ptr_nonnull(strstr(err, "invalid user ID or password"));
    ck_assert_int_eq(etcd_unauthenticated(wrong, strlen(wrong)), 0);
    /* A token that would break the header, or none. */
    const char *bad[] = {"{" HDR ",\"token\":\"a b\"}", "{" HDR ",\"token\":\"a\\r\\nX: y\"}", "{" HDR "}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_int_eq(etcd_parse_auth(bad[i], strlen(bad[i]), token, sizeof(token), err, sizeof(err)), -EINVAL);
    const char *expired = "{\"error\":\"etcdserver: invalid auth token\",\"code\":16,"
                          "\"message\":\"etcdserver: invalid auth token\"}";
    ck_assert_int_eq(etcd_unauthenticated(expired, strlen(expired)), 1);
    const char *none = "{\"error\":{\"grpc_code\":3,\"message\":\"etcdserver: user name is empty\"}}";
    ck_assert_int_eq(etcd_unauthenticated(none, strlen(none)), 1);
    const char *other = "{\"error\":\"etcdserver: request timed out\",\"code\":14,\"message\":\"x\"}";
    ck_assert_int_eq(etcd_unauthenticated(other, strlen(other)), 0);
    ck_assert_int_eq(etcd_unauthenticated(ok, strlen(ok)), 0);
}
END_TEST

START_TEST(errors_and_garbage_are_named)
{
    char err[256];
    int64_t ttl, rev;
    int ok;
    struct etcd_kv kv;
    const char *e = "{\"error\":\"etcdserver: request timed out\",\"code\":14,\"message\":\"etcdserver: request timed out\"}";
    ck_assert_int_eq(etcd_parse_txn(e, strlen(e), &ok, &rev, &kv, err, sizeof(err)), -EIO);
    ck_assert_ptr_nonnull(strstr(err, "request timed out"));
    const char *se = "{\"error\":{\"grpc_code\":5,\"http_code\":404,\"message\":\"requested lease not found\"}}";
    ck_assert_int_eq(etcd_parse_keepalive(se, strlen(se), &ttl, err, sizeof(err)), -EIO);
    ck_assert_ptr_nonnull(strstr(err, "lease not found"));
    ck_assert_int_eq(etcd_parse_txn("nope", 4, &ok, &rev, &kv, err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(etcd_parse_txn("{}", 2, &ok, &rev, &kv, err, sizeof(err)), -EINVAL);
    const char *badv = "{" HDR ",\"kvs\":[{\"value\":\"!!!\"}]}";
    ck_assert_int_eq(etcd_parse_range(badv, strlen(badv), &rev, &kv, err, sizeof(err)), -EINVAL);
    const char *badi = "{" HDR ",\"ID\":\"12x\",\"TTL\":\"3\"}";
    int64_t id;
    ck_assert_int_eq(etcd_parse_grant(badi, strlen(badi), &id, &ttl, err, sizeof(err)), -EINVAL);
}
END_TEST

/* The leader key's value is taken only as a musterd writes it. */
START_TEST(leader_value_is_checked)
{
    char why[160];
#define OK(v) etcd_leader_value_ok(v, strlen(v), 32, why, sizeof(why))
    ck_assert(OK("a:1 http://a:2"));
    ck_assert(OK("[::1]:29470 https://[::1]:29471"));
    ck_assert(OK("a:1 "));
    ck_assert(OK("a:1"));
    ck_assert(!OK(""));
    ck_assert(!OK(" http://a:2"));
    ck_assert(!OK("a1 http://a:2"));
    ck_assert(!OK("a:1 http://a:2\r\nSet-Cookie: x=1"));
    ck_assert_ptr_nonnull(strstr(why, "REST address"));
    ck_assert(!OK("a:1\nb:2 http://a:2"));
    ck_assert_ptr_nonnull(strstr(why, "control address"));
    ck_assert(!OK("a:1 http://a:2 extra"));
    ck_assert(!OK("a:1 ftp://a:2"));
    ck_assert(!OK("a:1 javascript:alert(1)"));
    ck_assert(!OK("a:1 http://aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa:2"));
    ck_assert(!OK("a:123456789012345678901234567890123 http://a:2"));
    ck_assert(!OK("a:1 http://\xc3\xa9:2"));
#undef OK
    ck_assert(!etcd_leader_value_ok("a:1\0 http://evil", 17, 32, why, sizeof(why)));
    ck_assert(!etcd_leader_value_ok(NULL, 0, 32, why, sizeof(why)));
}
END_TEST

/* ---- the election -------------------------------------------------------- */

/* A leader of term 5 (TTL 3 s) whose keepalive sent at kept_ms answered. */
static void leading(struct leader *l, uint64_t kept_ms)
{
    leader_init(l, 3);
    leader_granted(l, 1);
    leader_campaigned(l, 1, 5, NULL, 0);
    leader_kept(l, kept_ms, 3);
}

START_TEST(candidate_grants_campaigns_and_leads)
{
    struct leader l;
    uint64_t due;
    leader_init(&l, 3);
    ck_assert_int_eq(leader_next(&l, 0, &due), LEADER_GRANT);
    leader_granted(&l, 77);
    ck_assert_int_eq(leader_next(&l, 0, &due), LEADER_CAMPAIGN);
    leader_campaigned(&l, 1, 12, NULL, 0);
    ck_assert_int_eq(l.role, LEADER_LEADING);
    ck_assert_int_eq(l.term, 12);
    /* Not acting until a keepalive has answered. */
    ck_assert_int_eq(leader_acting(&l, 10), 0);
    ck_assert_int_eq(l.role, LEADER_LEADING);
    ck_assert_int_eq(leader_next(&l, 10, &due), LEADER_KEEPALIVE);
    leader_kept(&l, 10, 3);
    ck_assert_int_eq(leader_acting(&l, 20), 1);
    /* The next keepalive a sixth of the TTL later. */
    ck_assert_int_eq(leader_next(&l, 20, &due), LEADER_WAIT);
    ck_assert_uint_eq(due, 10 + 500);
    ck_assert_uint_eq(leader_unsure(&l, 20), 0);
    /* Acting stops a third of the TTL before the lease could end... */
    ck_assert_int_eq(leader_acting(&l, 10 + 1999), 1);
    ck_assert_int_eq(leader_acting(&l, 10 + 2000), 0);
    /* ...but it is only unsure until then: still the leader. */
    ck_assert_int_eq(l.role, LEADER_LEADING);
    ck_assert_uint_eq(leader_unsure(&l, 10 + 2000), 10 + 3000);
    ck_assert_uint_eq(leader_unsure(&l, 10 + 2999), 10 + 3000);
    ck_assert_int_eq(leader_next(&l, 10 + 2000, &due), LEADER_KEEPALIVE);
    leader_failed(&l, 10 + 2000);
    /* The lease could have ended: deposed. */
    ck_assert_int_eq(leader_acting(&l, 10 + 3000), 0);
    ck_assert_int_eq(l.role, LEADER_DEPOSED);
    ck_assert_uint_eq(leader_unsure(&l, 10 + 3000), 0);
    ck_assert_ptr_nonnull(strstr(l.why, "keepalive"));
    /* Deposed for good: a late keepalive answer changes nothing. */
    leader_kept(&l, 3100, 3);
    ck_assert_int_eq(leader_acting(&l, 3101), 0);
    ck_assert_int_eq(leader_next(&l, 3101, &due), LEADER_WAIT);
}
END_TEST

/* etcd loses its raft leader: no keepalive answers until a new one is
 * elected (up to two election timeouts), which keeps the lease. */
START_TEST(unsure_leader_acts_again_when_a_keepalive_answers)
{
    struct leader l;
    uint64_t due;
    leading(&l, 1000);
    ck_assert_int_eq(leader_acting(&l, 1400), 1);
    /* Every member fails or times out from 1500 on. */
    ck_assert_int_eq(leader_next(&l, 1500, &due), LEADER_KEEPALIVE);
    leader_failed(&l, 1500);
    ck_assert_int_eq(leader_next(&l, 1550, &due), LEADER_KEEPALIVE);
    ck_assert_int_eq(leader_acting(&l, 3500), 0);
    ck_assert_uint_eq(leader_unsure(&l, 3500), 4000);
    /* The keepalive sent at 2200 answers at 3700 (the new raft leader's). */
    leader_kept(&l, 2200, 3);
    ck_assert_int_eq(l.role, LEADER_LEADING);
    ck_assert_uint_eq(leader_unsure(&l, 3700), 0);
    ck_assert_int_eq(leader_acting(&l, 3700), 1);
    ck_assert_int_eq(leader_acting(&l, 2200 + 1999), 1);
    ck_assert_int_eq(leader_acting(&l, 2200 + 2000), 0);
    /* Woken when the lease could end, to depose then. */
    ck_assert_int_eq(leader_next(&l, 2200 + 2000, &due), LEADER_KEEPALIVE);
    leader_kept(&l, 2200 + 2000, 0);
    ck_assert_int_eq(l.role, LEADER_DEPOSED);
    ck_assert_ptr_nonnull(strstr(l.why, "ended"));
}
END_TEST

/* etcd loses its quorum: members answer, none knows a raft leader. The
 * leader holds past the keepalives' deadline while such probes keep coming,
 * and acts again when a keepalive answers. */
START_TEST(leader_holds_through_a_quorum_loss)
{
    struct leader l;
    uint64_t due;
    leading(&l, 1000);
    /* A probe that found a leader, or that nobody answered, is no evidence. */
    leader_probed(&l, 1600, 2, 1);
    leader_probed(&l, 1700, 0, 0);
    ck_assert_uint_eq(l.no_quorum_since, 0);
    /* Two members gone, the third says it has no leader. */
    leader_probed(&l, 1800, 1, 0);
    ck_assert_uint_eq(l.no_quorum_since, 1800);
    ck_assert_int_eq(leader_holding(&l, 2999), 0); /* still acting on the keepalive */
    ck_assert_int_eq(leader_acting(&l, 2999), 1);
    ck_assert_int_eq(leader_holding(&l, 3000), 1);
    ck_assert_int_eq(leader_acting(&l, 3000), 1);
    ck_assert_uint_eq(leader_unsure(&l, 3000), 0); /* the loop does not wait */
    /* Past the keepalive's lease (4000): kept by the probes, each younger than the TTL. */
    leader_failed(&l, 3500);
    ck_assert_int_eq(leader_next(&l, 3500, &due), LEADER_WAIT); /* a pause between tries */
    ck_assert_uint_eq(due, 3750);
    leader_probed(&l, 3500, 1, 0);
    leader_probed(&l, 5500, 1, 0);
    ck_assert_int_eq(leader_acting(&l, 7499), 1);
    ck_assert_int_eq(l.role, LEADER_LEADING);
    ck_assert_uint_eq(l.no_quorum_since, 1800);
    /* Quorum back: the keepalive sent at 7000 answers; acting on it, no longer holding. */
    leader_kept(&l, 7000, 3);
    ck_assert_uint_eq(l.no_quorum_since, 0);
    ck_assert_int_eq(leader_holding(&l, 8000), 0);
    ck_assert_int_eq(leader_acting(&l, 8999), 1);
    ck_assert_int_eq(leader_acting(&l, 9000), 0);
    ck_assert_int_eq(l.role, LEADER_LEADING);

    /* Holding, then cut off from every member: not held past the newest
     * probe's TTL, deposed when the lease could have ended. */
    leader_probed(&l, 9500, 1, 0);
    ck_assert_int_eq(leader_acting(&l, 11499), 1);
    ck_assert_int_eq(leader_acting(&l, 11500), 0); /* unsure: a third of the TTL left */
    ck_assert_uint_eq(leader_unsure(&l, 11500), 12500);
    /* A probe sent after the lease could have ended proves nothing. */
    leader_probed(&l, 12500, 1, 0);
    ck_assert_int_eq(leader_acting(&l, 12500), 0);
    ck_assert_int_eq(l.role, LEADER_DEPOSED);
    ck_assert_ptr_nonnull(strstr(l.why, "no quorum"));
}
END_TEST

START_TEST(keepalives_extend_and_failures_retry)
{
    struct leader l;
    uint64_t due;
    leading(&l, 0);
    leader_kept(&l, 750, 3);
    ck_assert_int_eq(leader_acting(&l, 2500), 1);
    /* A failed keepalive is sent again soon (to the next member): 50 ms. */
    leader_failed(&l, 1600);
    ck_assert_int_eq(leader_next(&l, 1600, &due), LEADER_WAIT);
    ck_assert_uint_eq(due, 1650);
    ck_assert_int_eq(leader_next(&l, 1650, &due), LEADER_KEEPALIVE);
    /* An answer older than the newest does not shorten the deadline. */
    leader_kept(&l, 100, 3);
    ck_assert_int_eq(leader_acting(&l, 2700), 1);
    /* A member that answers a TTL longer than the one asked for (not etcd's
     * way) does not stretch the leader's own reckoning past 3 s. */
    leader_kept(&l, 800, 1000000);
    ck_assert_uint_eq(l.lease_until, 3800);
    ck_assert_int_eq(leader_acting(&l, 2799), 1);
    ck_assert_int_eq(leader_acting(&l, 2800), 0);
    ck_assert_uint_eq(leader_unsure(&l, 2800), 3800);
    /* etcd says the lease is gone: deposed at once. */
    leader_kept(&l, 1700, 0);
    ck_assert_int_eq(l.role, LEADER_DEPOSED);
    ck_assert_int_eq(leader_acting(&l, 1701), 0);
}
END_TEST

START_TEST(loser_stands_by_and_runs_when_the_key_goes)
{
    struct leader l;
    uint64_t due;
    leader_init(&l, 3);
    leader_failed(&l, 0); /* no member answered the grant: wait, then again */
    ck_assert_int_eq(leader_next(&l, 100, &due), LEADER_WAIT);
    ck_assert_int_eq(leader_next(&l, due, &due), LEADER_GRANT);
    leader_granted(&l, 9);
    leader_campaigned(&l, 0, 30, "b:29470", 20);
    ck_assert_int_eq(l.role, LEADER_STANDBY);
    ck_assert_str_eq(l.leader, "b:29470");
    ck_assert_int_eq(l.leader_term, 20);
    ck_assert_int_eq(l.lease, 0);
    ck_assert_int_eq(l.watch_from, 31);
    ck_assert_int_eq(leader_next(&l, 0, &due), LEADER_WATCH);
    ck_assert_int_eq(leader_acting(&l, 0), 0);
    /* A standby is never deposed: it never led. */
    leader_depose(&l, "x");
    ck_assert_int_eq(l.role, LEADER_STANDBY);
    leader_watch_deleted(&l, 40);
    ck_assert_int_eq(l.role, LEADER_CANDIDATE);
    ck_assert_str_eq(l.leader, "");
    ck_assert_int_eq(leader_next(&l, 0, &due), LEADER_GRANT);
    leader_granted(&l, 10);
    leader_campaigned(&l, 1, 41, NULL, 0);
    ck_assert_int_eq(l.term, 41);
    /* A refused state write deposes the leader. */
    leader_kept(&l, 0, 3);
    leader_depose(&l, "a state write was refused");
    ck_assert_int_eq(leader_acting(&l, 1), 0);
    ck_assert_str_eq(l.why, "a state write was refused");
}
END_TEST

Suite *make_etcd_suite(void)
{
    Suite *s = suite_create("etcd");
    TCase *tc = tcase_create("codec");
    tcase_add_test(tc, endpoints_parse_and_refuse);
    tcase_add_test(tc, base64_round_trips_and_refuses);
    tcase_add_test(tc, requests_encode_keys_and_int64s);
    tcase_add_test(tc, answers_parse_as_etcd_writes_them);
    tcase_add_test(tc, errors_and_garbage_are_named);
    tcase_add_test(tc, status_says_whether_a_member_knows_a_leader);
    tcase_add_test(tc, auth_token_and_refusals);
    tcase_add_test(tc, leader_value_is_checked);
    suite_add_tcase(s, tc);
    tc = tcase_create("election");
    tcase_add_test(tc, candidate_grants_campaigns_and_leads);
    tcase_add_test(tc, keepalives_extend_and_failures_retry);
    tcase_add_test(tc, unsure_leader_acts_again_when_a_keepalive_answers);
    tcase_add_test(tc, leader_holds_through_a_quorum_loss);
    tcase_add_test(tc, loser_stands_by_and_runs_when_the_key_goes);
    suite_add_tcase(s, tc);
    return s;
}

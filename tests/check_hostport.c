/*
 * hostport: the one HOST:PORT grammar (common/hostport.h): names, IPv4,
 * [IPv6], port bounds with and without port 0, every refusal naming the bad
 * part; and its callers (the agent's --daemon list, musterd.json's address
 * keys) taking it.
 */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "common/conf.h"
#include "common/hostport.h"
#include "worker/agent/agent_join.h"

static void expect_good(const char *s, unsigned flags, const char *host, unsigned port)
{
    char h[HOSTPORT_HOST_MAX], err[320] = "";
    uint16_t p = 7;
    ck_assert_msg(hostport_parse_flags(s, flags, h, &p, err, sizeof(err)) == 0, "\"%s\": refused: %s", s, err);
    ck_assert_str_eq(h, host);
    ck_assert_uint_eq(p, port);
}

static void expect_bad(const char *s, unsigned flags, const char *needle)
{
    char h[HOSTPORT_HOST_MAX], err[320] = "";
    uint16_t p = 7;
    ck_assert_int_eq(hostport_parse_flags(s, flags, h, &p, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, needle) != NULL, "\"%s\": expected \"%s\" in \"%s\"", s, needle, err);
    ck_assert_uint_eq(p, 7); /* nothing written on a refusal */
}

START_TEST(hostport_good)
{
    char host[HOSTPORT_HOST_MAX], err[256];
    uint16_t port = 0;
    ck_assert_int_eq(hostport_parse("127.0.0.1:29470", host, &port, err, sizeof(err)), 0);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_uint_eq(port, 29470);
    expect_good("master-0.cluster:1", 0, "master-0.cluster", 1);
    expect_good("[::1]:65535", 0, "::1", 65535);
    expect_good("[fe80::1%eth0]:80", 0, "fe80::1%eth0", 80);
    /* Leading zeros are digits like any other, however many. */
    expect_good("h:00080", 0, "h", 80);
    expect_good("h:000000000000065535", 0, "h", 65535);
    /* A listener's port 0: the system picks one. */
    expect_good("127.0.0.1:0", HOSTPORT_PORT_ZERO, "127.0.0.1", 0);
    expect_good("[::]:0", HOSTPORT_PORT_ZERO, "::", 0);
    /* The longest host there is room for. */
    char longest[HOSTPORT_HOST_MAX + 8];
    memset(longest, 'h', HOSTPORT_HOST_MAX - 1);
    strcpy(longest + HOSTPORT_HOST_MAX - 1, ":9");
    ck_assert_int_eq(hostport_parse(longest, host, &port, err, sizeof(err)), 0);
    ck_assert_uint_eq(strlen(host), HOSTPORT_HOST_MAX - 1);
}
END_TEST

/* Each refusal, and the part of the message that names what was wrong. */
static const struct {
    const char *s;
    unsigned flags;
    const char *needle;
} bad[] = {
    {"localhost", 0, "expected HOST:PORT, got 'localhost' (no port)"},
    {"", 0, "(no port)"},
    {":29470", 0, "host of 1..255 bytes, got ':29470'"},
    {"[]:80", 0, "host of 1.."},
    {"host:", 0, "port must be 1..65535, got ''"},
    {"host:0", 0, "port must be 1..65535, got '0'"},
    {"host:65536", 0, "got '65536'"},
    {"host:65536", HOSTPORT_PORT_ZERO, "port must be 0..65535, got '65536'"},
    {"host:99999999999999999999999", 0, "got '99999999999999999999999'"},
    {"host:12x", 0, "got '12x'"},
    {"host:-5", 0, "got '-5'"},
    {"host:-0", HOSTPORT_PORT_ZERO, "got '-0'"},
    {"host:+5", 0, "got '+5'"},
    {"host: 5", 0, "got ' 5'"},
    {"::1:80", 0, "write an IPv6 address as [ADDR]:PORT, got '::1:80'"},
    {"[::1]80", 0, "expected [IPv6]:PORT, got '[::1]80'"},
    {"[::1", 0, "expected [IPv6]:PORT"},
    {"[::1]", 0, "expected [IPv6]:PORT"},
};

START_TEST(hostport_bad)
{
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_bad(bad[i].s, bad[i].flags, bad[i].needle);
    char toolong[HOSTPORT_HOST_MAX + 8];
    memset(toolong, 'h', HOSTPORT_HOST_MAX);
    strcpy(toolong + HOSTPORT_HOST_MAX, ":9");
    expect_bad(toolong, 0, "host of 1..255 bytes");
}
END_TEST

/* The callers: --daemon (each entry, the flag named), musterd.json's listen / http (port 0) and advertise (not). */
START_TEST(hostport_callers)
{
    struct daemon_list l;
    char err[320];
    ck_assert_int_eq(daemon_list_parse("a:1,[::1]:2", &l, err, sizeof(err)), 0);
    ck_assert_int_eq(daemon_list_parse("a:1,b", &l, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "--daemon: expected HOST:PORT, got 'b' (no port)") != NULL, "%s", err);
    ck_assert_int_eq(daemon_list_parse("a:0", &l, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "--daemon: port must be 1..65535, got '0'") != NULL, "%s", err);
    ck_assert_int_eq(conf_valid_hostport("0.0.0.0:0"), 0);
    ck_assert_int_eq(conf_valid_hostport("[::1]:29470"), 0);
    ck_assert_int_eq(conf_valid_hostport("127.0.0.1:70000"), -EINVAL);
    ck_assert_int_eq(conf_valid_hostport("29470"), -EINVAL);
    ck_assert_int_eq(conf_valid_hostport_connect("m.example:29470"), 0);
    ck_assert_int_eq(conf_valid_hostport_connect("m.example:0"), -EINVAL);
}
END_TEST

Suite *make_hostport_suite(void)
{
    Suite *s = suite_create("hostport");
    TCase *tc = tcase_create("hostport");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, hostport_good);
    tcase_add_test(tc, hostport_bad);
    tcase_add_test(tc, hostport_callers);
    suite_add_tcase(s, tc);
    return s;
}

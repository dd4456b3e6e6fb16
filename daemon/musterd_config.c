#include "daemon/musterd_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/etcd_codec.h"
#include "daemon/http_host.h"

#define F(field) offsetof(struct musterd_config, field), sizeof(((struct musterd_config *)0)->field)

static int valid_store(const char *s)
{
    struct etcd_endpoints ep;
    char err[64];
    return s[0] ? etcd_endpoints_parse(s, &ep, err, sizeof(err)) : 0;
}

static int valid_lease(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v >= MUSTERD_LEASE_MIN_S && v <= MUSTERD_LEASE_MAX_S ? 0 : -1;
}

static int valid_user(const char *s)
{
    for (const char *p = s; *p; p++)
        if (*p <= ' ' || *p > '~')
            return -1;
    return 0;
}

static int valid_rest_hosts(const char *s) { return http_hosts_valid_list(s); }

static int valid_advertise(const char *s) { return s[0] ? conf_valid_hostport_connect(s) : 0; }

/* The one table of musterd.json keys. Keep docs/config.md in step. */
const struct conf_key musterd_config_keys[] = {
    {"listen", CONF_STRING, F(listen), conf_valid_hostport, "ADDR:PORT", "0.0.0.0:29470",
     "control port the agents join"},
    {"http", CONF_STRING, F(http), conf_valid_hostport, "ADDR:PORT", "127.0.0.1:29471",
     "REST API, dashboard and /metrics"},
    {"rest_hosts", CONF_STRING, F(rest_hosts), valid_rest_hosts, "NAME[:PORT] separated by commas", "",
     "more host names browsers and clients may address REST by (Host and Origin are checked: DNS rebinding); "
     "without a port, the REST port's; unset = the http address only (and localhost when it is loopback)"},
    {"state_dir", CONF_PATH, F(state_dir), NULL, "a directory", "/var/lib/muster",
     "directory of the state file ($STATE_DIRECTORY under systemd)"},
    {"token_file", CONF_PATH, F(token_file), NULL, "a file", "/etc/muster/token",
     "cluster token the agents prove; mode 0600 ($CONFIGURATION_DIRECTORY/token under systemd)"},
    {"admin_token_file", CONF_PATH, F(admin_token_file), NULL, "a file", "",
     "token for admin REST calls (stop, restart, drain); mode 0600; unset = admin calls off"},
    {"read_token_file", CONF_PATH, F(read_token_file), NULL, "a file", "",
     "token every REST GET but /healthz needs (Bearer, or Basic's password); mode 0600; unset = reads open"},
    {"preauth_per_address", CONF_STRING, F(preauth_per_address), musterd_valid_count, "an integer 1..1000000", "64",
     "unauthenticated control connections one address may hold; the oldest is closed for a new one"},
    {"job", CONF_PATH, F(job), NULL, "a file", "", "the job spec (keys in docs/jobspec.md); required"},
    {"store", CONF_STRING, F(store), valid_store, "etcd://HOST:PORT[,HOST:PORT...] (the etcd members; https:// for TLS)", "",
     "job state in etcd, with a leader elected among the musterd of the job; unset = the state file"},
    {"advertise", CONF_STRING, F(advertise), valid_advertise, "HOST:PORT", "",
     "control address agents reach this musterd at, told to them by a standby; unset = the listen address "
     "(its port with the host name when it listens on 0.0.0.0)"},
    {"store_lease_s", CONF_STRING, F(store_lease_s), valid_lease, "whole seconds, 2..60", "3",
     "TTL of the leader's etcd lease: a lost leader is replaced after about this long"},
    {"store_ca_file", CONF_PATH, F(store_ca_file), NULL, "a file", "",
     "with an https:// store: the CA certificate(s), PEM, that etcd's server certificates are checked against; "
     "unset = the system's CAs"},
    {"store_cert_file", CONF_PATH, F(store_cert_file), NULL, "a file", "",
     "with an https:// store: this musterd's client certificate, PEM (etcd's --client-cert-auth); with "
     "store_key_file"},
    {"store_key_file", CONF_PATH, F(store_key_file), NULL, "a file", "", "the client certificate's private key, PEM"},
    {"store_user", CONF_STRING, F(store_user), valid_user, "an etcd user name (printable, no space)", "",
     "etcd's auth: the user musterd authenticates as (needs read and write on /muster/JOB/); with "
     "store_password_file; unset = no auth"},
    {"store_password_file", CONF_PATH, F(store_password_file), NULL, "a file", "",
     "that user's password: the file's first line; mode 0600"},
    {"log_level", CONF_STRING, F(log_level), conf_valid_log_level, "error, warn, info or debug", "info",
     "least severe level logged"},
};

const size_t musterd_config_nkeys = sizeof(musterd_config_keys) / sizeof(musterd_config_keys[0]);

void musterd_config_defaults(struct musterd_config *c)
{
    const char *state = getenv("STATE_DIRECTORY"), *conf = getenv("CONFIGURATION_DIRECTORY");
    conf_defaults(musterd_config_keys, musterd_config_nkeys, c);
    if (state && state[0])
        snprintf(c->state_dir, sizeof(c->state_dir), "%s", state);
    if (conf && conf[0])
        snprintf(c->token_file, sizeof(c->token_file), "%s/token", conf);
}

void musterd_config_default_path(char *out, size_t cap)
{
    const char *conf = getenv("CONFIGURATION_DIRECTORY");
    snprintf(out, cap, "%s/musterd.json", conf && conf[0] ? conf : "/etc/muster");
}

int musterd_valid_count(const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || end == s || *end || v < 1 || v > 1000000 ? -EINVAL : 0;
}

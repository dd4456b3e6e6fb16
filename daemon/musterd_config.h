/*
 * musterd_config: musterd.json, the daemon's configuration file. One table
 * (musterd_config.c) of the keys below; the command line overrides the file.
 * docs/config.md documents every key.
 */
#ifndef MUSTER_MUSTERD_CONFIG_H
#define MUSTER_MUSTERD_CONFIG_H

#include <limits.h>
#include <stddef.h>

#include "common/conf.h"

struct musterd_config {
    char listen[64];                 /* control port for agents, ADDR:PORT */
    char http[64];                   /* REST API and dashboard, ADDR:PORT */
    char rest_hosts[1024];           /* more names REST answers to, NAME[:PORT],... */
    char state_dir[PATH_MAX];        /* where the state file lives */
    char token_file[PATH_MAX];       /* cluster token agents must prove */
    char admin_token_file[PATH_MAX]; /* "" = admin REST calls off */
    char read_token_file[PATH_MAX];  /* "" = REST reads open to whoever reaches http */
    char preauth_per_address[16];    /* unauthenticated control connections from one address */
    char job[PATH_MAX];              /* the job spec */
    char log_level[8];
    char store[1024];                /* "" = the state file; etcd://... = etcd */
    char advertise[256];             /* "" = from listen */
    char store_lease_s[8];
    char store_ca_file[PATH_MAX];    /* https:// store: CA to check etcd's certificates; "" = the system's */
    char store_cert_file[PATH_MAX];  /* https:// store: client certificate; "" = none */
    char store_key_file[PATH_MAX];   /* its private key */
    char store_user[128];            /* etcd's auth: user; "" = off */
    char store_password_file[PATH_MAX]; /* its password (first line; mode 0600) */
};

#define MUSTERD_LEASE_MIN_S 2
#define MUSTERD_LEASE_MAX_S 60

extern const struct conf_key musterd_config_keys[];
extern const size_t musterd_config_nkeys;

/*
 * Table defaults, then systemd's directories: state_dir = $STATE_DIRECTORY
 * and token_file = $CONFIGURATION_DIRECTORY/token when they are set.
 */
void musterd_config_defaults(struct musterd_config *c);

/*
 * The file musterd reads when no --config is given: musterd.json in
 * $CONFIGURATION_DIRECTORY, or in /etc/muster outside systemd.
 */
void musterd_config_default_path(char *out, size_t cap);

/* 1..1000000, decimal: preauth_per_address. */
int musterd_valid_count(const char *s);

#endif

/*
 * restdoc: the JSON documents of the REST API, rendered from a struct
 * snap_view (daemon/snapshot.h) by the REST threads. The documents without
 * a query (/v1/status, /v1/ranks, /v1/nodes, /metrics with or without
 * per-rank series) are rendered once per view, by the first request that
 * wants one, and served from the view afterwards. A filtered or paginated
 * list is rendered per request straight from the view's records: O(page)
 * for a page, plus one pass over the records for a state or health filter.
 * Shapes are documented in docs/rest.md.
 */
#ifndef MUSTER_RESTDOC_H
#define MUSTER_RESTDOC_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/snapshot.h"

/* Most list entries one page may ask for (?limit=). */
#define RESTDOC_LIMIT_MAX 100000

enum restdoc_list { RESTDOC_RANKS, RESTDOC_NODES };

/* A list request's query, parameter by parameter (restdoc_query_param). */
struct restdoc_query {
    int any;            /* some parameter was given */
    unsigned seen;      /* bit per parameter name, to refuse one given twice */
    uint32_t states;    /* bit per rank or node state; 0 = any */
    uint32_t healths;   /* nodes: bit per enum snap_health; 0 = any */
    char node[PROTO_NAME_MAX]; /* "" = any */
    int by_health;      /* nodes: ?order=health */
    uint64_t offset;
    uint32_t limit;     /* 0 = no limit */
};

/*
 * One query parameter of the list (key=value). Returns 0, or -EINVAL with
 * err saying which parameter was wrong and what was expected.
 */
int restdoc_query_param(struct restdoc_query *q, enum restdoc_list list, const char *key, const char *value,
                        char *err, size_t errlen);

/*
 * The view's document (SNAP_DOC_*), rendered on first use; valid while the
 * caller holds its reference to v. NULL on ENOMEM.
 */
const char *restdoc_get(struct snap_view *v, enum snap_doc which, size_t *len);

/* A list filtered and paginated by q: malloc'd JSON text, NULL on ENOMEM. */
char *restdoc_list(const struct snap_view *v, enum restdoc_list list, const struct restdoc_query *q,
                   size_t *len);

/* Index of the node named name, or -1. */
int restdoc_find_node(const struct snap_view *v, const char *name);

#endif

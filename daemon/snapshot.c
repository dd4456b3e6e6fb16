#include "daemon/snapshot.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const health_names[] = {"lost", "failed", "unfit", "stale", "waiting", "ok", "left"};
static const char *const fit_names[] = {"fit", "checking", "unfit"};

_Static_assert(sizeof(health_names) / sizeof(health_names[0]) == SNAP_NHEALTH, "a name per health");

const char *snap_role_name(enum snap_role r)
{
    switch (r) {
    case SNAP_ROLE_MEMBER: return "member";
    case SNAP_ROLE_SPARE: return "spare";
    case SNAP_ROLE_IDLE: break;
    }
    return "idle";
}

const char *snap_fit_name(enum snap_fit f)
{
    return (unsigned)f <= SNAP_FIT_UNFIT ? fit_names[f] : "?";
}

const char *snap_health_name(enum snap_health h)
{
    return (unsigned)h < SNAP_NHEALTH ? health_names[h] : "?";
}

int snap_health_parse(const char *name, size_t len, enum snap_health *out)
{
    for (int i = 0; i < SNAP_NHEALTH; i++)
        if (strlen(health_names[i]) == len && memcmp(health_names[i], name, len) == 0) {
            *out = (enum snap_health)i;
            return 0;
        }
    return -EINVAL;
}

struct snap_view *snap_view_new(uint32_t nnodes, uint32_t nranks)
{
    struct snap_view *v = calloc(1, sizeof(*v));
    if (!v)
        return NULL;
    v->nodes = calloc(nnodes ? nnodes : 1, sizeof(*v->nodes));
    v->node_order = calloc(nnodes ? nnodes : 1, sizeof(*v->node_order));
    v->ranks = calloc(nranks ? nranks : 1, sizeof(*v->ranks));
    if (!v->nodes || !v->node_order || !v->ranks) {
        free(v->nodes);
        free(v->node_order);
        free(v->ranks);
        free(v);
        return NULL;
    }
    v->nnodes = nnodes;
    v->nranks = nranks;
    for (int i = 0; i < SNAP_NDOCS; i++)
        pthread_mutex_init(&v->doc[i].lock, NULL);
    pthread_mutex_init(&v->head_lock, NULL);
    atomic_init(&v->refs, 1);
    return v;
}

void snap_view_ref(struct snap_view *v)
{
    atomic_fetch_add(&v->refs, 1);
}

void snap_view_unref(struct snap_view *v)
{
    if (!v || atomic_fetch_sub(&v->refs, 1) != 1)
        return;
    for (int i = 0; i < SNAP_NDOCS; i++) {
        free(v->doc[i].text);
        pthread_mutex_destroy(&v->doc[i].lock);
    }
    json_decref(v->head);
    pthread_mutex_destroy(&v->head_lock);
    free(v->events);
    free(v->history);
    free(v->nodes);
    free(v->strings);
    free(v->rank_strings);
    snap_shared_unref(v->stacks);
    free(v->node_order);
    free(v->ranks);
    free(v);
}

struct snap_shared *snap_shared_new(const char *text)
{
    size_t len = strlen(text);
    struct snap_shared *s = malloc(sizeof(*s) + len + 1);
    if (!s)
        return NULL;
    atomic_init(&s->refs, 1);
    s->len = len;
    memcpy(s->text, text, len + 1);
    return s;
}

void snap_shared_ref(struct snap_shared *s)
{
    atomic_fetch_add(&s->refs, 1);
}

void snap_shared_unref(struct snap_shared *s)
{
    if (s && atomic_fetch_sub(&s->refs, 1) == 1)
        free(s);
}

void snapshot_init(struct snapshot *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->lock, NULL);
}

void snapshot_destroy(struct snapshot *s)
{
    snap_view_unref(s->view);
    pthread_mutex_destroy(&s->lock);
}

void snapshot_publish(struct snapshot *s, struct snap_view *v)
{
    pthread_mutex_lock(&s->lock);
    struct snap_view *old = s->view;
    v->version = ++s->version;
    s->view = v;
    s->read = 0;
    pthread_mutex_unlock(&s->lock);
    snap_view_unref(old);
}

struct snap_view *snapshot_acquire(struct snapshot *s)
{
    pthread_mutex_lock(&s->lock);
    struct snap_view *v = s->view;
    if (v) {
        snap_view_ref(v);
        s->read = 1;
    }
    pthread_mutex_unlock(&s->lock);
    return v;
}

int snapshot_was_read(struct snapshot *s)
{
    pthread_mutex_lock(&s->lock);
    int read = s->read;
    pthread_mutex_unlock(&s->lock);
    return read;
}

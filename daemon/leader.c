#include "daemon/leader.h"

#include <stdio.h>
#include <string.h>

/* A candidate whose request failed tries again after this long. */
#define LEADER_RETRY_MS 500

/* The lease cannot have ended before this: a keepalive's, or a quorum loss's. */
static uint64_t alive_until(const struct leader *l)
{
    uint64_t q = l->no_quorum_since ? l->no_quorum_seen + l->ttl_ms : 0;
    return q > l->lease_until ? q : l->lease_until;
}

void leader_init(struct leader *l, int ttl_s)
{
    memset(l, 0, sizeof(*l));
    l->role = LEADER_CANDIDATE;
    l->ttl_ms = (uint64_t)ttl_s * 1000;
}

enum leader_action leader_next(struct leader *l, uint64_t now_ms, uint64_t *due_ms)
{
    *due_ms = UINT64_MAX;
    switch (l->role) {
    case LEADER_CANDIDATE:
        if (now_ms < l->retry_at) {
            *due_ms = l->retry_at;
            return LEADER_WAIT;
        }
        return l->lease ? LEADER_CAMPAIGN : LEADER_GRANT;
    case LEADER_LEADING:
        if (now_ms < l->next_keepalive) {
            /* Woken by lease_until too: leader_acting deposes then. */
            *due_ms = l->lease_until && alive_until(l) < l->next_keepalive ? alive_until(l) : l->next_keepalive;
            return LEADER_WAIT;
        }
        return LEADER_KEEPALIVE;
    case LEADER_STANDBY:
        return LEADER_WATCH;
    case LEADER_DEPOSED:
        break;
    }
    return LEADER_WAIT;
}

void leader_granted(struct leader *l, int64_t lease)
{
    if (l->role == LEADER_CANDIDATE)
        l->lease = lease;
}

void leader_campaigned(struct leader *l, int won, int64_t rev, const char *holder, int64_t holder_term)
{
    if (l->role != LEADER_CANDIDATE)
        return;
    if (won) {
        l->role = LEADER_LEADING;
        l->term = rev;
        /* Not acting before the first keepalive answers: the grant's time is not known here. */
        l->acting_until = 0;
        l->lease_until = 0;
        l->next_keepalive = 0;
        return;
    }
    /* The lease is left to end: a standby holds none. */
    l->lease = 0;
    l->role = LEADER_STANDBY;
    snprintf(l->leader, sizeof(l->leader), "%s", holder ? holder : "");
    l->leader_term = holder_term;
    l->watch_from = rev + 1;
}

void leader_kept(struct leader *l, uint64_t sent_ms, int64_t ttl_s)
{
    if (l->role != LEADER_LEADING)
        return;
    if (ttl_s <= 0) {
        leader_depose(l, "etcd says the lease has ended");
        return;
    }
    /* Never more than the TTL asked for: a member that answered more (not
     * etcd's way) must not stretch the time this leader acts on its own. */
    uint64_t ttl = (uint64_t)ttl_s * 1000 < l->ttl_ms ? (uint64_t)ttl_s * 1000 : l->ttl_ms;
    uint64_t until = sent_ms + ttl - ttl / 3;
    if (until > l->acting_until)
        l->acting_until = until;
    if (sent_ms + ttl > l->lease_until)
        l->lease_until = sent_ms + ttl;
    l->next_keepalive = sent_ms + l->ttl_ms / LEADER_KEEPALIVES;
    l->no_quorum_since = l->no_quorum_seen = 0;
}

void leader_probed(struct leader *l, uint64_t sent_ms, int answered, int with_leader)
{
    /* Evidence counts only while the lease is surely alive: a chain from the
     * last keepalive answered, each link younger than a TTL. */
    if (l->role != LEADER_LEADING || !l->lease_until || answered <= 0 || with_leader > 0 ||
        sent_ms >= alive_until(l))
        return;
    if (!l->no_quorum_since)
        l->no_quorum_since = sent_ms;
    if (sent_ms > l->no_quorum_seen)
        l->no_quorum_seen = sent_ms;
}

void leader_failed(struct leader *l, uint64_t now_ms)
{
    switch (l->role) {
    case LEADER_CANDIDATE:
        l->retry_at = now_ms + LEADER_RETRY_MS;
        break;
    case LEADER_LEADING:
        /* Again soon, to the next member (the store's thread moved on): a
         * sixtieth of the TTL, so that members that all refuse at once (a
         * link down) are not asked in a busy loop; during a quorum loss a
         * twelfth, each try being a probe of every member too. */
        l->next_keepalive = now_ms + l->ttl_ms / (l->no_quorum_since ? 2 * LEADER_KEEPALIVES : 10 * LEADER_KEEPALIVES);
        break;
    case LEADER_STANDBY:
        /* The watch starts again from where it was. */
        break;
    case LEADER_DEPOSED:
        break;
    }
}

void leader_watch_deleted(struct leader *l, int64_t rev)
{
    if (l->role != LEADER_STANDBY)
        return;
    l->role = LEADER_CANDIDATE;
    l->leader[0] = '\0';
    l->leader_term = 0;
    l->watch_from = rev + 1;
    l->retry_at = 0;
}

void leader_depose(struct leader *l, const char *why)
{
    if (l->role != LEADER_LEADING)
        return;
    l->role = LEADER_DEPOSED;
    l->acting_until = 0;
    l->lease_until = 0;
    l->no_quorum_since = l->no_quorum_seen = 0;
    snprintf(l->why, sizeof(l->why), "%s", why);
}

int leader_acting(struct leader *l, uint64_t now_ms)
{
    if (l->role != LEADER_LEADING)
        return 0;
    if (l->lease_until && now_ms >= alive_until(l)) {
        char why[LEADER_WHY_MAX];
        if (l->no_quorum_since)
            snprintf(why, sizeof(why),
                     "etcd had no quorum, and then no member answered within the lease's TTL (%llu ms): "
                     "the lease may have ended",
                     (unsigned long long)l->ttl_ms);
        else
            snprintf(why, sizeof(why),
                     "no keepalive of the lease answered within its TTL (%llu ms): it may have ended",
                     (unsigned long long)l->ttl_ms);
        leader_depose(l, why);
        return 0;
    }
    return now_ms < l->acting_until || leader_holding(l, now_ms);
}

int leader_holding(const struct leader *l, uint64_t now_ms)
{
    return l->role == LEADER_LEADING && l->no_quorum_since && now_ms >= l->acting_until &&
           now_ms < l->no_quorum_seen + l->ttl_ms - l->ttl_ms / 3;
}

uint64_t leader_unsure(const struct leader *l, uint64_t now_ms)
{
    if (l->role != LEADER_LEADING || !l->acting_until || now_ms < l->acting_until || now_ms >= alive_until(l) ||
        leader_holding(l, now_ms))
        return 0;
    return alive_until(l);
}

const char *leader_role_name(enum leader_role r)
{
    switch (r) {
    case LEADER_CANDIDATE: return "candidate";
    case LEADER_LEADING: return "leader";
    case LEADER_STANDBY: return "standby";
    case LEADER_DEPOSED: return "deposed";
    }
    return "?";
}

/*
 * rdv_memrep: musterd's part in replicating memory checkpoints (job key
 * memory_checkpoint_mb) to a buddy node, and in giving them back.
 *
 *   buddy     node i's buddy is the next member in name order, or, once
 *             any member carries a failure-domain label (HELLO.domain, the
 *             agent's `domain`), the next one dealt round-robin from each
 *             domain, an unlabelled member a domain of its own
 *             (memtags_buddy: a rotation either way, so each member holds
 *             one other's copies). musterd alone applies the map: an agent
 *             sends its new complete checkpoints up (MEM_FILE, restore
 *             false) and musterd passes each frame to the sender's buddy
 *             over that node's own authenticated link. No agent
 *             listens, no new connection exists to be attacked.
 *   holds     each agent reports in HEARTBEAT the checkpoints complete on it
 *             (memory_checkpoints) and those it holds whole for another node
 *             (memory_replica_of, memory_replicas).
 *   restore   the checkpoint a generation resumes from is the newest one
 *             every member has, its own or held for it by another node. A
 *             member that has it only at its buddy gets ASSIGN
 *             memory_checkpoint_from naming the buddy, and the buddy a
 *             MEM_FETCH; the buddy sends the files (MEM_FILE restore true),
 *             musterd passes them to the owner, which waits for them before
 *             its ranks start.
 *   drained   with memory_checkpoint_drain_steps each agent also reports the
 *             checkpoints it drained whole to checkpoint_dir (memory_drained,
 *             worker/agent/memdrain.h); they count as the node's too, last:
 *             a member that has the chosen one neither in memory nor at a
 *             buddy gets ASSIGN memory_checkpoint_drained and copies it back
 *             from there. A node lost together with its buddy so resumes
 *             from the newest checkpoint drained on every node.
 *
 * musterd checks only who may send what to whom: a replica goes from its
 * owner to the owner's buddy, a restore from the node that reported holding
 * it to its owner. The receiving agent validates paths and sizes.
 */
#include "daemon/rdv_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/memtags.h"

/* A piece passed on only while less than this waits for its receiver (SERVER_MAX_WRITE_QUEUE is 4 MiB). */
#define RDV_MEM_RELAY_QUEUE_MAX (2u << 20)

static int joined(const struct rdv *r, uint32_t i)
{
    return r->nodes[i].state == RDV_NODE_JOINED;
}

static int by_name(const void *x, const void *y, void *arg)
{
    const struct rdv *r = arg;
    return strcmp(r->nodes[*(const uint32_t *)x].name, r->nodes[*(const uint32_t *)y].name);
}

uint32_t rdv__buddy(const struct rdv *r, uint32_t node)
{
    uint32_t members[RDV_MAX_NODES], n = 0, at = r->nnodes;
    for (uint32_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i].member && joined(r, i))
            members[n++] = i;
    qsort_r(members, n, sizeof(members[0]), by_name, (void *)r);
    for (uint32_t k = 0; k < n; k++)
        if (members[k] == node)
            at = k;
    if (at == r->nnodes)
        return r->nnodes;
    /* the members' failure domains (HELLO.domain) once any is labelled; an unlabelled one is its own */
    const char *domains[RDV_MAX_NODES];
    int labelled = 0;
    for (uint32_t k = 0; k < n; k++) {
        const char *d = r->nodes[members[k]].domain;
        domains[k] = d[0] ? d : NULL;
        labelled |= d[0] != '\0';
    }
    size_t b = memtags_buddy(labelled ? domains : NULL, n, at);
    return b < n ? members[b] : r->nnodes;
}

/* Whether h's replicas are nd's: of its name, or of the member whose rank block it took (a spare). */
static int holds_for(const struct rdv_node *h, const struct rdv_node *nd)
{
    return strcmp(h->replica_of, nd->name) == 0 || (nd->heir_of[0] && strcmp(h->replica_of, nd->heir_of) == 0);
}

/* The joined node other than node that holds node's replica of tag; r->nnodes when none. */
static uint32_t holder_of(const struct rdv *r, uint32_t node, const char *tag)
{
    for (uint32_t j = 0; j < r->nnodes; j++) {
        const struct rdv_node *h = &r->nodes[j];
        if (j == node || !joined(r, j) || !holds_for(h, &r->nodes[node]))
            continue;
        for (uint32_t k = 0; k < h->nreplica; k++)
            if (strcmp(h->replica[k], tag) == 0)
                return j;
    }
    return r->nnodes;
}

static int listed(const char (*names)[PROTO_CKPT_NAME_MAX], uint32_t n, const char *tag)
{
    for (uint32_t k = 0; k < n; k++)
        if (strcmp(names[k], tag) == 0)
            return 1;
    return 0;
}

static int holds_own(const struct rdv_node *nd, const char *tag)
{
    return listed(nd->memckpt, nd->nmemckpt, tag);
}

int rdv_memckpt_common(const struct rdv *r, char *out, size_t cap)
{
    /* each member's own and those held for it: the loop thread's alone */
    static char names[RDV_MAX_NODES][3 * PROTO_MEMCKPT_MAX][PROTO_CKPT_NAME_MAX];
    static const char *lists[RDV_MAX_NODES];
    static uint32_t counts[RDV_MAX_NODES];
    size_t n = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (!nd->member)
            continue;
        if (!nd->reports_memckpt)
            return -1;
        uint32_t c = nd->nmemckpt;
        memcpy(names[n], nd->memckpt, c * sizeof(nd->memckpt[0]));
        for (uint32_t j = 0; j < r->nnodes; j++) {
            const struct rdv_node *h = &r->nodes[j];
            if (j == i || !joined(r, j) || !holds_for(h, nd))
                continue;
            for (uint32_t k = 0; k < h->nreplica && c < 2 * PROTO_MEMCKPT_MAX; k++)
                if (!listed(names[n], c, h->replica[k]))
                    memcpy(names[n][c++], h->replica[k], PROTO_CKPT_NAME_MAX);
        }
        for (uint32_t k = 0; k < nd->ndrained; k++) /* its durable copies (memory_checkpoint_drain_steps) */
            if (!listed(names[n], c, nd->drained[k]))
                memcpy(names[n][c++], nd->drained[k], PROTO_CKPT_NAME_MAX);
        lists[n] = names[n][0];
        counts[n++] = c;
    }
    return memtags_common(lists, counts, n, PROTO_CKPT_NAME_MAX, out, cap);
}

void rdv__memckpt_from(struct rdv *r, uint32_t node, struct proto_assign *as)
{
    as->memckpt_from[0] = '\0';
    as->memckpt_drained = 0;
    if (!as->has_memckpt || !as->memckpt[0] || holds_own(&r->nodes[node], as->memckpt))
        return;
    uint32_t h = holder_of(r, node, as->memckpt);
    if (h == r->nnodes) { /* no copy in memory: its drained one, when it has that */
        as->memckpt_drained = listed(r->nodes[node].drained, r->nodes[node].ndrained, as->memckpt);
        return;
    }
    snprintf(as->memckpt_from, sizeof(as->memckpt_from), "%s", r->nodes[h].name);
    struct proto_msg m = {.type = PROTO_MEM_FETCH};
    snprintf(m.u.mem_fetch.owner, sizeof(m.u.mem_fetch.owner), "%s", r->nodes[h].replica_of);
    snprintf(m.u.mem_fetch.tag, sizeof(m.u.mem_fetch.tag), "%s", as->memckpt);
    rdv__send_to(r, h, &m);
}

uint32_t rdv__memckpt_sources(const struct rdv *r, const char *tag, char *out, size_t cap)
{
    size_t used = 0;
    uint32_t drained = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < r->nnodes && used < cap; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (!nd->member || holds_own(nd, tag))
            continue;
        uint32_t h = holder_of(r, i, tag);
        int w;
        if (h != r->nnodes)
            w = snprintf(out + used, cap - used, "%snode %s's files from node %s", used ? ", " : "", nd->name,
                         r->nodes[h].name);
        else if (listed(nd->drained, nd->ndrained, tag) && ++drained)
            w = snprintf(out + used, cap - used, "%snode %s's files from its drained copy in checkpoint_dir",
                         used ? ", " : "", nd->name);
        else
            continue;
        used += w > 0 ? (size_t)w : 0;
        used = used < cap ? used : cap - 1;
    }
    return drained;
}

/* The joined member a restore of owner's files goes to: owner itself, or
 * the spare that took owner's rank block (rdv_node.heir_of; owner, back,
 * is a spare then); -1 = none. */
static int restore_to(const struct rdv *r, const char *owner)
{
    int i = rdv__find_node(r, owner);
    if (i >= 0 && joined(r, (uint32_t)i) && r->nodes[i].member)
        return i;
    for (uint32_t j = 0; j < r->nnodes; j++)
        if (r->nodes[j].member && joined(r, j) && strcmp(r->nodes[j].heir_of, owner) == 0)
            return (int)j;
    return -1;
}

void rdv__on_mem_file(struct rdv *r, uint32_t node, const struct proto_mem_file *f, uint64_t now_ms)
{
    const struct rdv_node *nd = &r->nodes[node];
    int owner = f->restore ? restore_to(r, f->owner) : rdv__find_node(r, f->owner);
    uint32_t to = r->nnodes;
    const char *why = NULL;
    if (!r->spec->memory_checkpoint_mb)
        why = "the job keeps no memory checkpoints";
    else if (!f->restore && strcmp(f->owner, nd->name) != 0)
        why = "a replica of another node's checkpoint";
    else if (!f->restore && (to = rdv__buddy(r, node)) == r->nnodes)
        why = "the node has no buddy (one member)";
    else if (f->restore && (owner < 0 || !joined(r, (uint32_t)owner)))
        why = "its owner is not connected";
    else if (f->restore && strcmp(nd->replica_of, f->owner) != 0)
        why = "the sender does not hold that node's replicas";
    unsigned long held;
    char note[64];
    if (why) {
        if (ratelimit_pass(&r->nodes[node].ignored_log, now_ms, RATELIMIT_PEER_MS, &held))
            log_warn("node %s sent MEM_FILE for %s's %s: not passed on: %s%s", nd->name, f->owner, f->tag, why,
                     ratelimit_note(held, note, sizeof(note)));
        return;
    }
    to = f->restore ? (uint32_t)owner : to;
    /* the receiver's link carries its heartbeats too: a piece that would
     * crowd them is dropped, and the receiver, seeing the gap, drops the
     * checkpoint (the sender's pacing keeps this rare) */
    if (r->ops.queued && r->ops.queued(r->ops.ctx, r->nodes[to].name) > RDV_MEM_RELAY_QUEUE_MAX) {
        if (ratelimit_pass(&r->nodes[node].ignored_log, now_ms, RATELIMIT_PEER_MS, &held))
            log_warn("MEM_FILE of %s's %s for node %s dropped: over %u bytes wait to go to it%s", f->owner, f->tag,
                     r->nodes[to].name, RDV_MEM_RELAY_QUEUE_MAX, ratelimit_note(held, note, sizeof(note)));
        return;
    }
    struct proto_msg m = {.type = PROTO_MEM_FILE};
    m.u.mem_file = *f; /* the data stays the sender's message's: encoded, not freed here */
    if (f->restore) /* a spare's are the files of the member it replaced: given back as its own */
        snprintf(m.u.mem_file.owner, sizeof(m.u.mem_file.owner), "%s", r->nodes[to].name);
    rdv__send_to(r, to, &m);
}

int rdv__memckpt_reported(struct rdv *r, uint64_t now_ms)
{
    if (!r->spec->memory_checkpoint_mb)
        return 1;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (!nd->member || nd->reports_memckpt)
            continue;
        if (!r->memckpt_wait_ms)
            r->memckpt_wait_ms = now_ms;
        if (now_ms - r->memckpt_wait_ms < (uint64_t)r->spec->heartbeat_timeout_ms) {
            snprintf(r->reason, sizeof(r->reason), "waiting for node %s to report its memory checkpoints",
                     nd->name);
            rdv__changed(r, 0);
            return 0;
        }
        /* not in time (an agent without a directory, say): none is named, each node keeps what it has */
        break;
    }
    r->memckpt_wait_ms = 0;
    return 1;
}

json_t *rdv__memckpt_replicas_json(const struct rdv *r)
{
    json_t *out = json_object();
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (!nd->member)
            continue;
        uint32_t b = rdv__buddy(r, i);
        if (b == r->nnodes)
            continue;
        const struct rdv_node *h = &r->nodes[b];
        int held = strcmp(h->replica_of, nd->name) == 0 && h->nreplica;
        const char *newest = nd->nmemckpt ? nd->memckpt[nd->nmemckpt - 1] : NULL;
        const char *copy = held ? h->replica[h->nreplica - 1] : NULL;
        /* lag: steps of the owner's newest complete checkpoint its buddy holds no copy of */
        json_t *lag = !newest ? json_integer(0)
                      : copy  ? json_integer((json_int_t)(memtags_cmp(newest, copy) > 0
                                                              ? memtags_step(newest) - memtags_step(copy)
                                                              : 0))
                              : json_null();
        json_object_set_new(out, nd->name,
                            json_pack("{s:s, s:o, s:o}", "buddy", h->name, "newest",
                                      copy ? json_string(copy) : json_null(), "lag_steps", lag));
    }
    return out;
}

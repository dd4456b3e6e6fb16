/* exit_queue: RANK_EXITs kept until the daemon has read them (see exit_queue.h). */
#include "worker/agent/exit_queue.h"

#include <string.h>

/* Keep the entries for which keep() says so, in order. */
static void filter(struct exitq *q, int (*keep)(const struct exitq_entry *, uint64_t), uint64_t arg)
{
    uint32_t w = 0;
    for (uint32_t i = 0; i < q->n; i++) {
        if (!keep(&q->e[i], arg))
            continue;
        if (w != i)
            q->e[w] = q->e[i];
        w++;
    }
    q->n = w;
}

int exitq_push(struct exitq *q, const struct proto_rank_exit *x, uint64_t after_seq)
{
    int dropped = 0;
    if (q->n == EXITQ_MAX) {
        memmove(&q->e[0], &q->e[1], sizeof(q->e[0]) * (EXITQ_MAX - 1));
        q->n--;
        dropped = 1;
    }
    q->e[q->n].x = *x;
    q->e[q->n].after_seq = after_seq;
    q->n++;
    return dropped;
}

static int unread(const struct exitq_entry *e, uint64_t echoed) { return e->after_seq >= echoed; }

void exitq_confirm(struct exitq *q, uint64_t seq) { filter(q, unread, seq); }

static int current(const struct exitq_entry *e, uint64_t generation) { return e->x.generation >= generation; }

void exitq_drop_before(struct exitq *q, uint64_t generation) { filter(q, current, generation); }

int exitq_holds(const struct exitq *q, uint64_t generation)
{
    for (uint32_t i = 0; i < q->n; i++)
        if (q->e[i].x.generation == generation)
            return 1;
    return 0;
}

void exitq_sent(struct exitq *q, uint32_t i, uint64_t seq)
{
    if (i < q->n)
        q->e[i].after_seq = seq;
}

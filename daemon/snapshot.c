#include "daemon/snapshot.h"

#include <stdlib.h>
#include <string.h>

void snapshot_init(struct snapshot *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->lock, NULL);
}

void snapshot_destroy(struct snapshot *s)
{
    for (int i = 0; i < SNAP_NDOCS; i++)
        free(s->doc[i]);
    pthread_mutex_destroy(&s->lock);
}

void snapshot_publish(struct snapshot *s, enum snap_doc which, char *text)
{
    pthread_mutex_lock(&s->lock);
    char *old = s->doc[which];
    s->doc[which] = text;
    s->read[which] = 0;
    s->version++;
    pthread_mutex_unlock(&s->lock);
    free(old);
}

char *snapshot_copy(struct snapshot *s, enum snap_doc which)
{
    pthread_mutex_lock(&s->lock);
    char *copy = s->doc[which] ? strdup(s->doc[which]) : NULL;
    s->read[which] = 1;
    pthread_mutex_unlock(&s->lock);
    return copy;
}

int snapshot_was_read(struct snapshot *s, enum snap_doc which)
{
    pthread_mutex_lock(&s->lock);
    int read = s->read[which];
    pthread_mutex_unlock(&s->lock);
    return read;
}

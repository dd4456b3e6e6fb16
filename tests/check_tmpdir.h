#ifndef MUSTER_TESTS_CHECK_TMPDIR_H
#define MUSTER_TESTS_CHECK_TMPDIR_H
/* A Check fixture's temporary directory, for suites that work on files:
 * tmpdir_make(root) makes it from a "/tmp/...XXXXXX" template in root;
 * tmpdir_remove(root) removes it whole (links not followed) and puts the
 * template back, for the next test. */
#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tmpdir_rm_entry(const char *p, const struct stat *st, int t, struct FTW *f)
{
    (void)st, (void)t, (void)f;
    return remove(p);
}

static inline void tmpdir_make(char *root) { ck_assert_ptr_nonnull(mkdtemp(root)); }

static inline void tmpdir_remove(char *root)
{
    nftw(root, tmpdir_rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    strcpy(root + strlen(root) - 6, "XXXXXX");
}

#endif

#include "worker/train/blas_core.h"

#include <stdlib.h>
#include <strings.h>

#include <cblas.h>

/* Present in DYNAMIC_ARCH builds of OpenBLAS only: weak, so that a build
 * for one CPU (nothing to choose) links too. */
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

const char *blas_core_fix(void)
{
    const char *core = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") || !core || strcasecmp(core, "prescott") != 0 ||
        !gotoblas_dynamic_init || !gotoblas_dynamic_quit)
        return NULL;
    __builtin_cpu_init();
    const char *want = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2") ? "Haswell" : NULL;
    if (!want)
        return NULL;
    /* The environment is how gotoblas_dynamic_init takes a choice; it goes
     * away again, so that child processes choose for themselves. */
    setenv("OPENBLAS_CORETYPE", want, 1);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
    return openblas_get_corename();
}

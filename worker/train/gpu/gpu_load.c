/*
 * Finding and opening the GPU module (gpu_module.h), once. A build without
 * nvcc has no module and says so; a static build (MUSTER_GPU_STATIC, cuemu)
 * has the table linked in.
 */
#include "worker/train/gpu/gpu_module.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const struct gpu_module *loaded;
static char why[2048];

int gpu_module_built(void)
{
#ifdef MUSTER_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

#if defined(MUSTER_GPU_STATIC)
static void load(void) { loaded = gpu_module_entry(); }
#elif !defined(MUSTER_HAVE_CUDA)
static void load(void)
{
    snprintf(why, sizeof(why), "this muster-train was built without CUDA (nvcc not found at %s); "
             "rebuild where nvcc is installed, or use --device cpu", MUSTER_CUDA_HOME);
}
#else
/* The table of the module at path, or NULL with why set. */
static const struct gpu_module *open_module(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof(why), "cannot load the GPU module: %s; it needs the CUDA runtime, cuBLAS "
                 "and NCCL it was built with (%s/lib64): install them there, or add the directory "
                 "that holds them to LD_LIBRARY_PATH", dlerror(), MUSTER_CUDA_HOME);
        return NULL;
    }
    const struct gpu_module *(*entry)(void) =
        (const struct gpu_module *(*)(void))dlsym(h, GPU_MODULE_ENTRY);
    const struct gpu_module *m = entry ? entry() : NULL;
    if (!m) {
        snprintf(why, sizeof(why), "%s is not muster-train's GPU module (no %s)", path, GPU_MODULE_ENTRY);
    } else if (m->abi != GPU_MODULE_ABI || strcmp(m->version, MUSTER_VERSION) != 0 ||
               m->trainer_size != sizeof(struct gpu_trainer)) {
        snprintf(why, sizeof(why), "%s is from another build of muster (version %s, interface %d; "
                 "this muster-train is %s, interface %d): install the module of this build",
                 path, m->version, m->abi, MUSTER_VERSION, GPU_MODULE_ABI);
        m = NULL;
    }
    if (!m)
        dlclose(h);
    return m;
}

static void load(void)
{
    char exe[PATH_MAX], tried[2][PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        snprintf(why, sizeof(why), "cannot find the GPU module: /proc/self/exe unreadable");
        return;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    *slash = '\0';
    /* Next to the executable (the build directory, a copied pair), then
     * the installed layout: bin/muster-train, lib/muster/GPU_MODULE_FILE. */
    snprintf(tried[0], sizeof(tried[0]), "%s/%s", exe, GPU_MODULE_FILE);
    snprintf(tried[1], sizeof(tried[1]), "%s/../lib/muster/%s", exe, GPU_MODULE_FILE);
    for (int i = 0; i < 2; i++) {
        if (access(tried[i], F_OK) == 0) {
            loaded = open_module(tried[i]);
            return;
        }
    }
    snprintf(why, sizeof(why), "the GPU module %s is not installed: looked for %s and %s; "
             "`make install` puts it in PREFIX/lib/muster/, or copy it from the build directory "
             "next to muster-train", GPU_MODULE_FILE, tried[0], tried[1]);
}
#endif

const struct gpu_module *gpu_module_load(char *err, size_t errlen)
{
    pthread_once(&once, load);
    if (!loaded && err)
        snprintf(err, errlen, "%s", why);
    return loaded;
}

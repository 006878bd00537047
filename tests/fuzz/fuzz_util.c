/* Harness helpers of the fuzz targets (fuzz.h). */
#define _GNU_SOURCE /* memfd_create */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

const char *fuzz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("k3rt_fuzz", 0);
        if (fd < 0)
            abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        abort();
    return path;
}

void fuzz_write(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
}

const char *fuzz_dir(void)
{
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/k3rt_fuzz_XXXXXX");
        if (!mkdtemp(dir))
            abort();
    }
    return dir;
}

void fuzz_note(int rc, const char *msg)
{
    if (getenv("K3RT_FUZZ_VERBOSE"))
        fprintf(stderr, "%s\n", rc ? msg : "accepted");
}

void fuzz_fixture_registry(registry *reg)
{
    static const char *const kinds[] = {"attention", "moe", "balancer", "optimizer",
                                        "residual"};
    k3rt_error err = {0};
    if (registry_init(reg, NULL, &err))
        abort();
    for (int i = 0; i < 5; i++) {
        char path[1024];
        const plugin_entry *e;
        snprintf(path, sizeof path, "%s/recipe_fixture_%s.so", K3RT_FIXTURE_DIR, kinds[i]);
        if (registry_load_file(reg, path, &e, &err))
            abort();
    }
}

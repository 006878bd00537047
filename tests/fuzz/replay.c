/* main() for the fuzz targets in ordinary builds: runs every file given (or every file in the
 * folders given) through LLVMFuzzerTestOneInput once. A crash or sanitizer report fails the
 * test; so the seed corpus and each input a fuzzer once crashed on stay covered. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = malloc(n > 0 ? (size_t)n : 1);
    size_t got = data ? fread(data, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!data || got != (size_t)n) {
        free(data);
        fprintf(stderr, "%s: cannot read\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput(data, got);
    free(data);
    return 0;
}

int main(int argc, char **argv)
{
    int inputs = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0)
            continue; /* a folder that does not exist yet (no regressions) */
        if (!S_ISDIR(st.st_mode)) {
            bad += replay_file(argv[i]);
            inputs++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        for (struct dirent *e; d && (e = readdir(d));) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            bad += replay_file(path);
            inputs++;
        }
        if (d)
            closedir(d);
    }
    printf("replayed %d inputs\n", inputs);
    return bad || inputs == 0;
}

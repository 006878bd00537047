/* The measured-peak table (peak.h). */
#include "train/peak.h"

#include <string.h>

typedef struct peak_entry {
    const char *name_contains;
    double tflops;   /* dense bf16 GEMM, fp32 accumulate, measured with cuBLAS */
} peak_entry;

static const peak_entry peaks[] = {
    /* cuBLAS bf16 GEMMs at K3-mini shapes on the GPU machine's H200 ran at 703-726 TFLOP/s
     * (docs/PERFORMANCE.md, 2026-11-30). */
    {"H200", 725.0},
};

double device_peak_flops(const char *device_name)
{
    if (!device_name)
        return 0;
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++)
        if (strstr(device_name, peaks[i].name_contains))
            return peaks[i].tflops * 1e12;
    return 0;
}

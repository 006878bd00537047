/* Peak bf16 matrix throughput per device, what MFU is reported against. The table holds only
 * figures measured on the named device (scripts/bench/, docs/PERFORMANCE.md); any other device
 * reports no MFU unless the recipe gives plan.peak_tflops. */
#ifndef K3RT_TRAIN_PEAK_H
#define K3RT_TRAIN_PEAK_H

/* FLOP/s for a device name as CUDA reports it ("NVIDIA H200"), or 0 when unknown. */
double device_peak_flops(const char *device_name);

#endif

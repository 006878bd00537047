/* The safetensors reader (st_open) on arbitrary bytes: it must refuse with a message or
 * return entries whose data lie inside the file, never crash or read out of bounds. */
#include <string.h>

#include "fuzz.h"
#include "train/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_file *f;
    k3rt_error err = {0};
    if (st_open(fuzz_file(data, size), &f, &err) != K3RT_OK)
        return 0;
    volatile uint8_t sink = 0;
    for (int i = 0; i < st_count(f); i++) {
        const st_entry *e = st_at(f, i);
        int64_t bytes = (int64_t)k3rt_dtype_size(e->dtype);
        for (int d = 0; d < e->ndim; d++)
            bytes *= e->shape[d];
        if (bytes > 0) /* every byte of every tensor is readable */
            sink ^= ((const uint8_t *)e->data)[0] ^ ((const uint8_t *)e->data)[bytes - 1];
        if (st_find(f, e->name) != e)
            __builtin_trap();
    }
    (void)sink;
    st_metadata(f);
    st_close(f);
    return 0;
}

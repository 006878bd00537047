/* safetensors files: `u64 LE header length N | N bytes of JSON header | data`, as specified by
 * huggingface/safetensors (optim_parallel_memory.md section 5.1). The reader validates
 * everything the reference reader does — header length bound, JSON shape, dtype names,
 * offsets that tile the data buffer exactly, byte counts that match shapes, no trailing bytes,
 * no duplicate names — and fails with the file name and what is wrong. */
#ifndef K3RT_SAFETENSORS_H
#define K3RT_SAFETENSORS_H

#include <stdint.h>
#include <jansson.h>
#include <k3rt/errors.h>
#include <k3rt/tensor.h>

typedef struct st_entry {
    const char *name;
    int dtype;           /* k3rt_dtype */
    int ndim;            /* 0..4 (0 = scalar) */
    int64_t shape[4];
    const void *data;    /* host memory, numel * dtype size bytes */
} st_entry;

/* Writes atomically (path.tmp, fsync, rename). metadata: NULL or a JSON object of string
 * values, stored as "__metadata__". Entries are written in the order given. */
int st_write(const char *path, const st_entry *entries, int n, const json_t *metadata,
             k3rt_error *err);

typedef struct st_file st_file;

/* Maps the file and validates it. Entry data point into the mapping (or, for a tensor not
 * aligned to its element size in the file, into an aligned copy) and stay valid until st_close,
 * even if st_write replaces the file meanwhile. A valid file that k3rt cannot represent (a dtype
 * other than the eight of st_dtype_name, more than 4 dims) fails with K3RT_ERR_UNSUPPORTED
 * naming the tensor. */
int st_open(const char *path, st_file **out, k3rt_error *err);
void st_close(st_file *f);
int st_count(const st_file *f);
const st_entry *st_at(const st_file *f, int i);  /* data order: for st_write's files, as given */
const st_entry *st_find(const st_file *f, const char *name);  /* NULL when absent */
const json_t *st_metadata(const st_file *f);                  /* NULL when absent */

/* The safetensors dtype string of a k3rt dtype ("F32", "BF16", "F8_E4M3", ...) and back. */
const char *st_dtype_name(int dtype);
int st_dtype_from_name(const char *name);  /* K3RT_DTYPE_INVALID if unknown/unsupported */

#endif

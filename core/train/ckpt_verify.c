/* Checkpoint tensors: checksums and values (ckpt_verify.h). */
#include "train/ckpt_verify.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "util/fs.h"

static const char *const FILES[] = {"model.safetensors", "state.safetensors"};

static int64_t entry_bytes(const st_entry *e)
{
    int64_t n = (int64_t)k3rt_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++)
        n *= e->shape[d];
    return n;
}

static void checksum(const st_entry *e, char out[16])
{
    uLong c = crc32_z(0L, Z_NULL, 0);
    if (entry_bytes(e) > 0)
        c = crc32_z(c, e->data, (size_t)entry_bytes(e));
    snprintf(out, 16, "crc32:%08lx", (unsigned long)(c & 0xffffffffUL));
}

json_t *ckpt_checksums(const st_entry *entries, int n)
{
    json_t *o = json_object();
    for (int i = 0; o && i < n; i++) {
        char c[16];
        checksum(&entries[i], c);
        json_object_set_new(o, entries[i].name, json_string(c));
    }
    return o;
}

/* Element i of a floating-point tensor as a double (bf16 and fp8 by their bits). */
static double value_at(const st_entry *e, int64_t i)
{
    const unsigned char *p = e->data;
    switch (e->dtype) {
    case K3RT_F64: {
        double v;
        memcpy(&v, p + 8 * i, 8);
        return v;
    }
    case K3RT_F32: {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case K3RT_BF16: {
        uint32_t bits = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
        float v;
        memcpy(&v, &bits, 4);
        return v;
    }
    case K3RT_FP8_E4M3:
        return (p[i] & 0x7f) == 0x7f ? NAN : 0.0; /* e4m3 has no infinity; only its sign */
    default:
        return 0.0;
    }
}

static int check_values(const char *file, const st_entry *e, k3rt_error *err)
{
    if (!k3rt_dtype_is_float(e->dtype))
        return K3RT_OK;
    int64_t n = entry_bytes(e) / (int64_t)k3rt_dtype_size(e->dtype);
    size_t len = strlen(e->name);
    int second_moment = !strncmp(e->name, "optimizer.", 10) && len > 2 &&
                        !strcmp(e->name + len - 2, ".v");
    for (int64_t i = 0; i < n; i++) {
        double v = value_at(e, i);
        if (!isfinite(v))
            return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s holds %g at element %lld; "
                             "a checkpoint must hold finite numbers (corrupt, or saved from a "
                             "diverged run)", file, e->name, v, (long long)i);
        if (second_moment && v < 0)
            return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s (an Adam second moment) "
                             "holds %g at element %lld; expected >= 0 (corrupt)", file, e->name,
                             v, (long long)i);
    }
    return K3RT_OK;
}

static int verify_file(const char *dir, const char *name, const json_t *sums, k3rt_error *err)
{
    char path[1300];
    fs_join(path, sizeof path, dir, name);
    st_file *f;
    K3RT_TRY(st_open(path, &f, err));
    int rc = K3RT_OK;
    if (sums && !json_is_object(sums))
        rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s/manifest.json: tensors.%s must be an object "
                       "of checksums", dir, name);
    if (!rc && sums && json_object_size(sums) != (size_t)st_count(f))
        rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: holds %d tensors, its manifest lists %zu "
                       "(a file from another checkpoint?)", path, st_count(f),
                       json_object_size(sums));
    for (int i = 0; i < st_count(f) && !rc; i++) {
        const st_entry *e = st_at(f, i);
        char c[16];
        const char *want = sums ? json_string_value(json_object_get(sums, e->name)) : NULL;
        if (sums && !want)
            rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s has no checksum in the "
                           "manifest (a file from another checkpoint?)", path, e->name);
        else if (sums && (checksum(e, c), strcmp(c, want)))
            rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s has checksum %s, the manifest "
                           "says %s: the file is corrupt", path, e->name, c, want);
        else
            rc = check_values(path, e, err);
    }
    st_close(f);
    return rc;
}

const char *ckpt_shard_name(int q, char *buf, size_t len)
{
    snprintf(buf, len, "optimizer.rank%d.safetensors", q);
    return buf;
}

int ckpt_shard_count(const char *dir, const json_t *m, int *n, k3rt_error *err)
{
    const json_t *sh = json_object_get(m, "optimizer_shards");
    *n = 0;
    if (!sh)
        return K3RT_OK;
    const json_t *files = json_object_get(sh, "files");
    const json_t *dp = json_object_get(sh, "dp");
    if (!json_is_object(sh) || !json_is_array(files) || !json_is_integer(dp) ||
        json_integer_value(dp) != (json_int_t)json_array_size(files) ||
        json_array_size(files) < 1 || json_array_size(files) > 65536)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s/manifest.json: \"optimizer_shards\" must "
                         "be {\"dp\": N, \"files\": [N file names], ...} with 1 <= N <= "
                         "65536", dir);
    for (size_t q = 0; q < json_array_size(files); q++) {
        char want[64];
        const char *got = json_string_value(json_array_get(files, q));
        if (!got || strcmp(got, ckpt_shard_name((int)q, want, sizeof want)))
            return k3rt_fail(err, K3RT_ERR_FORMAT, "%s/manifest.json: optimizer_shards.files[%zu] "
                             "is %s%s%s, expected \"%s\"", dir, q, got ? "\"" : "",
                             got ? got : "not a string", got ? "\"" : "", want);
    }
    *n = (int)json_array_size(files);
    return K3RT_OK;
}

/* One file of the checkpoint against its checksums (when the manifest has them). */
static int verify_listed(const char *dir, const json_t *tensors, const char *name,
                         k3rt_error *err)
{
    const json_t *sums = tensors ? json_object_get(tensors, name) : NULL;
    if (tensors && !sums)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s/manifest.json: no checksums for %s", dir,
                         name);
    return verify_file(dir, name, sums, err);
}

int ckpt_verify(const char *dir, const json_t *m, k3rt_error *err)
{
    const json_t *tensors = json_object_get(m, "tensors");
    if (tensors && !json_is_object(tensors))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s/manifest.json: \"tensors\" must be an "
                         "object", dir);
    for (int i = 0; i < 2; i++)
        K3RT_TRY(verify_listed(dir, tensors, FILES[i], err));
    int shards;
    K3RT_TRY(ckpt_shard_count(dir, m, &shards, err));
    for (int q = 0; q < shards; q++) {
        char name[64];
        K3RT_TRY(verify_listed(dir, tensors, ckpt_shard_name(q, name, sizeof name), err));
    }
    return K3RT_OK;
}

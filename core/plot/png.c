/* PNG files (png.h): signature, IHDR, IDAT (zlib stream of filter-0 scanlines), IEND; each
 * chunk is length, type, data and the CRC-32 of type and data (zlib's crc32). */
#include "plot/png.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "util/fs.h"

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

/* Appends a chunk at out + *at. */
static void chunk(uint8_t *out, size_t *at, const char *type, const uint8_t *data, uint32_t n)
{
    uint8_t *p = out + *at;
    put32(p, n);
    memcpy(p + 4, type, 4);
    if (n)
        memcpy(p + 8, data, n);
    put32(p + 8 + n, (uint32_t)crc32(0L, p + 4, n + 4));
    *at += 12 + (size_t)n;
}

int png_write_rgb(const char *path, const uint8_t *rgb, int w, int h, k3rt_error *err)
{
    if (w < 1 || h < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: empty image (%d x %d)", path, w, h);
    size_t row = 3 * (size_t)w + 1, raw_n = row * (size_t)h;
    uLongf z_n = compressBound((uLong)raw_n);
    uint8_t *raw = malloc(raw_n), *z = malloc(z_n), *out = malloc(z_n + 64);
    int rc = K3RT_OK;
    if (!raw || !z || !out)
        rc = k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", path);
    for (int y = 0; !rc && y < h; y++) {
        raw[(size_t)y * row] = 0; /* filter type None */
        memcpy(raw + (size_t)y * row + 1, rgb + (size_t)y * 3 * (size_t)w, 3 * (size_t)w);
    }
    if (!rc && compress2(z, &z_n, raw, (uLong)raw_n, 9) != Z_OK)
        rc = k3rt_fail(err, K3RT_ERR_IO, "%s: zlib could not compress the image", path);
    if (!rc) {
        static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
        uint8_t ihdr[13];
        put32(ihdr, (uint32_t)w);
        put32(ihdr + 4, (uint32_t)h);
        ihdr[8] = 8;  /* bits per channel */
        ihdr[9] = 2;  /* colour type: RGB */
        ihdr[10] = ihdr[11] = ihdr[12] = 0; /* deflate, adaptive filtering, no interlace */
        size_t at = 8;
        memcpy(out, signature, 8);
        chunk(out, &at, "IHDR", ihdr, 13);
        chunk(out, &at, "IDAT", z, (uint32_t)z_n);
        chunk(out, &at, "IEND", NULL, 0);
        rc = fs_write_atomic(path, out, at, err);
    }
    free(raw);
    free(z);
    free(out);
    return rc;
}

/* Charts (core/plot): the PNG is a valid file whose pixels show the series where the layout
 * put them, the SVG carries the same items, and the bitmap font has a glyph per character. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "plot/chart.h"
#include "plot/font.h"
#include "util/fs.h"
#include "testutil/testutil.h"

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Checks the chunk layout and CRCs, inflates IDAT; returns the raw scanlines. */
static uint8_t *read_png(const char *path, int *w, int *h)
{
    char *data;
    size_t len;
    k3rt_error err = {0};
    TU_OK(fs_read_file(path, &data, &len, &err), err);
    const uint8_t *p = (const uint8_t *)data;
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    ck_assert(len > 8 && !memcmp(p, sig, 8));
    size_t at = 8;
    uint8_t *idat = NULL;
    size_t idat_n = 0;
    int seen_end = 0;
    while (at + 12 <= len && !seen_end) {
        uint32_t n = get32(p + at);
        ck_assert(at + 12 + n <= len);
        ck_assert_msg(get32(p + at + 8 + n) == (uint32_t)crc32(0L, p + at + 4, n + 4),
                      "bad CRC in chunk %.4s", (const char *)p + at + 4);
        if (!memcmp(p + at + 4, "IHDR", 4)) {
            *w = (int)get32(p + at + 8);
            *h = (int)get32(p + at + 12);
            ck_assert_int_eq(p[at + 16], 8); /* bit depth */
            ck_assert_int_eq(p[at + 17], 2); /* RGB */
        } else if (!memcmp(p + at + 4, "IDAT", 4)) {
            idat = realloc(idat, idat_n + n);
            memcpy(idat + idat_n, p + at + 8, n);
            idat_n += n;
        } else if (!memcmp(p + at + 4, "IEND", 4)) {
            seen_end = 1;
        }
        at += 12 + n;
    }
    ck_assert(seen_end && at == len && idat);
    uLongf raw_n = (uLongf)(*h) * (uLongf)(3 * *w + 1);
    uint8_t *raw = malloc(raw_n);
    uLongf got = raw_n;
    ck_assert_int_eq(uncompress(raw, &got, idat, idat_n), Z_OK);
    ck_assert(got == raw_n);
    free(idat);
    free(data);
    return raw;
}

static const uint8_t *pixel(const uint8_t *raw, int w, int x, int y)
{
    return raw + (size_t)y * (size_t)(3 * w + 1) + 1 + 3 * (size_t)x;
}

START_TEST(test_png_and_svg)
{
    char dir[512], png[600], svg[600];
    tu_tmpdir(dir, sizeof dir);
    snprintf(png, sizeof png, "%s/c.png", dir);
    snprintf(svg, sizeof svg, "%s/c.svg", dir);
    /* One series, a horizontal line at y = 2 from x = 1e12 to 1e14, and one point of a second
     * (a NaN point is skipped). */
    double x1[3] = {1e12, 1e13, 1e14}, y1[3] = {2, 2, 2}, x2[2] = {1e13, 1e13}, y2[2] = {NAN, 3};
    chart_series s[2] = {{"first", x1, y1, 3, 0, 0}, {"second <&>", x2, y2, 2, 0, 0}};
    chart_spec c = {"title", "x", "y", 1, s, 2};
    k3rt_error err = {0};
    TU_OK(chart_write_png(&c, png, &err), err);
    TU_OK(chart_write_svg(&c, svg, &err), err);
    int w = 0, h = 0;
    uint8_t *raw = read_png(png, &w, &h);
    ck_assert_int_eq(w, 1600);
    ck_assert_int_eq(h, 1000);
    for (int y = 0; y < h; y++)
        ck_assert_int_eq(raw[(size_t)y * (size_t)(3 * w + 1)], 0); /* filter None */
    /* The plot area spans x 80..600 and y 45..420 (logical); y runs 1.95..3.05 after the 5%
     * padding, so y = 2 sits at 45 + (3.05 - 2) / 1.1 * 375 = 403 (device row 806). In the
     * middle of the line the pixel is the first series' colour (0x1f77b4). */
    int row = (int)lround(2 * (45 + (3.05 - 2) / 1.1 * 375));
    const uint8_t *p = pixel(raw, w, 2 * 340, row);
    ck_assert_msg(p[0] == 0x1f && p[1] == 0x77 && p[2] == 0xb4, "pixel %02x%02x%02x", p[0],
                  p[1], p[2]);
    /* A corner of the canvas stays background */
    p = pixel(raw, w, 2, 2);
    ck_assert(p[0] == 0xff && p[1] == 0xff && p[2] == 0xff);
    free(raw);
    char *text;
    size_t len;
    TU_OK(fs_read_file(svg, &text, &len, &err), err);
    ck_assert(strstr(text, "<svg") && strstr(text, "</svg>"));
    ck_assert(strstr(text, "stroke=\"#1f77b4\""));
    ck_assert(strstr(text, ">second &lt;&amp;&gt;</text>"));
    ck_assert(strstr(text, ">1e13</text>")); /* a decade tick of the log axis */
    free(text);
}
END_TEST

START_TEST(test_font)
{
    for (int c = 33; c < 127; c++) {
        const uint8_t *g = font5x7_glyph((char)c);
        int ink = 0;
        for (int r = 0; r < FONT_H; r++)
            ink |= g[r];
        ck_assert_msg(ink, "glyph '%c' is empty", c);
        ck_assert_msg(!(ink & ~0x1f), "glyph '%c' is wider than 5", c);
        for (int d = 33; d < c; d++)
            ck_assert_msg(memcmp(g, font5x7_glyph((char)d), FONT_H), "'%c' looks like '%c'", c,
                          d);
    }
    ck_assert(font5x7_glyph('\n') == font5x7_glyph('?'));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("chart");
    TCase *tc = tcase_create("chart");
    tcase_add_test(tc, test_png_and_svg);
    tcase_add_test(tc, test_font);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}

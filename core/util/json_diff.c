/* JSON differences (json_diff.h). */
#include "util/json_diff.h"

#include <stdio.h>

/* b_may_add: keys of b that a lacks (at any depth) are no difference. */
static int differ(const json_t *a, const json_t *b, const char *path, char *buf, size_t len,
                  int b_may_add)
{
    if (json_equal(a, b))
        return 0;
    if (json_is_object(a) && json_is_object(b)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)a, k, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", k);
            if (differ(v, json_object_get(b, k), sub, buf, len, b_may_add))
                return 1;
        }
        json_object_foreach((json_t *)b, k, v) {
            if (!json_object_get(a, k) && !b_may_add) {
                snprintf(buf, len, "%s%s%s", path, *path ? "." : "", k);
                return 1;
            }
        }
        return 0;
    }
    if (json_is_array(a) && json_is_array(b) && json_array_size(a) == json_array_size(b)) {
        for (size_t i = 0; i < json_array_size(a); i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s[%zu]", path, i + 1);
            if (differ(json_array_get(a, i), json_array_get(b, i), sub, buf, len, b_may_add))
                return 1;
        }
        return 0;
    }
    snprintf(buf, len, "%s", path);
    return 1;
}

int json_first_difference(const json_t *a, const json_t *b, const char *path, char *buf,
                          size_t len)
{
    return differ(a, b, path, buf, len, 0);
}

int json_first_conflict(const json_t *a, const json_t *b, const char *path, char *buf,
                        size_t len)
{
    return differ(a, b, path, buf, len, 1);
}

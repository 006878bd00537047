/* JSON differences (json_diff.h). */
#include "util/json_diff.h"

#include <stdio.h>

int json_first_difference(const json_t *a, const json_t *b, const char *path, char *buf,
                          size_t len)
{
    if (json_equal(a, b))
        return 0;
    if (json_is_object(a) && json_is_object(b)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)a, k, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", k);
            if (json_first_difference(v, json_object_get(b, k), sub, buf, len))
                return 1;
        }
        json_object_foreach((json_t *)b, k, v) {
            if (!json_object_get(a, k)) {
                snprintf(buf, len, "%s%s%s", path, *path ? "." : "", k);
                return 1;
            }
        }
    }
    if (json_is_array(a) && json_is_array(b) && json_array_size(a) == json_array_size(b)) {
        for (size_t i = 0; i < json_array_size(a); i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s[%zu]", path, i + 1);
            if (json_first_difference(json_array_get(a, i), json_array_get(b, i), sub, buf,
                                      len))
                return 1;
        }
    }
    snprintf(buf, len, "%s", path);
    return 1;
}

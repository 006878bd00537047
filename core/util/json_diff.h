/* Where two JSON documents differ, for messages ("model.mixers.M.config.heads"). */
#ifndef K3RT_UTIL_JSON_DIFF_H
#define K3RT_UTIL_JSON_DIFF_H

#include <stddef.h>
#include <jansson.h>

/* The first key path (under `path`, "" for the top) where a and b differ, into buf; returns 1
 * then, 0 when they are equal. A key present on one side only is a difference at that key. */
int json_first_difference(const json_t *a, const json_t *b, const char *path, char *buf,
                          size_t len);

#endif

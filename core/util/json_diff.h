/* Where two JSON documents differ, for messages ("model.mixers.M.config.heads"). */
#ifndef K3RT_UTIL_JSON_DIFF_H
#define K3RT_UTIL_JSON_DIFF_H

#include <stddef.h>
#include <jansson.h>

/* The first key path (under `path`, "" for the top) where a and b differ, into buf; returns 1
 * then, 0 when they are equal. A key present on one side only is a difference at that key. */
int json_first_difference(const json_t *a, const json_t *b, const char *path, char *buf,
                          size_t len);

/* The same, except that keys b has and a lacks (at any depth) are no difference: where a, a
 * document, says less than b, its completed form (defaults filled in). */
int json_first_conflict(const json_t *a, const json_t *b, const char *path, char *buf,
                        size_t len);

#endif

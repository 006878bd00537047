/* "Did you mean" suggestions by edit distance. */
#ifndef K3RT_UTIL_NEAREST_H
#define K3RT_UTIL_NEAREST_H

/* The closest of n candidates to word, or NULL when none is close enough. */
const char *nearest_word(const char *word, const char *const *candidates, int n);

#endif

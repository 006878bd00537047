/* Fault injection for crash tests: K3RT_FAULT="<point>:<step>" makes the process kill itself
 * (SIGKILL, as `kill -9` would) when it reaches that point at that step, e.g.
 * K3RT_FAULT=ckpt.done:6 between writing a checkpoint's DONE marker and renaming its folder
 * into place. Points: ckpt.weights, ckpt.state, ckpt.manifest (after each file of a
 * checkpoint), ckpt.shard (after a ZeRO-1 rank's optimizer shard), ckpt.done, ckpt.renamed
 * (around the commit's rename). Unset: nothing happens. */
#ifndef K3RT_UTIL_FAULT_H
#define K3RT_UTIL_FAULT_H

#include <stdint.h>

void fault_point(const char *point, int64_t step);

#endif

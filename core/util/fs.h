/* File-system helpers: whole-file reads, atomic writes, directories. */
#ifndef K3RT_UTIL_FS_H
#define K3RT_UTIL_FS_H

#include <stddef.h>
#include <stdio.h>
#include <k3rt/errors.h>

/* Reads a whole file; *data is NUL-terminated (not counted in *len); free() it. */
int fs_read_file(const char *path, char **data, size_t *len, k3rt_error *err);
/* Writes path atomically: path.tmp, fsync, rename, fsync of the directory. */
int fs_write_atomic(const char *path, const void *data, size_t len, k3rt_error *err);
/* Streaming form of fs_write_atomic for files too large to build in memory: fs_atomic_open
 * creates path.tmp; fs_atomic_write appends (the first failure is kept and reported by the
 * commit); fs_atomic_commit flushes, fsyncs and renames it over path, then fsyncs the
 * directory; fs_atomic_abort closes and removes the temporary file. Either of the two ends
 * every opened fs_atomic. */
typedef struct fs_atomic {
    FILE *f;
    int write_errno;  /* first failed write, 0 when none */
    char path[4096];
    char tmp[4096];
} fs_atomic;
int fs_atomic_open(fs_atomic *a, const char *path, k3rt_error *err);
void fs_atomic_write(fs_atomic *a, const void *data, size_t len);
int fs_atomic_commit(fs_atomic *a, k3rt_error *err);
void fs_atomic_abort(fs_atomic *a);
/* fflush + fsync + fclose, reporting which file failed. */
int fs_close_synced(FILE *f, const char *path, k3rt_error *err);
int fs_mkdirs(const char *path, k3rt_error *err);
int fs_fsync_dir(const char *path, k3rt_error *err);
int fs_exists(const char *path);
int fs_is_dir(const char *path);
/* Removes a directory tree (files and one level of subdirectories deep enough for
 * checkpoints); missing is not an error. */
int fs_remove_tree(const char *path, k3rt_error *err);
/* Joins a and b with one '/'; returns buf. */
const char *fs_join(char *buf, size_t len, const char *a, const char *b);
/* Directory part of path ("." when none) into buf. */
const char *fs_dirname(char *buf, size_t len, const char *path);
/* File name without directories and without the extension into buf ("tiny" for
 * "scripts/recipes/tiny.lua"). */
const char *fs_stem(char *buf, size_t len, const char *path);

#endif

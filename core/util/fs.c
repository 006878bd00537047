/* File-system helpers (fs.h). */
#define _POSIX_C_SOURCE 200809L
#include "util/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fs_read_file(const char *path, char **data, size_t *len, k3rt_error *err)
{
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot seek: %s", path, strerror(errno));
    }
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return k3rt_fail(err, K3RT_ERR_IO, "%s: not a regular file", path);
    }
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        fclose(f);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: cannot allocate %ld bytes", path, size);
    }
    size_t got = fread(buf, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        free(buf);
        return k3rt_fail(err, K3RT_ERR_IO, "%s: short read (%zu of %ld bytes)", path, got,
                         size);
    }
    buf[size] = '\0';
    *data = buf;
    *len = (size_t)size;
    return K3RT_OK;
}

int fs_close_synced(FILE *f, const char *path, k3rt_error *err)
{
    int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: write failed: %s", path, strerror(e));
    return K3RT_OK;
}

int fs_fsync_dir(const char *path, k3rt_error *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot open directory: %s", path,
                         strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: fsync failed: %s", path, strerror(e));
    return K3RT_OK;
}

int fs_atomic_open(fs_atomic *a, const char *path, k3rt_error *err)
{
    a->f = NULL;
    a->write_errno = 0;
    if ((size_t)snprintf(a->path, sizeof a->path, "%s", path) >= sizeof a->path ||
        (size_t)snprintf(a->tmp, sizeof a->tmp, "%s.tmp", path) >= sizeof a->tmp)
        return k3rt_fail(err, K3RT_ERR_INVALID, "path too long: %s", path);
    a->f = fopen(a->tmp, "wb");
    if (!a->f)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot create: %s", a->tmp, strerror(errno));
    return K3RT_OK;
}

void fs_atomic_abort(fs_atomic *a)
{
    if (a->f) {
        fclose(a->f);
        a->f = NULL;
        remove(a->tmp);
    }
}

void fs_atomic_write(fs_atomic *a, const void *data, size_t len)
{
    if (a->write_errno || !len)
        return;
    if (fwrite(data, 1, len, a->f) != len)
        a->write_errno = errno ? errno : EIO;
}

int fs_atomic_commit(fs_atomic *a, k3rt_error *err)
{
    if (a->write_errno || ferror(a->f)) {
        int e = a->write_errno ? a->write_errno : EIO;
        fs_atomic_abort(a);
        return k3rt_fail(err, K3RT_ERR_IO, "%s: write failed: %s", a->tmp, strerror(e));
    }
    FILE *f = a->f;
    a->f = NULL;
    int rc = fs_close_synced(f, a->tmp, err);
    if (rc) {
        remove(a->tmp);
        return rc;
    }
    if (rename(a->tmp, a->path) != 0) {
        int e = errno;
        remove(a->tmp);
        return k3rt_fail(err, K3RT_ERR_IO, "%s: rename failed: %s", a->path, strerror(e));
    }
    char dir[4096];
    return fs_fsync_dir(fs_dirname(dir, sizeof dir, a->path), err);
}

int fs_write_atomic(const char *path, const void *data, size_t len, k3rt_error *err)
{
    fs_atomic a;
    K3RT_TRY(fs_atomic_open(&a, path, err));
    fs_atomic_write(&a, data, len);
    return fs_atomic_commit(&a, err);
}

int fs_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

int fs_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int fs_mkdirs(const char *path, k3rt_error *err)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return k3rt_fail(err, K3RT_ERR_INVALID, "bad directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot create directory: %s", buf,
                                 strerror(errno));
            buf[i] = c;
        }
    }
    if (!fs_is_dir(path))
        return k3rt_fail(err, K3RT_ERR_IO, "%s: exists and is not a directory", path);
    return K3RT_OK;
}

int fs_remove_tree(const char *path, k3rt_error *err)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return K3RT_OK;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d)
            return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char child[4096];
            fs_join(child, sizeof child, path, e->d_name);
            int rc = fs_remove_tree(child, err);
            if (rc) {
                closedir(d);
                return rc;
            }
        }
        closedir(d);
        if (rmdir(path) != 0)
            return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
        return K3RT_OK;
    }
    if (unlink(path) != 0)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return K3RT_OK;
}

const char *fs_join(char *buf, size_t len, const char *a, const char *b)
{
    size_t la = strlen(a);
    if (la && a[la - 1] == '/')
        snprintf(buf, len, "%s%s", a, b);
    else
        snprintf(buf, len, "%s/%s", a, b);
    return buf;
}

const char *fs_dirname(char *buf, size_t len, const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, len, ".");
    else if (slash == path)
        snprintf(buf, len, "/");
    else
        snprintf(buf, len, "%.*s", (int)(slash - path), path);
    return buf;
}

const char *fs_stem(char *buf, size_t len, const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    int n = dot && dot != base ? (int)(dot - base) : (int)strlen(base);
    snprintf(buf, len, "%.*s", n, base);
    return buf;
}

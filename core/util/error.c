/* Status codes and error messages (k3rt/errors.h). */
#include <k3rt/errors.h>

#include <stdio.h>
#include <string.h>

int k3rt_vfail(k3rt_error *err, int code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

int k3rt_fail(k3rt_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    k3rt_vfail(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int k3rt_error_prefix(k3rt_error *err, const char *fmt, ...)
{
    if (!err)
        return K3RT_ERR_INVALID;
    char prefix[K3RT_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char joined[K3RT_ERROR_MSG_MAX];
    snprintf(joined, sizeof joined, "%s%s", prefix, err->msg);
    memcpy(err->msg, joined, sizeof joined);
    return err->code;
}

void k3rt_error_clear(k3rt_error *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
}

const char *k3rt_status_name(int code)
{
    switch (code) {
    case K3RT_OK: return "ok";
    case K3RT_ERR_INVALID: return "invalid";
    case K3RT_ERR_IO: return "io";
    case K3RT_ERR_NOMEM: return "out of memory";
    case K3RT_ERR_UNSUPPORTED: return "unsupported";
    case K3RT_ERR_FORMAT: return "format";
    case K3RT_ERR_ABI: return "abi";
    case K3RT_ERR_NUMERIC: return "numeric";
    case K3RT_ERR_DEVICE: return "device";
    case K3RT_ERR_COMM: return "comm";
    case K3RT_ERR_LIMIT: return "limit";
    case K3RT_ERR_NOT_FOUND: return "not found";
    default: return "unknown";
    }
}

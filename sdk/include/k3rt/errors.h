/* k3rt/errors.h — status codes and human-readable error messages.
 *
 * Every call that can fail returns an int status (K3RT_OK == 0, failures negative) and, when
 * given a k3rt_error, fills its message with what went wrong and where: which file, which key,
 * what was expected, what was found. Callers add context outward with k3rt_error_prefix, so a
 * message reads "layers.3.mixer (kda): config key 'heads': expected an integer >= 1, got 0".
 *
 * k3rt_error is a frozen value type for an ABI major version (it never grows).
 */
#ifndef K3RT_ERRORS_H
#define K3RT_ERRORS_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define K3RT_API __declspec(dllexport)
#else
#define K3RT_API __attribute__((visibility("default")))
#endif

typedef enum k3rt_status {
    K3RT_OK = 0,
    K3RT_ERR_INVALID = -1,     /* bad argument, config value or recipe */
    K3RT_ERR_IO = -2,          /* a file could not be read or written */
    K3RT_ERR_NOMEM = -3,       /* an allocation failed */
    K3RT_ERR_UNSUPPORTED = -4, /* valid request this build or plugin cannot serve */
    K3RT_ERR_FORMAT = -5,      /* a file is malformed or corrupt */
    K3RT_ERR_ABI = -6,         /* plugin ABI mismatch */
    K3RT_ERR_NUMERIC = -7,     /* NaN/Inf or a numerical breakdown */
    K3RT_ERR_DEVICE = -8,      /* CUDA or device failure */
    K3RT_ERR_COMM = -9,        /* communication failure */
    K3RT_ERR_LIMIT = -10,      /* a budget was exceeded (recipe memory, instructions) */
    K3RT_ERR_NOT_FOUND = -11   /* a named thing (file, plugin, key) does not exist */
} k3rt_status;

#define K3RT_ERROR_MSG_MAX 1024

typedef struct k3rt_error {
    int code;
    char msg[K3RT_ERROR_MSG_MAX];
} k3rt_error;

/* Sets err (may be NULL) to code + formatted message; returns code so callers can
 * `return k3rt_fail(err, K3RT_ERR_INVALID, "...")`. */
K3RT_API int k3rt_fail(k3rt_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
K3RT_API int k3rt_vfail(k3rt_error *err, int code, const char *fmt, va_list ap);
/* Prepends formatted context to an existing message; returns err->code. */
K3RT_API int k3rt_error_prefix(k3rt_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
K3RT_API void k3rt_error_clear(k3rt_error *err);
K3RT_API const char *k3rt_status_name(int code);

/* Propagate a failing status unchanged. */
#define K3RT_TRY(expr)                     \
    do {                                   \
        int k3rt_try_rc_ = (expr);         \
        if (k3rt_try_rc_ != K3RT_OK)       \
            return k3rt_try_rc_;           \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif

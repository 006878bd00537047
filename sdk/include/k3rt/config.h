/* k3rt/config.h — plugin configuration: a declared option schema and typed getters.
 *
 * A plugin lists its options (name, type, default, range or choices, help) in its descriptor.
 * Before create() is called the host validates the recipe's table against that list — an
 * unknown key fails naming the nearest valid key, a wrong type or out-of-range value fails
 * naming key, expected and found — and fills in the defaults. create() therefore receives a
 * complete configuration, an opaque k3rt_config, and reads it with the getters below, which
 * cannot fail for a declared option. Cross-option checks (e.g. "latent must divide ...") stay
 * in create().
 *
 * k3rt_option entries are read with the stride the descriptor states (option_size), so the
 * struct may grow at the end like every other ABI struct.
 */
#ifndef K3RT_CONFIG_H
#define K3RT_CONFIG_H

#include <stdint.h>
#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum k3rt_option_type {
    K3RT_OPT_INT = 1,
    K3RT_OPT_FLOAT = 2,   /* accepts integers too */
    K3RT_OPT_BOOL = 3,
    K3RT_OPT_STRING = 4   /* with `choices`, one of a '|'-separated list */
} k3rt_option_type;

enum {
    K3RT_OPT_NULLABLE = 1u << 0  /* `none`/nil is a valid value (e.g. kda lower_bound) */
};

typedef struct k3rt_option {
    const char *name;
    int32_t type;          /* k3rt_option_type */
    uint32_t flags;        /* K3RT_OPT_* */
    const char *default_json; /* JSON text of the default ("4", "-5.0", "null", "\"situ\"");
                                 NULL makes the option required */
    double min, max;       /* inclusive range for numbers; ignored when min > max */
    const char *choices;   /* "situ|swiglu" for strings; NULL accepts any string */
    const char *help;      /* one line, shown by `k3rt plugins --verbose` */
} k3rt_option;

#define K3RT_RANGE_ANY 1.0, 0.0  /* min > max: unbounded */

/* A validated configuration (opaque; valid for the duration of create()). */
typedef struct k3rt_config k3rt_config;

/* Getters over a validated config. A key that was declared is always present. */
K3RT_API int64_t k3rt_cfg_int(const k3rt_config *cfg, const char *key);
K3RT_API double k3rt_cfg_float(const k3rt_config *cfg, const char *key);
K3RT_API int k3rt_cfg_bool(const k3rt_config *cfg, const char *key);
K3RT_API const char *k3rt_cfg_string(const k3rt_config *cfg, const char *key); /* NULL if none */
K3RT_API int k3rt_cfg_is_null(const k3rt_config *cfg, const char *key);

#ifdef __cplusplus
}
#endif
#endif

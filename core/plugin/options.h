/* Plugin option schemas (k3rt/config.h): validation against a descriptor's options, and the
 * opaque k3rt_config a plugin reads, which is the validated JSON object itself. */
#ifndef K3RT_PLUGIN_OPTIONS_H
#define K3RT_PLUGIN_OPTIONS_H

#include <jansson.h>
#include <k3rt/config.h>

/* Validates `cfg` in place against options (unknown keys, types, ranges, choices) and fills
 * defaults. `what` names the owner in messages ("model.ffn (latent_moe)"). */
int options_apply(const k3rt_option *options, uint32_t n_options, uint32_t option_size,
                  json_t *cfg, const char *what, k3rt_error *err);

/* The plugin's view of a validated configuration. */
static inline const k3rt_config *config_of(const json_t *cfg)
{
    return (const k3rt_config *)cfg;
}

#endif

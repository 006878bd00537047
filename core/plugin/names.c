/* Version and enum names (k3rt/plugin.h). */
#include <k3rt/plugin.h>

#ifndef K3RT_VERSION
#define K3RT_VERSION "0.0.0"
#endif

void k3rt_abi_version(int *major, int *minor)
{
    if (major)
        *major = K3RT_ABI_MAJOR;
    if (minor)
        *minor = K3RT_ABI_MINOR;
}

const char *k3rt_version_string(void) { return K3RT_VERSION; }

const char *k3rt_kind_name(int kind)
{
    switch (kind) {
    case K3RT_KIND_ATTENTION: return "attention";
    case K3RT_KIND_MOE: return "moe";
    case K3RT_KIND_BALANCER: return "balancer";
    case K3RT_KIND_OPTIMIZER: return "optimizer";
    case K3RT_KIND_RESIDUAL: return "residual";
    default: return "unknown";
    }
}

const char *k3rt_role_name(int role)
{
    switch (role) {
    case K3RT_ROLE_MATRIX: return "matrix";
    case K3RT_ROLE_HEAD_MATRIX: return "head_matrix";
    case K3RT_ROLE_EXPERT_MATRIX: return "expert_matrix";
    case K3RT_ROLE_ROUTER: return "router";
    case K3RT_ROLE_EMBEDDING: return "embedding";
    case K3RT_ROLE_OUTPUT_HEAD: return "output_head";
    case K3RT_ROLE_NORM_GAIN: return "norm_gain";
    case K3RT_ROLE_VECTOR: return "vector";
    case K3RT_ROLE_CONV: return "conv";
    default: return "unknown";
    }
}

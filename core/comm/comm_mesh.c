/* Groups of the plan's mesh (comm_impl.h: comm_mesh). */
#include "comm/comm_impl.h"

void comm_mesh_split(const comm_mesh *m, int rank, int group, int *color, int *key)
{
    int cp_i = rank % m->cp, ep_i = rank / m->cp % m->ep, dp_i = rank / (m->cp * m->ep);
    if (group == K3RT_GROUP_EP) {
        *key = ep_i;
        *color = dp_i * m->cp + cp_i;
    } else if (group == K3RT_GROUP_CP) {
        *key = cp_i;
        *color = dp_i * m->ep + ep_i;
    } else {  /* K3RT_GROUP_DP */
        *key = dp_i;
        *color = ep_i * m->cp + cp_i;
    }
}

void comm_abort(k3rt_comm *c)
{
    if (c && c->ops->abort)
        c->ops->abort(c);
}

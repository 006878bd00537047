/* k3rt/k3rt.h — umbrella header of the k3rt plugin SDK. A plugin includes this and links
 * libk3rt (pkg-config k3rt, or find_package(k3rt) in CMake). */
#ifndef K3RT_K3RT_H
#define K3RT_K3RT_H

#include "errors.h"
#include "tensor.h"
#include "stream.h"
#include "comm.h"
#include "ops.h"
#include "random.h"
#include "config.h"
#include "plugin.h"

#endif

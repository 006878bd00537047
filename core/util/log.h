/* Console output: progress and notices to stderr/stdout with one verbosity switch. The
 * runtime's functions (k3rt/host.h), under the names the core uses. */
#ifndef K3RT_UTIL_LOG_H
#define K3RT_UTIL_LOG_H

#include <k3rt/host.h>

enum { LOG_QUIET = K3RT_LOG_QUIET, LOG_INFO = K3RT_LOG_INFO, LOG_DEBUG = K3RT_LOG_DEBUG };

#define log_set_level k3rt_log_set_level
#define log_level k3rt_log_level
#define log_info k3rt_log_info
#define log_debug k3rt_log_debug
#define log_warn k3rt_log_warn
#define time_now k3rt_time_now

#endif

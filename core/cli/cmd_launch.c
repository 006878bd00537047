/* `k3rt launch -n N RECIPE.lua [train options]`: N ranks of `k3rt train` on this machine, one
 * process each, started the way torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR = 127.0.0.1, MASTER_PORT = a free port), so they talk over
 * the tcp backend. The launcher is every rank's parent: it forwards each rank's output line
 * by line as "[rank r] ...", and when a rank dies or fails it knows first-hand which rank,
 * pid and signal or exit status, and reads the step the rank was at from its rank file
 * (K3RT_LAUNCH_DIR, train_status.c). The other ranks stop by themselves as soon as they next
 * talk to the dead one (its connections close); any still running after a grace period are
 * sent SIGTERM, then SIGKILL, so the job ends within a bounded time, never hangs.
 * Checkpoints are committed atomically by rank 0: a rank killed mid-save loses nothing
 * committed. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "util/fs.h"

#define GRACE_TERM_S 10.0 /* after a failure: SIGTERM to ranks still running */
#define GRACE_KILL_S 20.0 /* then SIGKILL */

typedef struct rank_proc {
    pid_t pid;
    int fd;            /* its stdout + stderr; -1 once closed */
    char line[4096];
    size_t len;
    int done, status;
} rank_proc;

static volatile sig_atomic_t g_interrupted;
static void on_signal(int sig) { g_interrupted = sig; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void usage(FILE *to)
{
    fprintf(to,
            "usage: k3rt launch -n N RECIPE.lua [k3rt train options]\n"
            "  Starts N processes of `k3rt train` on this machine, one data-parallel rank each\n"
            "  (the recipe's plan.dp x plan.ep x plan.cp must be N), and forwards their output\n"
            "  with a \"[rank r] \" prefix. If a rank fails or dies, the others are stopped and\n"
            "  the launcher names it (rank, pid, signal or exit status, step); it exits 0 only\n"
            "  when every rank succeeded.\n"
            "  -n N          number of ranks (processes)\n"
            "  --port P      MASTER_PORT for the ranks' rendezvous (default: a free port)\n");
}

/* A free TCP port on the loopback interface (the kernel's choice). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    int port = -1;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&sa, sizeof sa) &&
        !getsockname(fd, (struct sockaddr *)&sa, &len))
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void set_int_env(const char *name, int v)
{
    char b[32];
    snprintf(b, sizeof b, "%d", v);
    setenv(name, b, 1);
}

/* The child: rank r's environment, output into the pipe, then `k3rt train ARGS`. */
static void exec_rank(int r, int n, int port, const char *dir, int out, char **args)
{
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    close(out);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  /* never outlive the launcher */
    set_int_env("RANK", r);
    set_int_env("WORLD_SIZE", n);
    set_int_env("LOCAL_RANK", r);
    set_int_env("LOCAL_WORLD_SIZE", n);
    set_int_env("MASTER_PORT", port);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("K3RT_LAUNCH_DIR", dir, 1);
    /* a launch inside an mpirun or Slurm job is still its own job */
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("SLURM_NTASKS");
    execv("/proc/self/exe", args);
    fprintf(stderr, "k3rt launch: cannot start rank %d: %s\n", r, strerror(errno));
    _exit(127);
}

static void flush_line(rank_proc *p, int r)
{
    printf("[rank %d] %.*s\n", r, (int)p->len, p->line);
    p->len = 0;
}

/* Reads what rank r wrote; prints each complete line with its prefix. */
static void drain(rank_proc *p, int r)
{
    char buf[4096];
    ssize_t n = read(p->fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        if (p->len)
            flush_line(p, r);
        close(p->fd);
        p->fd = -1;
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n' || p->len == sizeof p->line) {
            flush_line(p, r);
            if (buf[i] == '\n')
                continue;
        }
        p->line[p->len++] = buf[i];
    }
    fflush(stdout);
}

/* The step rank r last finished, from its rank file; -1 when unknown. */
static long long rank_step(const char *dir, int r)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/rank.%d", dir, r);
    FILE *f = fopen(path, "r");
    long pid;
    long long step = -1;
    if (f && fscanf(f, "%ld %lld", &pid, &step) != 2)
        step = -1;
    if (f)
        fclose(f);
    return step;
}

static void describe(const rank_proc *p, int r, const char *dir, char *buf, size_t len)
{
    long long step = rank_step(dir, r);
    char at[64] = "before its first step";
    if (step > 0)
        snprintf(at, sizeof at, "after step %lld", step);
    if (WIFSIGNALED(p->status))
        snprintf(buf, len, "rank %d (pid %d) was killed by signal %d (%s) %s", r, (int)p->pid,
                 WTERMSIG(p->status), strsignal(WTERMSIG(p->status)), at);
    else
        snprintf(buf, len, "rank %d (pid %d) exited with status %d %s", r, (int)p->pid,
                 WEXITSTATUS(p->status), at);
}

static int failed(const rank_proc *p)
{
    return !WIFEXITED(p->status) || WEXITSTATUS(p->status) != 0;
}

static void signal_running(rank_proc *ps, int n, int sig)
{
    for (int r = 0; r < n; r++)
        if (!ps[r].done)
            kill(ps[r].pid, sig);
}

/* Forwards output and reaps ranks until all have exited; returns the first failed rank or
 * -1. */
static int supervise(rank_proc *ps, int n, const char *dir)
{
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    int *who = calloc((size_t)n, sizeof *who);
    int first = -1, alive = n, termed = 0, killed = 0;
    double failed_at = 0;
    while (pf && who) {
        int k = 0;
        for (int r = 0; r < n; r++)
            if (ps[r].fd >= 0) {
                pf[k].fd = ps[r].fd;
                pf[k].events = POLLIN;
                pf[k].revents = 0;
                who[k++] = r;
            }
        if (alive == 0 && k == 0)
            break;
        if (k)
            poll(pf, (nfds_t)k, 200);
        else
            nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
        for (int i = 0; i < k; i++)
            if (pf[i].revents)
                drain(&ps[who[i]], who[i]);
        /* Reap every rank that has exited, then blame one: a rank killed by a signal
         * before one that exited with an error, as the others exit with an error after it
         * (its connections close) and may be reaped in the same pass. */
        int blame = -1;
        for (int r = 0; r < n; r++) {
            if (ps[r].done || waitpid(ps[r].pid, &ps[r].status, WNOHANG) != ps[r].pid)
                continue;
            ps[r].done = 1;
            alive--;
            if (failed(&ps[r]) && (blame < 0 || (WIFSIGNALED(ps[r].status) &&
                                                 !WIFSIGNALED(ps[blame].status))))
                blame = r;
        }
        if (blame >= 0 && first < 0) {
            char what[256];
            describe(&ps[blame], blame, dir, what, sizeof what);
            fprintf(stderr, "k3rt launch: %s; stopping the other ranks\n", what);
            first = blame;
            failed_at = now_s();
        }
        if (g_interrupted && first < 0) {
            fprintf(stderr, "k3rt launch: interrupted (signal %d): stopping the ranks\n",
                    (int)g_interrupted);
            signal_running(ps, n, SIGTERM);
            first = n;  /* no rank to blame */
            failed_at = now_s();
        }
        if (first >= 0 && alive > 0) {
            double waited = now_s() - failed_at;
            if (!termed && waited > GRACE_TERM_S) {
                signal_running(ps, n, SIGTERM);
                termed = 1;
            }
            if (!killed && waited > GRACE_KILL_S) {
                signal_running(ps, n, SIGKILL);
                killed = 1;
            }
        }
    }
    free(pf), free(who);
    return first;
}

int cmd_launch(int argc, char **argv)
{
    int n = 0, port = 0, at = 1;
    for (; at < argc; at++) {
        if (!strcmp(argv[at], "-h") || !strcmp(argv[at], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[at], "-n") && at + 1 < argc) {
            n = atoi(argv[++at]);
        } else if (!strcmp(argv[at], "--port") && at + 1 < argc) {
            port = atoi(argv[++at]);
        } else {
            break;
        }
    }
    if (n < 1 || n > 4096 || at >= argc || port < 0 || port > 65535) {
        usage(stderr);
        return 2;
    }
    if (!port && (port = free_port()) < 0) {
        fprintf(stderr, "k3rt launch: no free TCP port on 127.0.0.1 for the rendezvous\n");
        return 1;
    }
    const char *tmp = getenv("TMPDIR");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/k3rt_launch_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "k3rt launch: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    /* argv of each rank: k3rt train ARGS... */
    char **args = calloc((size_t)(argc - at + 3), sizeof *args);
    rank_proc *ps = calloc((size_t)n, sizeof *ps);
    if (!args || !ps) {
        free(args), free(ps);
        fprintf(stderr, "k3rt launch: out of memory\n");
        return 1;
    }
    args[0] = "k3rt";
    args[1] = "train";
    for (int i = at; i < argc; i++)
        args[2 + i - at] = argv[i];
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    fflush(stdout);
    int started = 0;
    for (; started < n; started++) {
        int fds[2];
        if (pipe(fds))
            break;
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            for (int q = 0; q < started; q++)
                close(ps[q].fd);
            exec_rank(started, n, port, dir, fds[1], args);
        }
        close(fds[1]);
        if (pid < 0) {
            close(fds[0]);
            break;
        }
        fcntl(fds[0], F_SETFD, FD_CLOEXEC);
        ps[started].pid = pid;
        ps[started].fd = fds[0];
    }
    if (started < n) {
        fprintf(stderr, "k3rt launch: could start only %d of %d ranks: %s\n", started, n,
                strerror(errno));
        signal_running(ps, started, SIGKILL);
    }
    int first = supervise(ps, started, dir);
    int bad = 0;
    for (int r = 0; r < started; r++)
        bad += failed(&ps[r]);
    if (bad && first >= 0 && first < n)
        fprintf(stderr, "k3rt launch: %d of %d ranks failed; the first was rank %d\n", bad, n,
                first);
    k3rt_error ignored = {0};
    fs_remove_tree(dir, &ignored);
    free(args);
    free(ps);
    return bad || started < n || first >= 0 ? 1 : 0;
}

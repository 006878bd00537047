/* The recipe sandbox's limits (issue 15, item 3): a clock independent of the instruction hook,
 * C functions that could loop in one call metered, xpcall's handler inside the budget, the
 * memory cap over the recipe's conversion to JSON, and no plugin file loaded from on_step.
 * Each case would hang (or take gigabytes) without its limit; every case runs under a few
 * seconds when the limit works. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "recipe/recipe.h"
#include "recipe/sandbox.h"
#include "testutil/testutil.h"
#include "util/log.h"

#define GOOD_SO K3RT_BINARY_DIR "/fixtures/good_plugin.so"

static registry g_reg;
static void setup(void) { tu_recipe_fixtures(&g_reg); }
static void teardown(void) { registry_free(&g_reg); }

/* A valid recipe of the fixture plugins; %s is Lua code run first, %s more top-level keys. */
static const char *RECIPE =
    "%s\n"
    "return { model = { d_model = 8, vocab = 8, layers = 1,\n"
    "  mixers = { M = k3.fixture_mixer{} }, ffn = k3.fixture_ffn{ experts = 2 },\n"
    "  residual = k3.fixture_residual{} }, optimizer = k3.fixture_opt{ lr = 1 },\n"
    "  data = { path = 'x' }, %s }\n";

/* Loads RECIPE around code; returns the status, the message in err and the seconds taken. */
static int run(const char *code, const char *keys, const recipe_limits *lim, recipe **keep,
               k3rt_error *err, double *seconds)
{
    char text[4096];
    snprintf(text, sizeof text, RECIPE, code, keys);
    recipe *r = NULL;
    double t0 = time_now();
    int rc = recipe_load_string(text, "recipe.lua", &g_reg, NULL, 0, lim, &r, err);
    *seconds = time_now() - t0;
    if (keep)
        *keep = r;
    else
        recipe_free(r);
    return rc;
}

/* The code ends with error(...) of what it computed: the message is the result. */
static void result_is(const char *code, const char *want)
{
    k3rt_error err = {0};
    double s;
    int rc = run(code, "", NULL, NULL, &err, &s);
    ck_assert_msg(rc == K3RT_ERR_INVALID && strstr(err.msg, want), "status %d: %s (want %s)",
                  rc, err.msg, want);
    ck_assert_msg(s < 2, "took %.1f s", s);
}

static void refused(const char *code, const recipe_limits *lim, const char *part)
{
    k3rt_error err = {0};
    double s;
    int rc = run(code, "", lim, NULL, &err, &s);
    ck_assert_msg(rc == K3RT_ERR_LIMIT, "status %d: %s", rc, err.msg);
    ck_assert_msg(strstr(err.msg, part), "expected '%s' in: %s", part, err.msg);
    ck_assert_msg(s < 3, "took %.1f s to refuse", s);
}

START_TEST(xpcall_handler_runs_inside_the_budget)
{
    recipe_limits lim = {0, 1000000, 0};
    /* Lua runs a message handler with hooks off: this looped forever. */
    refused("xpcall(function() while true do end end, function() while true do end end)", &lim,
            "instruction budget");
    result_is("local ok, m = xpcall(function() error('boom', 0) end,\n"
              "                     function(e) return 'handled ' .. e end)\n"
              "error(tostring(ok) .. ' ' .. m, 0)", "false handled boom");
    result_is("local ok, a, b = xpcall(function(x) return x, 2 end, print, 1)\n"
              "error(tostring(ok) .. a .. b, 0)", "true12");
}
END_TEST

START_TEST(string_functions_are_metered)
{
    /* n copies of nothing: Lua looped n times. */
    result_is("local s = string.rep('', math.maxinteger)\n"
              "local t = (''):rep(1 << 62, '')\n"
              "error('done ' .. #s .. #t .. ('ab'):rep(3, ','), 0)", "done 00ab,ab,ab");
    /* Backtracking patterns whose bound is beyond the budget: refused before matching. */
    refused("string.find(string.rep('a', 4000), string.rep('a*', 12) .. 'b')", NULL,
            "string.find");
    refused("for w in ('x'):rep(1000):gmatch('x*x*x*y') do end", NULL, "string.gmatch");
    refused("string.gsub(('a'):rep(3000), '(a*)(a*)(a*)b', '')", NULL, "string.gsub");
    refused("string.find(('a'):rep(2e6), ('a'):rep(1e6) .. 'b', 1, true)", NULL,
            "string.find");
    result_is("error(string.find('hello world', 'o w') .. ('KKKM'):match('^(K+)M$') ..\n"
              "      select(2, ('a b c'):gsub('%s', '')), 0)", "5KKK2");
}
END_TEST

START_TEST(table_functions_are_metered)
{
    /* table.move over 2^53 slots, and table.insert under a __len that says 2^63 - 1. */
    refused("table.move({}, 1, 1 << 53, 1)", NULL, "table.move");
    k3rt_error err = {0};
    double s;
    int rc = run("local t = setmetatable({}, { __len = function() return math.maxinteger end })\n"
                 "table.insert(t, 1, 'x')", "", NULL, NULL, &err, &s);
    ck_assert_msg(rc == K3RT_ERR_INVALID && strstr(err.msg, "plain tables"), "%d: %s", rc,
                  err.msg);
    ck_assert_msg(s < 2, "took %.1f s", s);
    result_is("local t = { 3, 1, 2 }\ntable.sort(t)\ntable.insert(t, 4)\n"
              "table.insert(t, 1, 0)\ntable.remove(t)\n"
              "error(table.concat(table.move(t, 1, 4, 2, {}), ',', 2) .. select('#', "
              "table.unpack(t)), 0)", "0,1,2,34");
}
END_TEST

START_TEST(clock_stops_a_loop_the_budget_would_allow)
{
    recipe_limits lim = {0, (int64_t)1e13, 0.5}; /* ~hours of instructions */
    k3rt_error err = {0};
    double s;
    int rc = run("while true do end", "", &lim, NULL, &err, &s);
    ck_assert_msg(rc == K3RT_ERR_LIMIT, "status %d: %s", rc, err.msg);
    ck_assert_msg(strstr(err.msg, "recipe.lua:1: recipe exceeded its time limit of 0.5 s"),
                  "%s", err.msg);
    ck_assert_msg(s >= 0.45 && s < 3, "stopped after %.2f s", s);
}
END_TEST

static int spin(lua_State *L)
{
    (void)L;
    volatile int forever = 1;
    while (forever) {
    }
    return 0;
}

/* A C call the hook never sees: the watchdog ends the process, with a message and status 1. */
START_TEST(watchdog_ends_a_call_the_sandbox_cannot_interrupt)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    double t0 = time_now();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        recipe_limits lim = {0, 0, 0.3};
        sandbox sb;
        k3rt_error err = {0};
        if (sandbox_open(&sb, &lim, "stuck.lua", &err) == K3RT_OK)
            sandbox_run(&sb, spin, NULL, &err);
        _exit(0);
    }
    close(fds[1]);
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0 && time_now() - t0 < 20)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    double s = time_now() - t0;
    if (s >= 20) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    char msg[1024] = "";
    ssize_t n = read(fds[0], msg, sizeof msg - 1);
    msg[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    ck_assert_msg(s < 5, "the stuck call ran %.1f s", s);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %d", status);
    ck_assert_msg(strstr(msg, "stuck.lua: recipe code ran 2 s past its time limit of 0.3 s"),
                  "%s", msg);
}
END_TEST

START_TEST(memory_cap_covers_the_conversion_to_json)
{
    /* 1 MiB shared by 2000 keys: 1 MiB of Lua, 2 GB of JSON. */
    k3rt_error err = {0};
    double s;
    int rc = run("local s = string.rep('x', 1 << 20)\nlocal t = {}\n"
                 "for i = 1, 2000 do t[i] = s end", "junk = t", NULL, NULL, &err, &s);
    ck_assert_msg(rc == K3RT_ERR_LIMIT && strstr(err.msg, "memory limit while being converted"),
                  "%d: %s", rc, err.msg);
    rc = run("local a = {}\nfor i = 1, 25 do a = { a, a } end", "junk = a", NULL, NULL,
                 &err, &s);
    ck_assert_msg(rc == K3RT_ERR_LIMIT && strstr(err.msg, "junk"), "%d: %s", rc, err.msg);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    ck_assert_msg(ru.ru_maxrss < 512 * 1024, "peak RSS %ld KiB", ru.ru_maxrss);
}
END_TEST

START_TEST(on_step_cannot_load_a_plugin_file)
{
    char code[1024];
    recipe *r = NULL;
    k3rt_error err = {0};
    double s;
    snprintf(code, sizeof code, "local path = '%s'", GOOD_SO);
    int rc = run(code, "on_step = function(step)\n"
                       "  return { balancer = k3.plugin(path, {}) } end", NULL, &r, &err, &s);
    TU_OK(rc, err);
    int before = g_reg.n;
    json_t *ch = NULL;
    rc = recipe_on_step(r, 3, NULL, &ch, &err);
    ck_assert_msg(rc != K3RT_OK && strstr(err.msg, "never from on_step"), "%d: %s", rc, err.msg);
    ck_assert_ptr_null(ch);
    ck_assert_int_eq(g_reg.n, before);
    recipe_free(r);
    /* A file the recipe loaded while it loaded: on_step may switch to it. */
    snprintf(code, sizeof code, "local path = '%s'\nlocal b = k3.plugin(path, {})", GOOD_SO);
    TU_OK(run(code, "on_step = function(step)\n"
                    "  return { balancer = k3.plugin(path, {}) } end", NULL, &r, &err, &s), err);
    TU_OK(recipe_on_step(r, 3, NULL, &ch, &err), err);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(ch, "balancer"),
                                                       "plugin")), "fake");
    json_decref(ch);
    recipe_free(r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sandbox");
    TCase *tc = tcase_create("sandbox");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, xpcall_handler_runs_inside_the_budget);
    tcase_add_test(tc, string_functions_are_metered);
    tcase_add_test(tc, table_functions_are_metered);
    tcase_add_test(tc, clock_stops_a_loop_the_budget_would_allow);
    tcase_add_test(tc, watchdog_ends_a_call_the_sandbox_cannot_interrupt);
    tcase_add_test(tc, memory_cap_covers_the_conversion_to_json);
    tcase_add_test(tc, on_step_cannot_load_a_plugin_file);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}

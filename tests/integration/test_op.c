/* `k3rt op` on the attention plugins: inputs and outputs as DESIGN.md specifies, and a
 * round trip — the parameters it writes, fed back in, reproduce its outputs bit for bit. */
#include <math.h>
#include <string.h>

#include "testutil/testutil.h"
#include "train/safetensors.h"

enum { B = 2, T = 9, D = 16 };

static void write_inputs(const char *path, const st_entry *extra, int n_extra, int with_state,
                         int64_t state_numel, const int64_t *state_shape)
{
    static double x[B * T * D], dy[B * T * D], s_in[4096], ds_out[4096];
    tu_randn(x, B * T * D, 1.0, 11);
    tu_randn(dy, B * T * D, 1.0, 12);
    tu_randn(s_in, state_numel, 0.3, 13);
    tu_randn(ds_out, state_numel, 1.0, 14);
    st_entry e[64];
    int n = 0;
    e[n++] = (st_entry){"x", K3RT_F64, 3, {B, T, D, 0}, x};
    e[n++] = (st_entry){"dy", K3RT_F64, 3, {B, T, D, 0}, dy};
    if (with_state) {
        e[n] = (st_entry){"state_in.state", K3RT_F64, 4, {0}, s_in};
        memcpy(e[n].shape, state_shape, 4 * sizeof(int64_t));
        n++;
        e[n] = (st_entry){"d_state_out.state", K3RT_F64, 4, {0}, ds_out};
        memcpy(e[n].shape, state_shape, 4 * sizeof(int64_t));
        n++;
    }
    for (int i = 0; i < n_extra; i++)
        e[n++] = extra[i];
    k3rt_error err = {0};
    TU_OK(st_write(path, e, n, NULL, &err), err);
}

static void run_op(const char *plugin, const char *config, const char *in, const char *out)
{
    char cmd[4096], *log = NULL;
    snprintf(cmd, sizeof cmd, "%s op %s --config '%s' --in %s --out %s --seed 5", tu_k3rt_bin(),
             plugin, config, in, out);
    int rc = tu_run(cmd, &log);
    ck_assert_msg(rc == 0, "k3rt op failed (%d): %s\n%s", rc, cmd, log);
    free(log);
}

static int64_t numel(const st_entry *e)
{
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++)
        n *= e->shape[i];
    return n;
}

/* Every tensor of a must be in b with the same bits. */
static void expect_same(const st_file *a, const st_file *b)
{
    for (int i = 0; i < st_count(a); i++) {
        const st_entry *ea = st_at(a, i), *eb = st_find(b, ea->name);
        ck_assert_msg(eb != NULL, "second run lacks %s", ea->name);
        ck_assert_int_eq(ea->dtype, eb->dtype);
        ck_assert_msg(memcmp(ea->data, eb->data, (size_t)numel(ea) * k3rt_dtype_size(ea->dtype)) == 0,
                      "%s differs between the runs", ea->name);
    }
}

static void round_trip(const char *plugin, const char *config, int with_state,
                       int64_t state_numel, const int64_t *state_shape)
{
    char dir[512], in[1024], out[1024], in2[1024], out2[1024];
    tu_tmpdir(dir, sizeof dir);
    snprintf(in, sizeof in, "%s/in.safetensors", dir);
    snprintf(out, sizeof out, "%s/out.safetensors", dir);
    snprintf(in2, sizeof in2, "%s/in2.safetensors", dir);
    snprintf(out2, sizeof out2, "%s/out2.safetensors", dir);
    write_inputs(in, NULL, 0, with_state, state_numel, state_shape);
    run_op(plugin, config, in, out);
    st_file *f;
    k3rt_error err = {0};
    TU_OK(st_open(out, &f, &err), err);
    const st_entry *y = st_find(f, "y"), *gx = st_find(f, "grad.x");
    ck_assert_msg(y && gx, "outputs y and grad.x missing");
    ck_assert_int_eq(y->dtype, K3RT_F64);
    ck_assert_int_eq(y->shape[2], D);
    double energy = 0;
    for (int64_t i = 0; i < numel(gx); i++)
        energy += ((const double *)gx->data)[i] * ((const double *)gx->data)[i];
    ck_assert_double_gt(energy, 0);
    if (with_state) {
        ck_assert_ptr_nonnull(st_find(f, "state_out.state"));
        ck_assert_ptr_nonnull(st_find(f, "grad.state_in.state"));
    }
    /* Every parameter is written, and has its gradient. */
    st_entry params[64];
    int np = 0;
    for (int i = 0; i < st_count(f); i++) {
        const st_entry *e = st_at(f, i);
        char gname[300];
        if (!strncmp(e->name, "grad.", 5) || !strcmp(e->name, "y") ||
            !strncmp(e->name, "state_out.", 10) || !strncmp(e->name, "stats.", 6))
            continue;
        snprintf(gname, sizeof gname, "grad.%s", e->name);
        ck_assert_msg(st_find(f, gname) != NULL, "no %s", gname);
        ck_assert_int_lt(np, 64);
        params[np++] = *e;
    }
    ck_assert_int_gt(np, 3);
    /* Feed the parameters back: the same outputs, bit for bit. */
    write_inputs(in2, params, np, with_state, state_numel, state_shape);
    run_op(plugin, config, in2, out2);
    st_file *g;
    TU_OK(st_open(out2, &g, &err), err);
    expect_same(f, g);
    st_close(g);
    st_close(f);
}

START_TEST(mla_round_trip)
{
    round_trip("mla", "{\"heads\": 2, \"kv_rank\": 8, \"qk_nope_dim\": 4, \"qk_shared_dim\": 2, "
                      "\"v_dim\": 4}", 0, 0, NULL);
}
END_TEST

START_TEST(kda_round_trip_with_state)
{
    /* heads 2, head_dim 4: state [B, HV, dk, dv] */
    int64_t shape[4] = {B, 2, 4, 4};
    round_trip("kda", "{\"heads\": 2, \"head_dim\": 4, \"chunk_size\": 4}", 1, B * 2 * 4 * 4,
               shape);
}
END_TEST

/* A tensor the plugin does not take is refused, naming the nearest input (a misspelt
 * parameter once fell back to the random init and exited 0); --help states the file contract. */
START_TEST(unknown_input_refused)
{
    char dir[512], in[1024], out[1024], cmd[4096], *log = NULL;
    tu_tmpdir(dir, sizeof dir);
    snprintf(in, sizeof in, "%s/in.safetensors", dir);
    snprintf(out, sizeof out, "%s/out.safetensors", dir);
    static double w[4 * 16];
    st_entry extra[1] = {{"q_nope_prj.weight", K3RT_F64, 2, {4, 16, 0, 0}, w}};
    write_inputs(in, extra, 1, 0, 0, NULL);
    snprintf(cmd, sizeof cmd, "%s op mla --config '{\"heads\": 2, \"kv_rank\": 8, "
             "\"qk_nope_dim\": 2, \"qk_shared_dim\": 2, \"v_dim\": 4}' --in %s --out %s",
             tu_k3rt_bin(), in, out);
    int rc = tu_run(cmd, &log);
    ck_assert_msg(rc != 0, "a misspelt parameter was accepted:\n%s", log);
    ck_assert_msg(strstr(log, "tensor 'q_nope_prj.weight' is not an input of") &&
                  strstr(log, "did you mean 'q_nope_proj.weight'?"), "%s", log);
    free(log);
    snprintf(cmd, sizeof cmd, "%s op --help", tu_k3rt_bin());
    rc = tu_run(cmd, &log);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(strstr(log, "every other name is refused") && strstr(log, "d_state_out.state"),
                  "%s", log);
    free(log);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("op");
    TCase *tc = tcase_create("op");
    tcase_add_test(tc, unknown_input_refused);
    tcase_add_test(tc, mla_round_trip);
    tcase_add_test(tc, kda_round_trip_with_state);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}

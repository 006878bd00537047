/* Plugin loader: every refusal names the file and the reason; good plugins load. */
#include <stddef.h>
#include <string.h>

#include <jansson.h>

#include "plugin/registry.h"
#include "testutil/testutil.h"

#define FIXTURES K3RT_BINARY_DIR "/fixtures/"

static int load(const char *file, const plugin_entry **e, k3rt_error *err)
{
    static registry reg;
    static int ready;
    if (!ready) {
        k3rt_error init = {0};
        ck_assert_int_eq(registry_init(&reg, NULL, &init), K3RT_OK);
        ready = 1;
    }
    return registry_load_file(&reg, file, e, err);
}

static void expect_refusal(const char *file, int code, const char *needle)
{
    const plugin_entry *e = NULL;
    k3rt_error err = {0};
    int rc = load(file, &e, &err);
    ck_assert_msg(rc == code, "%s: expected status %d, got %d (%s)", file, code, rc, err.msg);
    ck_assert_msg(strstr(err.msg, file) != NULL, "message does not name the file: %s", err.msg);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "message lacks '%s': %s", needle, err.msg);
    ck_assert_msg(strchr(err.msg, '\n') == NULL, "message is not one line: %s", err.msg);
}

START_TEST(good_plugin_loads)
{
    const plugin_entry *e = NULL;
    k3rt_error err = {0};
    TU_OK(load(FIXTURES "good_plugin.so", &e, &err), err);
    ck_assert_str_eq(e->desc.name, "fake");
    ck_assert_int_eq(e->desc.kind, K3RT_KIND_BALANCER);
    ck_assert_ptr_nonnull(e->vt.balancer.bias);
    /* Fields the plugin did not provide read as NULL. */
    ck_assert_ptr_null(e->vt.balancer.aux_loss);
}
END_TEST

/* A plugin built against an older minor: its instance and attention vtables end before the
 * fields the newer header added, and its option entries before `help`. The fixture fills the
 * fields past its struct sizes with poison functions: the host must read none of them. */
START_TEST(older_minor_loads_with_missing_fields_null)
{
    const plugin_entry *e = NULL;
    k3rt_error err = {0};
    TU_OK(load(FIXTURES "shift_old_minor.so", &e, &err), err);
    ck_assert_str_eq(e->desc.name, "shift");
    ck_assert_int_eq(e->inst.struct_size, offsetof(k3rt_instance_vtable, state));
    ck_assert_ptr_nonnull(e->inst.memory);  /* the last field it has */
    ck_assert_ptr_null(e->inst.state);
    ck_assert_ptr_null(e->inst.state_loaded);
    ck_assert_ptr_null(e->inst.stats);
    ck_assert_ptr_null(e->inst.reset_stats);
    ck_assert_ptr_nonnull(e->vt.attention.backward);
    ck_assert_ptr_null(e->vt.attention.state_layout);
    ck_assert_ptr_null(e->vt.attention.decode);
    ck_assert_ptr_null(e->vt.attention.decode_step);  /* ABI 2.2 */
    ck_assert_int_eq(e->desc.abi_minor, 0);
    /* Its options are read with its own stride; a message about its required option cannot
     * quote a help text it does not have (reading one would run past the table). */
    ck_assert_uint_lt(e->desc.option_size, sizeof(k3rt_option));
    json_t *cfg = json_object();
    ck_assert_int_eq(options_apply(e->desc.options, e->desc.n_options, e->desc.option_size,
                                        cfg, "mixer", &err), K3RT_ERR_INVALID);
    ck_assert_str_eq(err.msg, "mixer: missing required key 'init_std' (a number)");
    json_object_set_new(cfg, "init_std", json_real(0.5));
    TU_OK(options_apply(e->desc.options, e->desc.n_options, e->desc.option_size, cfg,
                             "mixer", &err), err);
    json_decref(cfg);
}
END_TEST

START_TEST(refusals_name_file_and_reason)
{
    expect_refusal(FIXTURES "no_entry.so", K3RT_ERR_ABI, "does not export k3rt_plugin_entry");
    /* both versions are named, the plugin's and the host's, and the fix */
    char want[240];
    snprintf(want, sizeof want, "abi1_plugin.so: built for plugin ABI 1.%d, but this k3rt "
             "speaks ABI %d.%d: rebuild it against this k3rt's SDK (docs/plugins.md, \"Moving "
             "a plugin from ABI 1 to 2\")", K3RT_ABI_MINOR, K3RT_ABI_MAJOR, K3RT_ABI_MINOR);
    expect_refusal(FIXTURES "abi1_plugin.so", K3RT_ERR_ABI, want);
    snprintf(want, sizeof want, "built for plugin ABI %d.%d, newer than this k3rt's ABI %d.%d: "
             "upgrade k3rt, or rebuild the plugin against this SDK", K3RT_ABI_MAJOR + 1,
             K3RT_ABI_MINOR, K3RT_ABI_MAJOR, K3RT_ABI_MINOR);
    expect_refusal(FIXTURES "wrong_major.so", K3RT_ERR_ABI, want);
    snprintf(want, sizeof want, "built for plugin ABI %d.%d, newer than this k3rt's ABI %d.%d",
             K3RT_ABI_MAJOR, K3RT_ABI_MINOR + 1, K3RT_ABI_MAJOR, K3RT_ABI_MINOR);
    expect_refusal(FIXTURES "newer_minor.so", K3RT_ERR_ABI, want);
    expect_refusal(FIXTURES "unknown_kind.so", K3RT_ERR_ABI, "unknown plugin kind 42");
    expect_refusal(FIXTURES "not_a_library.so", K3RT_ERR_FORMAT, "not a shared object");
    expect_refusal(FIXTURES "does_not_exist.so", K3RT_ERR_NOT_FOUND, "does not exist");
}
END_TEST

START_TEST(builtin_none_and_unknown_names)
{
    registry reg;
    k3rt_error err = {0};
    TU_OK(registry_init(&reg, NULL, &err), err);
    const plugin_entry *none = registry_find(&reg, "none", K3RT_KIND_BALANCER);
    ck_assert_ptr_nonnull(none);
    ck_assert_str_eq(none->path, "(built-in)");
    ck_assert_int_eq(registry_not_found(&reg, "nne", K3RT_KIND_BALANCER, "model.balancer", &err),
                     K3RT_ERR_NOT_FOUND);
    ck_assert_msg(strstr(err.msg, "did you mean 'none'") != NULL, "%s", err.msg);
    registry_free(&reg);
}
END_TEST

START_TEST(plugins_command_lists_and_reports_failures)
{
    /* The search path picks up files named libk3rt_*.so. */
    char dir[512], *out = NULL, cmd[4096];
    tu_tmpdir(dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "cp %sgood_plugin.so %s/libk3rt_fake.so && cp %swrong_major.so "
             "%s/libk3rt_wrong_major.so && cp %snot_a_library.so %s/libk3rt_not_a_library.so",
             FIXTURES, dir, FIXTURES, dir, FIXTURES, dir);
    ck_assert_int_eq(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "K3RT_PLUGIN_PATH=%s %s plugins", dir, tu_k3rt_bin());
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 1, "broken plugins on the path must make `k3rt plugins` fail: %d\n%s",
                  rc, out);
    ck_assert_msg(strstr(out, "fake") && strstr(out, "balancer"), "%s", out);
    ck_assert_msg(strstr(out, "wrong_major.so") && strstr(out, "not_a_library.so"), "%s", out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("loader");
    tcase_add_test(tc, good_plugin_loads);
    tcase_add_test(tc, older_minor_loads_with_missing_fields_null);
    tcase_add_test(tc, refusals_name_file_and_reason);
    tcase_add_test(tc, builtin_none_and_unknown_names);
    tcase_add_test(tc, plugins_command_lists_and_reports_failures);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}

/* The checkpoint manifest reader on arbitrary bytes: ckpt_read_manifest (format, step, recipe
 * hash, folder name and DONE marker), then what the manifest names (config through the recipe
 * schema, balancer, mid-run changes; the option-only fixture plugins stand in for real ones)
 * and the tensor checks against two small fixed safetensors files. */
#include <stdio.h>
#include <string.h>

#include "fuzz.h"
#include "plugin/registry.h"
#include "train/ckpt_dir.h"
#include "train/ckpt_manifest.h"
#include "train/ckpt_verify.h"
#include "train/safetensors.h"
#include "util/fs.h"

static registry g_reg;
static char g_dir[256];

static void init(void)
{
    fuzz_fixture_registry(&g_reg);
    k3rt_error err = {0};
    snprintf(g_dir, sizeof g_dir, "%s/step_00000002", fuzz_dir());
    fs_mkdirs(g_dir, &err);
    char path[512];
    fuzz_write(fs_join(path, sizeof path, g_dir, "DONE"), (const uint8_t *)"step 2\n", 7);
    float w[4] = {0.5f, -1, 2, 0};
    st_entry e = {"embed.weight", K3RT_F32, 2, {2, 2, 0, 0}, w};
    st_write(fs_join(path, sizeof path, g_dir, "model.safetensors"), &e, 1, NULL, &err);
    float v[4] = {0.5f, 1, 2, 0}; /* a second moment: >= 0 */
    e.name = "optimizer.embed.weight.v";
    e.data = v;
    st_write(fs_join(path, sizeof path, g_dir, "state.safetensors"), &e, 1, NULL, &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_dir[0])
        init();
    char path[512];
    fuzz_write(fs_join(path, sizeof path, g_dir, "manifest.json"), data, size);
    json_t *m = NULL;
    k3rt_error err = {0};
    int rc = ckpt_read_manifest(g_dir, &m, &err);
    if (!rc)
        rc = ckpt_check_manifest(m, &g_reg, g_dir, &err);
    if (!rc)
        rc = ckpt_verify(g_dir, m, &err);
    json_decref(m);
    fuzz_note(rc, err.msg);
    return 0;
}

/* The recipe loader on arbitrary text: the sandbox (tight limits: 16 MiB, 10^6 instructions,
 * 2 s), the conversion to JSON and the schema, with the option-only fixture plugins as the
 * plugins a recipe can name; then on_step once when the recipe defines it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

static registry g_reg;
static int g_ready;

static void init(void)
{
    fuzz_fixture_registry(&g_reg);
    g_ready = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_ready)
        init();
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    recipe_limits lim = {16u << 20, 1000000, 2.0};
    recipe *r = NULL;
    k3rt_error err = {0};
    int rc = recipe_load_string(text, "fuzz.lua", &g_reg, NULL, 0, &lim, &r, &err);
    if (!rc) {
        json_t *metrics = json_pack("{s:f, s:s}", "loss", 1.5, "tag", "x"), *ch = NULL;
        rc = recipe_on_step(r, 3, metrics, &ch, &err);
        json_decref(ch);
        json_decref(metrics);
        recipe_free(r);
    }
    fuzz_note(rc, err.msg);
    free(text);
    return 0;
}

/* The token-shard reader (data_load_shard) on arbitrary bytes, and the checks run on what it
 * returns: a clear refusal or tokens that are all in range. */
#include "fuzz.h"
#include "train/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    token_stream s;
    k3rt_error err = {0};
    if (data_load_shard(fuzz_file(data, size), &s, &err) != K3RT_OK)
        return 0;
    for (int64_t i = 0; i < s.n; i++)
        if (s.tokens[i] < 0 || s.tokens[i] > s.max_token)
            __builtin_trap();
    data_check_val(&s, "shard", &err);
    int32_t in[8], tg[8];
    if (s.n >= 6)
        data_batch(&s, 1, 0, 2, 4, in, tg, &err);
    token_stream_free(&s);
    return 0;
}

/* The sample check of the main job: the fraction of a text's words found in the corpus. */
#include <math.h>
#include <string.h>

#include "testutil/testutil.h"
#include "train/train_internal.h"

START_TEST(word_coverage_counts_whitespace_words)
{
    const char *corpus = "To be, or not to be:\nthat is the question.";
    double f;
    int64_t words;
    k3rt_error err = {0};
    TU_OK(sample_word_coverage(corpus, (int64_t)strlen(corpus), "to be, or nott\n\n that",
                               &f, &words, &err), err);
    ck_assert_int_eq(words, 5);              /* to, be, or, nott, that */
    ck_assert_double_eq_tol(f, 4.0 / 5.0, 1e-12); /* only "nott" is absent */
    TU_OK(sample_word_coverage(corpus, (int64_t)strlen(corpus), "   ", &f, &words, &err), err);
    ck_assert_int_eq(words, 0);
    ck_assert_double_eq(f, 0.0);
}
END_TEST

/* Frequencies of sample_draw against softmax(logits / T) over many draws. */
START_TEST(draws_follow_the_softmax)
{
    const double logits[4] = {0.5, 2.0, -1.0, 1.0};
    const double temps[2] = {1.0, 0.5};
    for (int t = 0; t < 2; t++) {
        double p[4], z = 0;
        for (int v = 0; v < 4; v++)
            z += p[v] = exp(logits[v] / temps[t]);
        int counts[4] = {0};
        k3rt_rng rng;
        k3rt_rng_seed(&rng, 9, (uint64_t)t);
        const int n = 200000;
        for (int i = 0; i < n; i++) {
            double work[4];
            memcpy(work, logits, sizeof work);
            counts[sample_draw(work, 4, temps[t], 0, &rng)]++;
        }
        for (int v = 0; v < 4; v++)
            ck_assert_msg(fabs((double)counts[v] / n - p[v] / z) < 0.005,
                          "T=%g token %d: frequency %g, softmax %g", temps[t], v,
                          (double)counts[v] / n, p[v] / z);
    }
    double work[4] = {0.5, 2.0, -1.0, 1.0};
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 1, 1);
    ck_assert_int_eq(sample_draw(work, 4, 0.0, 0, &rng), 1);  /* greedy */
    for (int i = 0; i < 100; i++) {  /* top-2 never draws tokens 0 or 2 */
        double w2[4] = {0.5, 2.0, -1.0, 1.0};
        int32_t d = sample_draw(w2, 4, 1.0, 2, &rng);
        ck_assert(d == 1 || d == 3);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sample");
    TCase *tc = tcase_create("sample");
    tcase_add_test(tc, word_coverage_counts_whitespace_words);
    tcase_add_test(tc, draws_follow_the_softmax);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}

/* The sample check of the main job: the fraction of a text's words found in the corpus. */
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

int main(void)
{
    Suite *s = suite_create("sample");
    TCase *tc = tcase_create("sample");
    tcase_add_test(tc, word_coverage_counts_whitespace_words);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}

/*
 * The one Check runner. Every suite runs in fork mode with the timeouts its
 * test cases set; CK_RUN_SUITE=name runs a single suite (Check's own).
 */
#include <check.h>
#include <stdlib.h>

#define SUITE(x) Suite *make_##x##_suite(void);
#include "tests/suites.def"
#undef SUITE

int main(void)
{
    SRunner *sr = srunner_create(NULL);
#define SUITE(x) srunner_add_suite(sr, make_##x##_suite());
#include "tests/suites.def"
#undef SUITE
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* Prints the job-spec key table as Markdown (make docs). */
#include "common/jobspec.h"

int main(void)
{
    job_spec_print_doc(stdout);
    return 0;
}

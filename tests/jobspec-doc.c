/* Prints docs/jobspec.md from the job-spec key table (make docs). */
#include "common/jobspec.h"

int main(void)
{
    fputs("# Job spec keys\n\n"
          "A job is one JSON object, read by `musterd --job FILE` and by\n"
          "`muster-train --standalone --job FILE`. musterd hands it to every rank\n"
          "inside ASSIGN. Unknown keys and bad values are refused at start with the\n"
          "file, the key and what was expected, e.g.\n"
          "`job.json: nodes: expected an integer in [1, 4096], got 0`.\n\n"
          "Minimal job: `{\"name\": \"demo\", \"nodes\": 2, \"max_restarts\": 3}`.\n\n"
          "This page is generated from the table in `common/jobspec.c` by `make docs`;\n"
          "`make check` fails when it is out of date.\n\n",
          stdout);
    job_spec_print_doc(stdout);
    return 0;
}

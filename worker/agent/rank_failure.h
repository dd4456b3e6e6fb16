/*
 * rank_failure: what a failed rank said about its failure, for status,
 * events and the dashboard. Its error file first: the JSON that PyTorch's
 * torch.distributed.elastic `@record` writes to TORCHELASTIC_ERROR_FILE
 * ({"message": {"message": "RuntimeError: ...", "extraInfo": {"py_callstack":
 * "Traceback ..."}}}); else the tail of its stderr (a Python traceback ends
 * with the exception's line; other programs' last line is usually their
 * error). The reason is one line, with the innermost source location found
 * in the traceback, e.g. "ValueError: bad shape (train.py:120)"; the detail
 * is the traceback or stderr tail. Pure apart from reading the file.
 */
#ifndef MUSTER_WORKER_RANK_FAILURE_H
#define MUSTER_WORKER_RANK_FAILURE_H

#include <stddef.h>

/* Error files larger than this are not read (the stderr tail is used). */
#define RANK_ERROR_FILE_MAX (1024 * 1024)

/*
 * Fills reason and detail (both "" when the rank left nothing) from
 * error_file (NULL, or a path that may not exist) and stderr_tail (NULL or
 * whole lines). When the error file exists but cannot be used (too large,
 * not JSON, no message), *why_not says so and stderr is used instead;
 * otherwise why_not is "". Output is valid UTF-8, truncated to fit.
 */
void rank_failure_explain(const char *error_file, const char *stderr_tail, char *reason, size_t reason_cap,
                          char *detail, size_t detail_cap, char *why_not, size_t why_cap);

#endif

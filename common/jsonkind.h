#ifndef MUSTER_COMMON_JSONKIND_H
#define MUSTER_COMMON_JSONKIND_H
/* The name of a JSON value's type for error messages ("a string", "an
 * integer", ...): below both common/cmdline.c and common/conf.c, which
 * each name what they got. */
#include <jansson.h>

const char *json_kind_name(const json_t *v);

#endif

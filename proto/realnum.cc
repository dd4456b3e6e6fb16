/* proto/realnum.cc: JSON reals read with fast_float (see realnum.h). Built
 * without exceptions or RTTI: it needs nothing of the C++ runtime, so the C
 * programs that link it stay linked as C. */
#include <fast_float/fast_float.h>

#include <cmath>
#include <system_error>

#include "proto/realnum.h"

int proto_read_real(const char *s, size_t n, double *out)
{
    double v = 0;
    const fast_float::from_chars_result r = fast_float::from_chars(s, s + n, v);
    /* Newer fast_float versions flag a value out of range, older ones only
     * give the infinity: either way, an infinity is refused and a value
     * that underflowed is taken, as strtod rounds it. */
    if (r.ptr != s + n || (r.ec != std::errc() && r.ec != std::errc::result_out_of_range) || !std::isfinite(v))
        return 0;
    *out = v;
    return 1;
}

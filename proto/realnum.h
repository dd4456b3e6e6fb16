/*
 * proto/realnum: the text of a JSON real to the nearest double, as strtod
 * reads it (correctly rounded) but without its slow path: musterd reads
 * three measured figures per rank in every heartbeat, doubles written with
 * all 17 digits, and glibc's strtod spent about 100 ns on each (a sixth of
 * the daemon's steady-state CPU at 4096 agents x 8 ranks). The reading is
 * fast_float's (Debian libfast-float-dev, header only: Eisel-Lemire with an
 * exact fallback), built into proto/realnum.cc, the one C++ file here.
 * Internal to proto/ (fastbeat.c).
 */
#ifndef MUSTER_PROTO_REALNUM_H
#define MUSTER_PROTO_REALNUM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The n bytes at s, a number by JSON's grammar (the caller has checked it:
 * this reads, it does not validate), into *out. Answers 1, or 0 when the
 * text is not a number as a whole or lies beyond the largest double
 * (strtod's HUGE_VAL); a value below the smallest reads as the nearest
 * subnormal or zero, as strtod gives it. */
int proto_read_real(const char *s, size_t n, double *out);

#ifdef __cplusplus
}
#endif

#endif

/*
 * blas_core: OpenBLAS's choice of kernels, corrected in place.
 *
 * OpenBLAS 0.3.21 does not know recent Xeons and falls back to its generic
 * SSE3 kernels ("Prescott"), several times slower. It reads
 * OPENBLAS_CORETYPE when it loads, before main; a DYNAMIC_ARCH OpenBLAS
 * (Debian's, every distribution's) also exports the pair that does that
 * choice, gotoblas_dynamic_quit/gotoblas_dynamic_init. So the choice is
 * made again in this process, before any BLAS call: no re-execution.
 */
#ifndef MUSTER_BLAS_CORE_H
#define MUSTER_BLAS_CORE_H

/* When OpenBLAS runs its Prescott kernels on a CPU with AVX2 and the user
 * set no OPENBLAS_CORETYPE: chooses SkylakeX (AVX-512) or Haswell (AVX2)
 * kernels, and returns OpenBLAS's name for them. NULL when nothing was
 * changed (the choice was right, the user's, or cannot be redone: an
 * OpenBLAS built for one CPU). Call before any BLAS call, from one thread. */
const char *blas_core_fix(void);

#endif

/*
 * rng: counter-based randomness. Every random number in training is a pure
 * function of (seed, a few integers), never of how many numbers were drawn
 * before, so that initialisation, batch sampling and generation can be
 * reproduced from the seed and the step alone (resume, sharding).
 */
#ifndef MUSTER_TRAIN_RNG_H
#define MUSTER_TRAIN_RNG_H

#include <math.h>
#include <stdint.h>

/* SplitMix64's finaliser: a bijective 64-bit mix. */
static inline uint64_t rng_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Hash of a seed and up to four counters. */
static inline uint64_t rng_hash(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    uint64_t h = rng_mix(seed);
    h = rng_mix(h ^ a);
    h = rng_mix(h ^ b);
    h = rng_mix(h ^ c);
    return rng_mix(h ^ d);
}

/* Uniform in (0, 1), 53 bits. */
static inline double rng_uniform(uint64_t h)
{
    return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Standard normal from one hash (Box-Muller on two derived uniforms). */
static inline double rng_normal(uint64_t h)
{
    double u1 = rng_uniform(rng_mix(h ^ 0x1)), u2 = rng_uniform(rng_mix(h ^ 0x2));
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif

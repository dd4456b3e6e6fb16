/*
 * cuemu's cuda_bf16.h: __nv_bfloat16 and the conversions worker/train/gpu/ uses.
 * float -> bf16 rounds to nearest even and keeps NaN a NaN, as the device
 * conversion does.
 */
#ifndef CUEMU_CUDA_BF16_H
#define CUEMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

typedef struct __nv_bfloat16 {
    uint16_t x;
} __nv_bfloat16;

static inline __nv_bfloat16 __float2bfloat16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        h.x = (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
        return h;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    h.x = (uint16_t)(u >> 16);
    return h;
}

static inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

#endif

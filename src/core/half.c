/* IEEE binary16 conversion (bf16 is inline in core.h). */
#include "core.h"

og_f16 og_f16_from_f32(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t mag = x & 0x7fffffffu;
    if (mag > 0x7f800000u) return (og_f16)(sign | 0x7e00u);    /* NaN */
    if (mag >= 0x47800000u) return (og_f16)(sign | 0x7c00u);   /* overflow -> inf */
    if (mag < 0x38800000u) {                                    /* subnormal or zero */
        if (mag < 0x33000000u) return (og_f16)sign;             /* below half the smallest */
        uint32_t mant = (mag & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(mag >> 23); /* value = mant * 2^-24 >> shift */
        uint32_t r = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (og_f16)(sign | r);
    }
    uint32_t r = ((mag - 0x38000000u) >> 13);
    uint32_t rem = mag & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (og_f16)(sign | r);
}

float og_f32_from_f16(og_f16 h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t mant = (uint32_t)h & 0x3ffu;
    uint32_t x;
    if (exp == 0x1f) {
        x = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else {
            int e = -1;
            do { mant <<= 1; e++; } while (!(mant & 0x400u));
            x = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else {
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* RoPE frequency scaling, as Hugging Face names it in rope_type. Shared by
 * the kernels (which compute it) and the program file (which names it). */
#ifndef OG_CORE_ROPE_TYPE_H
#define OG_CORE_ROPE_TYPE_H

typedef enum og_rope_type {
    OG_ROPE_DEFAULT = 0, /* inv_freq[i] = 1 / theta^(2i/D)                      */
    OG_ROPE_LINEAR = 1,  /* default / factor (positions divided by factor)      */
    OG_ROPE_LLAMA3 = 2,  /* Llama 3.1 smooth low/high frequency interpolation   */
    OG_ROPE_TYPE_COUNT
} og_rope_type;

#endif

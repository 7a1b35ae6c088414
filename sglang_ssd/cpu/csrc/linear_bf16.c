/* linear.c for bf16 weights: ssd_pack_bf16, ssd_linear_portable_bf16, ssd_linear_avx2_bf16.
 * Same tiles, same chain per output element; each weight is widened to fp32 exactly in registers, so
 * a result is bit-identical to the fp32 kernel's on the widened weight, at half the bytes read. */
#define WEIGHT_BF16
#include "linear.c"

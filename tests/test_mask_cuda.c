/* tests/test_mask.c's checks on the CUDA back end: the allowed-token masks
 * of batch items applied on the device (og_mask_logits_cuda inside the
 * decode graphs) give the oracle's tokens, masks that change between steps
 * re-capture no graph, and the masking kernel equals og_logits_mask on odd
 * widths. Skipped (77) without a CUDA build or device. */
#define OG_MASK_TEST_CUDA 1
#include "test_mask.c"

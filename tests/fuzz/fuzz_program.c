/* Fuzzes the program reader: any bytes must either open as a program that
 * passes every rule or be refused with OG_ERR_FORMAT, never crash. */
#include "fuzz.h"
#include "program/program.h"

int og_fuzz_program(const uint8_t *data, size_t size);

int og_fuzz_program(const uint8_t *data, size_t size) {
    og_program *p = NULL;
    if (og_program_open_memory(data, size, &p) == OG_OK) {
        /* touch what a loader reads: every weight's bytes and every operand */
        volatile uint8_t sink = 0;
        for (int32_t i = 0; i < og_program_n_tensors(p); i++) {
            const og_program_tensor *t = og_program_tensor_at(p, i);
            if (t->data && t->nbytes) sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
        }
        for (int32_t i = 0; i < og_program_n_instrs(p); i++) {
            const og_program_instr *ins = og_program_instr_at(p, i);
            for (int32_t k = 0; k < ins->n_in; k++) sink ^= (uint8_t)og_program_operand_name(p, ins->in[k])[0];
        }
        (void)sink;
        og_program_close(p);
    }
    return 0;
}

OG_FUZZ_ENTRY(og_fuzz_program)

/* offgraph: the command line. The only place in the project that exits. */
#include "commands.h"
#include "offgraph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command k_commands[] = {
    /* sub-commands register here, one line each */
    {"export", og_cmd_export, "convert a Hugging Face checkpoint into a program file"},
    {"inspect", og_cmd_inspect, "validate a program file and show what it holds"},
    {"eval", og_cmd_eval, "write the logits of every input position"},
    {"perplexity", og_cmd_perplexity, "score how well the model predicts a text"},
    {"bench", og_cmd_bench, "prefill and decode speed, KV bytes allocated against live"},
    {"demo", og_cmd_demo, "show the KV manager: sessions, growth, metrics"},
    {"run", og_cmd_run, "generate text from a prompt, streamed as it comes"},
    {"chat", og_cmd_chat, "an interactive conversation in one session"},
    {"serve", og_cmd_serve, "an OpenAI-compatible HTTP server with continuous batching"},
    {"tokenize", og_cmd_tokenize, "text to token ids, with the model's tokenizer"},
    {"detokenize", og_cmd_detokenize, "token ids to text"},
    {"version", og_cmd_version, "print the version"},
};
#define N_COMMANDS (sizeof k_commands / sizeof k_commands[0])

int og_cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("offgraph %d.%d\n", OG_VERSION_MAJOR, OG_VERSION_MINOR);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: offgraph <command> [options]   (offgraph <command> --help for its options)\n\n"
               "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].summary);
}

/* OpenBLAS's pthread build starts its worker threads when it is loaded,
 * before main, and each takes a 128 MB buffer; where that allocation fails
 * (an address-space limit: ulimit -v) the thread retries forever and exit
 * waits for it, so the process hangs instead of reporting. The library runs
 * BLAS single-threaded anyway (its own pool supplies the parallelism), so
 * when OPENBLAS_NUM_THREADS is unset the tool runs itself again with it set
 * to 1, and OpenBLAS then starts no threads. */
static void blas_without_threads(char **argv) {
    if (getenv("OPENBLAS_NUM_THREADS")) return;
    if (setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0) return;
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with OpenBLAS's threads */
}

int main(int argc, char **argv) {
    blas_without_threads(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) return og_cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], k_commands[i].name)) return k_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "offgraph: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}

/* The offgraph command line: one function per sub-command, each in its own
 * tools/cmd_<name>.c. Each takes argc/argv starting at its own name and
 * returns the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef OG_TOOLS_COMMANDS_H
#define OG_TOOLS_COMMANDS_H

int og_cmd_version(int argc, char **argv);
/* sub-commands declare here, one line each */
int og_cmd_eval(int argc, char **argv);
int og_cmd_perplexity(int argc, char **argv);
int og_cmd_bench(int argc, char **argv);
int og_cmd_export(int argc, char **argv);
int og_cmd_inspect(int argc, char **argv);
int og_cmd_demo(int argc, char **argv);

int og_cmd_run(int argc, char **argv);
int og_cmd_chat(int argc, char **argv);
int og_cmd_serve(int argc, char **argv);
int og_cmd_tokenize(int argc, char **argv);
int og_cmd_detokenize(int argc, char **argv);

#endif

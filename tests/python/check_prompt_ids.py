#!/usr/bin/env python3
"""The same prompt gives the same token ids through every front end: the
library (`offgraph tokenize`), `offgraph run`, the Python binding
(Model.prompt_ids, Model.generate), `/v1/completions` (text and token-id
prompts) and, for a chat, `offgraph chat` and `/v1/chat/completions`.

For every tokenizer fixture (tests/data/hf/{llama-gqa,mistral-sw,qwen2-bias}
and tests/data/tokenizers/*), two checkpoints are made from models/kjv-tiny's
weights (vocabulary 4096, more than any fixture's ids) with that tokenizer:
one whose prompts get no BOS, one whose prompts do (by a TemplateProcessing
"<bos> $A" post_processor in tokenizer.json for half the fixtures, by
tokenizer_config.json's add_bos_token for the other half). Both carry a chat
template that writes {{ bos_token }} itself, as Llama 2's does.

The prompt ids the library gives are checked against the rule (the BOS, then
the text's own ids); run's prompt_tokens (--stats), the server's
usage.prompt_tokens and the greedy continuations must agree with them: the
server's continuation of the text prompt equals its continuation of the
library's ids sent as a token-id prompt, run's and the binding's. The chat's
prompt is what the template renders, tokenized without special tokens added
(as transformers' apply_chat_template(tokenize=True)): exactly one BOS where
the template writes it; `offgraph chat`'s prefill_tokens and the server's
prompt_tokens equal its length, and their greedy replies agree.

    check_prompt_ids.py OFFGRAPH_BINARY WORK_DIR SOURCE_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

BIN, WORK, SRC = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(SRC, "python"))
os.environ.setdefault("OFFGRAPH_LIB", os.path.join(os.path.dirname(os.path.abspath(BIN)), "liboffgraph.so"))
import offgraph  # noqa: E402

KJV = os.path.join(SRC, "models", "kjv-tiny")
PROMPT = "In the beginning God created the heaven"
USER = "Who made the earth?"
N = 6
TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")
fails = []


def fail(msg):
    fails.append(msg)
    print("FAIL: " + msg, flush=True)


def fixtures():
    out = []
    for name in ("llama-gqa", "mistral-sw", "qwen2-bias"):
        out.append((name, os.path.join(SRC, "tests", "data", "hf", name)))
    base = os.path.join(SRC, "tests", "data", "tokenizers")
    for name in sorted(os.listdir(base)):
        if os.path.exists(os.path.join(base, name, "tokenizer.json")):
            out.append((name, os.path.join(base, name)))
    return out


def bos_of(tj):
    """The fixture's token a BOS variant uses: its first special added token
    among the usual BOS texts, else its first special added token."""
    specials = [t["content"] for t in tj["added_tokens"] if t.get("special")]
    for b in ("<s>", "<|begin_of_text|>", "[CLS]", "<|endoftext|>"):
        if b in specials:
            return b
    return specials[0]


def checkpoint(name, folder, with_bos, by_config):
    """A checkpoint folder: kjv-tiny's weights and config, the fixture's
    tokenizer, a config whose bos_token is set (so the template writes it) and
    whose BOS rule gives a BOS only when with_bos."""
    d = os.path.join(WORK, "%s-%s" % (name, "bos" if with_bos else "plain"))
    os.makedirs(d)
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        os.symlink(os.path.join(KJV, f), os.path.join(d, f))
    tj = json.load(open(os.path.join(folder, "tokenizer.json"), encoding="utf-8"))
    bos = bos_of(tj)
    bos_id = [t["id"] for t in tj["added_tokens"] if t["content"] == bos][0]
    cfg_path = os.path.join(folder, "tokenizer_config.json")
    cfg = json.load(open(cfg_path, encoding="utf-8")) if os.path.exists(cfg_path) else {}
    cfg["bos_token"] = bos
    cfg["chat_template"] = TEMPLATE
    if with_bos and by_config:
        cfg["add_bos_token"] = True
    elif with_bos:
        tj["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}
    json.dump(tj, open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8"), ensure_ascii=False)
    prog = d + ".ogp"
    r = subprocess.run([BIN, "export", d, "-o", prog], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    if r.returncode:
        raise RuntimeError("export %s: %s" % (d, r.stderr.decode()))
    return prog, bos, bos_id


def tool(*args, stdin=None):
    r = subprocess.run([BIN] + list(args), input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    if r.returncode:
        raise RuntimeError("offgraph %s: %s" % (" ".join(args[:1]), r.stderr.decode("utf-8", "replace")))
    return r.stdout.decode("utf-8"), r.stderr.decode("utf-8")


class Server:
    def __init__(self, prog):
        self.log = open(prog + ".serve.log", "w")
        self.p = subprocess.Popen([BIN, "serve", "-m", prog, "--port", "0", "--max-sessions", "2"],
                                  stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        for _ in range(300):
            text = open(prog + ".serve.log").read()
            if "listening on http://127.0.0.1:" in text:
                self.port = int(text.split("listening on http://127.0.0.1:")[1].split()[0].rstrip("/.,"))
                break
            time.sleep(0.05)
        if self.port is None:
            self.close()
            raise RuntimeError("the server did not start: " + open(prog + ".serve.log").read())

    def post(self, path, body):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read().decode("utf-8"))

    def close(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def check(prog, label, with_bos, bos, bos_id):
    m = offgraph.Model(prog, backend="cpu")
    srv = Server(prog)
    try:
        tok = m.tokenizer
        plain = tok.encode(PROMPT, add_special=False)
        # the library: the rule, through the tool and the binding
        out, _ = tool("tokenize", "-m", prog, "--ids", "-p", PROMPT)
        lib = json.loads(out)
        want = ([bos_id] if with_bos else []) + plain
        if lib != want:
            fail("%s: offgraph tokenize gave %s, the rule %s" % (label, lib, want))
        if m.prompt_ids(PROMPT) != lib:
            fail("%s: Model.prompt_ids %s, offgraph tokenize %s" % (label, m.prompt_ids(PROMPT), lib))
        # run
        out, err = tool("run", "-m", prog, "--backend", "cpu", "-p", PROMPT, "-n", str(N), "--temp", "0", "--stats")
        stats = json.loads(err.strip().splitlines()[-1])
        if stats["prompt_tokens"] != len(lib):
            fail("%s: offgraph run fed %d prompt tokens, the library gives %d" % (label, stats["prompt_tokens"], len(lib)))
        run_text = out[len(PROMPT):-1] if out.startswith(PROMPT) and out.endswith("\n") else None
        if run_text is None:
            fail("%s: offgraph run printed %r" % (label, out))
        # the binding's greedy continuation
        py_text = "".join(m.generate(PROMPT, max_tokens=N, temperature=0))
        if py_text != run_text:
            fail("%s: Model.generate %r, offgraph run %r" % (label, py_text, run_text))
        # /v1/completions: text prompt and the library's ids as the prompt
        body = {"max_tokens": N, "temperature": 0, "seed": 1}
        a = srv.post("/v1/completions", dict(body, prompt=PROMPT))
        b = srv.post("/v1/completions", dict(body, prompt=lib))
        if a["usage"]["prompt_tokens"] != len(lib):
            fail("%s: /v1/completions prompt_tokens %d, the library gives %d" %
                 (label, a["usage"]["prompt_tokens"], len(lib)))
        if b["usage"]["prompt_tokens"] != len(lib):
            fail("%s: /v1/completions of the ids: prompt_tokens %d" % (label, b["usage"]["prompt_tokens"]))
        if a["choices"][0]["text"] != b["choices"][0]["text"]:
            fail("%s: /v1/completions continues the text with %r, the library's ids with %r" %
                 (label, a["choices"][0]["text"], b["choices"][0]["text"]))
        if a["choices"][0]["text"] != run_text:
            fail("%s: /v1/completions %r, offgraph run %r" % (label, a["choices"][0]["text"], run_text))
        # the chat: the template writes the BOS; nothing is added to it
        rendered = "%s[user] %s\n[assistant]" % (bos, USER)
        chat_ids = tok.encode(rendered, add_special=False)
        if chat_ids[:1] != [bos_id] or chat_ids[1:2] == [bos_id]:
            fail("%s: the rendered chat's ids %s do not begin with one BOS %d" % (label, chat_ids, bos_id))
        out, _ = tool("chat", "-m", prog, "--backend", "cpu", "-n", str(N), "--temp", "0",
                      stdin=(USER + "\n/stats\n").encode())
        lines = out.split("\n")
        at = next((i for i, l in enumerate(lines) if l.startswith('{"turn"')), None)
        if at is None:
            fail("%s: offgraph chat printed no stats: %r" % (label, out))
            return
        cstats = json.loads(lines[at])
        chat_reply = "\n".join(lines[:at])
        if cstats["prefill_tokens"] != len(chat_ids):
            fail("%s: offgraph chat prefilled %d tokens, the rendered chat is %d" %
                 (label, cstats["prefill_tokens"], len(chat_ids)))
        c = srv.post("/v1/chat/completions", dict(body, messages=[{"role": "user", "content": USER}]))
        if c["usage"]["prompt_tokens"] != len(chat_ids):
            fail("%s: /v1/chat/completions prompt_tokens %d, the rendered chat is %d" %
                 (label, c["usage"]["prompt_tokens"], len(chat_ids)))
        reply = c["choices"][0]["message"]["content"]
        if reply.strip() != chat_reply.strip():
            fail("%s: /v1/chat/completions replies %r, offgraph chat %r" % (label, reply, chat_reply))
        # the same chat text as a completion with no special tokens added
        d = srv.post("/v1/completions", dict(body, prompt=chat_ids))
        if d["choices"][0]["text"].strip() != reply.strip():
            fail("%s: the rendered chat's ids as a completion %r, the chat %r" % (label, d["choices"][0]["text"], reply))
        print("%s: prompt %d ids (%s), chat %d ids, run %r, chat %r" %
              (label, len(lib), "BOS" if with_bos else "no BOS", len(chat_ids), run_text, reply), flush=True)
    finally:
        srv.close()
        m.close()


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    n = 0
    for k, (name, folder) in enumerate(fixtures()):
        for with_bos in (False, True):
            by_config = k % 2 == 1
            label = "%s %s" % (name, ("BOS by add_bos_token" if by_config else "BOS by post_processor")
                               if with_bos else "no BOS")
            try:
                prog, bos, bos_id = checkpoint(name, folder, with_bos, by_config)
                check(prog, label, with_bos, bos, bos_id)
                n += 1
                os.remove(prog)
            except Exception as e:  # noqa: BLE001 - reported, then the next
                fail("%s: %s: %s" % (label, type(e).__name__, e))
    print("%d checkpoints, %d failures" % (n, len(fails)))
    sys.exit(1 if fails or n < 22 else 0)


if __name__ == "__main__":
    main()

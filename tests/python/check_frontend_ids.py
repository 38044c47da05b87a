#!/usr/bin/env python3
"""Every front end feeds a prompt as the token ids Hugging Face transformers
gives for it, for every tokenizer fixture and every BOS / EOS variant of
tests/data/tokenizers/special_tokens.json (made by
tests/fixtures/make_special_token_fixtures.py with transformers 5.17: the
ids of tokenizer(text), and of apply_chat_template(tokenize=True,
add_generation_prompt=True) where a case has a chat template). The expected
ids come from that file, never from offgraph.

For each case a checkpoint is made from models/kjv-tiny's weights (a
vocabulary of 4096, more than any fixture's ids) with the case's
tokenizer.json (its post_processor replaced as the case says) and
tokenizer_config.json, exported, and for each of the fixture's texts:

  - `offgraph run --show-prompt-ids` prints the ids it feeds: they must be
    transformers' (a prompt of no ids is refused, by the server too: HTTP
    400; "" with a BOS rule is the BOS alone and runs);
  - the Python binding's Model.prompt_ids (Tokenizer.encode) must be them
    too, and its engine request (Llama.create_completion, with
    log-probabilities) must feed them, by the two checks the server gets
    below;
  - `/v1/completions` with the text as the prompt must feed them: its
    usage.prompt_tokens is their count, and the log-probabilities of the
    first token it generates (top 5) equal those of the same request with
    transformers' ids as a token-id prompt (which the server takes as
    given). Any other prompt (a missing BOS, one token split otherwise)
    changes every log-probability far beyond the tolerance;
  - the greedy continuations of run, the binding and the server agree.

For a case with a chat, `/v1/chat/completions` and the binding's
Llama.create_chat_completion of the fixture's messages must feed
transformers' chat ids by the same two checks (usage and log-probabilities
against those ids as a token-id completion). `offgraph
chat` takes one user line at a time, so the fixture's conversation (a
system prompt and an assistant turn) cannot be typed into it;
tests/python/check_prompt_ids.py checks it against /v1/chat/completions.

    check_frontend_ids.py OFFGRAPH_BINARY WORK_DIR SOURCE_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

BIN, WORK, SRC = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(SRC, "python"))
os.environ.setdefault("OFFGRAPH_LIB", os.path.join(os.path.dirname(os.path.abspath(BIN)), "liboffgraph.so"))
import offgraph  # noqa: E402

KJV = os.path.join(SRC, "models", "kjv-tiny")
N = 3        # greedy tokens compared between the front ends
TOP = 5      # alternatives whose log-probabilities are compared
# Two runs of one prompt differ only by how the rows were batched (a prefix
# cache hit reads fewer rows in a step): ~1e-6 in f32. One changed prompt id
# moves the first token's log-probabilities by 1e-2 and more.
TOL = 1e-3
fails = []


def fail(msg):
    fails.append(msg)
    print("FAIL: " + msg, flush=True)


def checkpoint(case, k):
    """The case's tokenizer over kjv-tiny's weights, exported; the program's path."""
    d = os.path.join(WORK, "case%02d" % k)
    os.makedirs(d)
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        os.symlink(os.path.join(KJV, f), os.path.join(d, f))
    with open(os.path.join(SRC, case["tokenizer"]), encoding="utf-8") as f:
        tj = json.load(f)
    if "post_processor" in case:
        tj["post_processor"] = case["post_processor"]
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(case["config"], f, ensure_ascii=False)
    prog = d + ".ogp"
    r = subprocess.run([BIN, "export", d, "-o", prog], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    if r.returncode:
        raise RuntimeError("export: %s" % r.stderr.decode("utf-8", "replace"))
    return prog


class Server:
    def __init__(self, prog):
        self.log_path = prog + ".serve.log"
        self.log = open(self.log_path, "w")
        self.p = subprocess.Popen([BIN, "serve", "-m", prog, "--backend", "cpu", "--port", "0"],
                                  stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        for _ in range(600):
            with open(self.log_path) as f:
                text = f.read()
            if "listening on http://127.0.0.1:" in text:
                self.port = int(text.split("listening on http://127.0.0.1:")[1].split()[0].rstrip("/.,"))
                break
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        if self.port is None:
            self.close()
            with open(self.log_path) as f:
                raise RuntimeError("the server did not start: " + f.read())

    def post(self, path, body):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            raise RuntimeError("%s: HTTP %d %s" % (path, e.code, e.read().decode("utf-8", "replace")))

    def close(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def completion_top(resp):
    """[(token text, log-probability)] of a completion's first token's alternatives."""
    top = resp["choices"][0]["logprobs"]["top_logprobs"][0]
    return sorted(top.items(), key=lambda kv: (-kv[1], kv[0]))


def chat_top(resp):
    top = resp["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return sorted(((t["token"], t["logprob"]) for t in top), key=lambda kv: (-kv[1], kv[0]))


def same_top(a, b):
    """Whether two lists of alternatives are one distribution's (the same
    tokens, log-probabilities within TOL; tokens within TOL of each other
    may swap places)."""
    if len(a) != len(b) or not a:
        return False
    da, db = dict(a), dict(b)
    shared = set(da) & set(db)
    if len(shared) < len(a) - 1:
        return False
    return all(abs(da[t] - db[t]) <= TOL for t in shared)


def run_ids(prog, text):
    """(ids run printed, its continuation or None, exit status)."""
    r = subprocess.run([BIN, "run", "-m", prog, "--backend", "cpu", "-p", text, "-n", str(N), "--temp", "0",
                        "--show-prompt-ids"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    out, err = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    ids = None
    for line in err.splitlines():
        if line.startswith('{"prompt_ids"'):
            ids = json.loads(line)["prompt_ids"]
    cont = out[len(text):-1] if r.returncode == 0 and out.startswith(text) and out.endswith("\n") else None
    return ids, cont, r.returncode, err


def check_text(label, prog, m, llm, srv, text, want):
    got, run_cont, rc, err = run_ids(prog, text)
    if got != want:
        fail("%s: offgraph run fed %s, transformers %s" % (label, got, want))
    py = m.prompt_ids(text)
    if py != want:
        fail("%s: Model.prompt_ids %s, transformers %s" % (label, py, want))
    if not want:
        if rc == 0:
            fail("%s: offgraph run took a prompt of no tokens" % label)
        try:
            srv.post("/v1/completions", {"prompt": text, "max_tokens": N})
            fail("%s: /v1/completions took a prompt of no tokens" % label)
        except RuntimeError as e:
            if "HTTP 400" not in str(e):
                fail("%s: /v1/completions of a prompt of no tokens: %s" % (label, e))
        return
    if rc != 0:
        fail("%s: offgraph run failed: %s" % (label, err.strip()))
    body = {"max_tokens": N, "temperature": 0, "seed": 1, "logprobs": TOP}
    a = srv.post("/v1/completions", dict(body, prompt=text))
    b = srv.post("/v1/completions", dict(body, prompt=want))
    if a["usage"]["prompt_tokens"] != len(want):
        fail("%s: /v1/completions fed %d prompt tokens, transformers gives %d" %
             (label, a["usage"]["prompt_tokens"], len(want)))
    if not same_top(completion_top(a), completion_top(b)):
        fail("%s: /v1/completions of the text and of transformers' ids %s differ: %s vs %s" %
             (label, want, completion_top(a), completion_top(b)))
    if a["choices"][0]["text"] != b["choices"][0]["text"]:
        fail("%s: /v1/completions continues the text with %r, transformers' ids with %r" %
             (label, a["choices"][0]["text"], b["choices"][0]["text"]))
    # the binding's request (Llama.create_completion, the engine's text
    # prompt): the same two checks
    c = llm.create_completion(text, max_tokens=N, temperature=0, seed=1, logprobs=TOP)
    if c["usage"]["prompt_tokens"] != len(want):
        fail("%s: Python's create_completion fed %d prompt tokens, transformers gives %d" %
             (label, c["usage"]["prompt_tokens"], len(want)))
    if not same_top(completion_top(c), completion_top(b)):
        fail("%s: Python's create_completion of the text and /v1/completions of transformers' ids %s differ: "
             "%s vs %s" % (label, want, completion_top(c), completion_top(b)))
    py_cont = "".join(m.generate(text, max_tokens=N, temperature=0))
    if run_cont is not None and not (run_cont == py_cont == a["choices"][0]["text"] == c["choices"][0]["text"]):
        fail("%s: greedy continuations differ: run %r, Python %r / %r, /v1/completions %r" %
             (label, run_cont, py_cont, c["choices"][0]["text"], a["choices"][0]["text"]))


def check_chat(label, llm, srv, chat):
    want = chat["ids"]
    c = srv.post("/v1/chat/completions", {"messages": chat["messages"], "max_tokens": N, "temperature": 0,
                                          "seed": 1, "logprobs": True, "top_logprobs": TOP})
    d = srv.post("/v1/completions", {"prompt": want, "max_tokens": N, "temperature": 0, "seed": 1,
                                     "logprobs": TOP})
    if c["usage"]["prompt_tokens"] != len(want):
        fail("%s: /v1/chat/completions fed %d prompt tokens, apply_chat_template gives %d" %
             (label, c["usage"]["prompt_tokens"], len(want)))
    if not same_top(chat_top(c), completion_top(d)):
        fail("%s: /v1/chat/completions and apply_chat_template's ids as a completion differ: %s vs %s" %
             (label, chat_top(c), completion_top(d)))
    p = llm.create_chat_completion(chat["messages"], max_tokens=N, temperature=0, seed=1, logprobs=True,
                                   top_logprobs=TOP)
    if p["usage"]["prompt_tokens"] != len(want):
        fail("%s: Python's create_chat_completion fed %d prompt tokens, apply_chat_template gives %d" %
             (label, p["usage"]["prompt_tokens"], len(want)))
    if not same_top(chat_top(p), completion_top(d)):
        fail("%s: Python's create_chat_completion and apply_chat_template's ids as a completion differ: %s vs %s" %
             (label, chat_top(p), completion_top(d)))


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    with open(os.path.join(SRC, "tests", "data", "tokenizers", "special_tokens.json"), encoding="utf-8") as f:
        ref = json.load(f)
    n_cases = n_texts = n_chats = n_bos = 0
    only = os.environ.get("OG_IDS_CASES")  # a comma-separated subset, to debug one
    for k, case in enumerate(ref["cases"]):
        if "error" in case or (only and case["name"] not in only.split(",")):
            continue
        try:
            prog = checkpoint(case, k)
        except Exception as e:  # noqa: BLE001 - reported, then the next
            fail("%s: %s" % (case["name"], e))
            continue
        m = offgraph.Model(prog, backend="cpu")
        llm = offgraph.Llama(model_path=prog, n_gpu_layers=0)
        srv = None
        try:
            srv = Server(prog)
            for enc in case["encode"]:
                label = "%s %r" % (case["name"], enc["text"])
                try:
                    check_text(label, prog, m, llm, srv, enc["text"], enc["ids"])
                    n_texts += 1
                    n_bos += case.get("bos_id") is not None and enc["ids"][:1] == [case["bos_id"]]
                except Exception as e:  # noqa: BLE001
                    fail("%s: %s: %s" % (label, type(e).__name__, e))
            if "chat" in case:
                try:
                    check_chat(case["name"] + " chat", llm, srv, case["chat"])
                    n_chats += 1
                except Exception as e:  # noqa: BLE001
                    fail("%s chat: %s: %s" % (case["name"], type(e).__name__, e))
            n_cases += 1
        except Exception as e:  # noqa: BLE001
            fail("%s: %s: %s" % (case["name"], type(e).__name__, e))
        finally:
            if srv:
                srv.close()
            llm.close()
            m.close()
        os.remove(prog)
        print("%s: checked" % case["name"], flush=True)
    print("%d cases, %d texts (%d with a BOS), %d chats, %d failures" % (n_cases, n_texts, n_bos, n_chats, len(fails)))
    # the fixture holds 44 cases (transformers loads every one), 4 with a chat
    sys.exit(1 if fails or (not only and (n_cases < 44 or n_chats < 4 or n_bos == 0)) else 0)


if __name__ == "__main__":
    main()

"""The load of bench/soak.sh: `offgraph serve` under a mixed load for a set
time, sampled every 10 s, then a table and the verdict. Standard library
only, loopback only, every call under a timeout.

  python3 bench/soak.py PORT PID SECONDS CLIENTS [CONTEXT]

Each client repeats a request drawn at random: streamed and whole
completions of short prompts, chat turns that resend a growing history
behind a shared system prompt (prefix cache hits), prompts that fill the
context (they end at its limit), and streams the client hangs up on after
its first chunk. The server's --kv-budget and --max-queue are meant to be
tight, so that requests wait and some get 429: those are counted apart, as
intended. Every 10 s: RSS, open descriptors, threads, and /metrics (live KV,
running and waiting requests, the prefix cache). At the end the load stops,
the server is given 30 s to be idle, and the verdict is printed: exit 1 if
any request failed other than by a 429 or its own hang-up, if RSS after the
warm-up drifted by 5 % or more, if live KV is not 0 at idle, or if the
descriptor and thread counts at idle differ from those before the load.
"""
import http.client
import json
import random
import socket
import sys
import threading
import time

PORT, PID, SECONDS, CLIENTS = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
CONTEXT = int(sys.argv[5]) if len(sys.argv) > 5 else 1024
WORDS = ("and the LORD said unto Moses behold I will send thee bread from heaven and the people shall go out "
         "and gather a certain rate every day that I may prove them whether they will walk in my law or no").split()
SYSTEM = "You answer in the words of the King James Bible, briefly. " * 4

lock = threading.Lock()
counts = {}
first_error = {}
stop = threading.Event()


def note(kind, detail=""):
    with lock:
        counts[kind] = counts.get(kind, 0) + 1
        if detail and kind not in first_error:
            first_error[kind] = detail[:300]


def proc(field):
    with open("/proc/%d/status" % PID) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def fds():
    import os
    return len(os.listdir("/proc/%d/fd" % PID))


def metrics():
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    m = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
    return m


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def request(path, body, stream, hang_up=False):
    """One request; returns what to count it as."""
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status == 429:
            r.read()
            return "429", None
        if r.status != 200:
            return "http_%d" % r.status, r.read()[:300].decode(errors="replace")
        if not stream:
            j = json.loads(r.read())
            fin = j["choices"][0]["finish_reason"]
            if fin not in ("stop", "length"):
                return "bad_finish", json.dumps(j)[:300]
            return "ok", j
        got_done, parts = False, []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if hang_up:
                return "hung_up", None  # closes the connection mid-stream
            if line == b"data: [DONE]":
                got_done = True
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                return "stream_error", json.dumps(ev)[:300]
            for ch in ev.get("choices", []):
                parts.append(ch.get("text") or ch.get("delta", {}).get("content") or "")
        if not got_done:
            return "stream_cut", "no [DONE]"
        return "ok", "".join(parts)
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        return "exc_" + type(e).__name__, repr(e)
    finally:
        c.close()


LONG_WORDS = 0  # words of a prompt of about half the context (set by calibrate)


def calibrate():
    """Tokens a word of WORDS takes with the served tokenizer."""
    global LONG_WORDS
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request("POST", "/v1/completions", json.dumps({"prompt": text(random.Random(1), 200), "max_tokens": 1}),
              {"Content-Type": "application/json"})
    j = json.loads(c.getresponse().read())
    c.close()
    per_word = j["usage"]["prompt_tokens"] / 200.0
    LONG_WORDS = max(8, int(CONTEXT * 0.5 / per_word))


def client(i):
    rng = random.Random(1000 + i)
    history = []
    while not stop.is_set():
        r = rng.random()
        if r < 0.30:
            kind, body = "complete_stream", {"prompt": text(rng, rng.randint(3, 40)), "max_tokens": rng.randint(8, 64),
                                             "stream": True}
            res, detail = request("/v1/completions", body, True)
        elif r < 0.50:
            body = {"prompt": text(rng, rng.randint(3, 40)), "max_tokens": rng.randint(8, 64),
                    "temperature": rng.choice([0, 0.8])}
            res, detail = request("/v1/completions", body, False)
        elif r < 0.70:  # a chat turn: the history grows behind one system prompt
            if len(history) > 6 or rng.random() < 0.15:
                history = []
            history.append({"role": "user", "content": text(rng, rng.randint(3, 20))})
            stream = rng.random() < 0.5
            body = {"messages": [{"role": "system", "content": SYSTEM}] + history, "max_tokens": rng.randint(8, 40),
                    "stream": stream}
            res, detail = request("/v1/chat/completions", body, stream)
            if res == "ok":
                reply = detail if stream else detail["choices"][0]["message"]["content"]
                history.append({"role": "assistant", "content": reply})
            elif res == "429":
                history.pop()  # the same turn again next time
            else:
                history = []
        elif r < 0.80:  # a prompt that fills the context: it ends at the limit
            body = {"prompt": text(rng, LONG_WORDS), "max_tokens": CONTEXT, "stream": rng.random() < 0.5}
            res, detail = request("/v1/completions", body, body["stream"])
        else:  # a client that hangs up after the first chunk
            body = {"prompt": text(rng, rng.randint(3, 20)), "max_tokens": 200, "stream": True}
            res, detail = request("/v1/completions", body, True, hang_up=True)
        time.sleep(rng.uniform(0, 0.6) if i % 2 else 0)  # half the clients think between requests: the load comes and goes
        if res == "ok":
            note("ok")
        elif res in ("429", "hung_up"):
            note(res)
            if res == "429":
                time.sleep(rng.uniform(0.05, 0.5))
        else:
            note("error:" + res, detail or "")


def sample(t0):
    m = metrics()
    return {"t": time.monotonic() - t0, "rss_mb": proc("VmRSS") / 1024.0, "fds": fds(), "threads": proc("Threads"),
            "kv_live": m.get("offgraph_kv_bytes_live", -1), "kv_backed": m.get("offgraph_kv_bytes_backed", -1),
            "running": m.get("offgraph_requests_running", -1), "waiting": m.get("offgraph_requests_waiting", -1),
            "prefix_mb": m.get("offgraph_prefix_cache_bytes_held", 0) / 2**20,
            "prefix_hits": m.get("offgraph_prefix_cache_hits_total", 0),
            "reused": m.get("offgraph_prompt_tokens_reused_total", 0),
            "prompt": m.get("offgraph_prompt_tokens_total", 0),
            "generated": m.get("offgraph_generation_tokens_total", 0),
            "conns": m.get("offgraph_http_connections", -1)}


def main():
    calibrate()
    t0 = time.monotonic()
    # the server at rest: the socket of a request just answered (calibrate's,
    # or the /metrics one a sample makes) may still be open for a moment, so
    # the fewest descriptors of a few samples over a second is the baseline
    before = sample(t0)
    for _ in range(4):
        time.sleep(0.25)
        again = sample(t0)
        if again["fds"] < before["fds"]:
            before = again
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    samples = []
    print("| s | RSS MB | fds | threads | live KV MB | backed KV MB | prefix cache MB | running | waiting | "
          "connections | requests ok / 429 / hung up / errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    while time.monotonic() - t0 < SECONDS:
        time.sleep(min(10, max(0.1, SECONDS - (time.monotonic() - t0))))
        s = sample(t0)
        samples.append(s)
        with lock:
            errs = sum(v for k, v in counts.items() if k.startswith("error:"))
            line = "%d / %d / %d / %d" % (counts.get("ok", 0), counts.get("429", 0), counts.get("hung_up", 0), errs)
        print("| %.0f | %.1f | %d | %d | %.2f | %.2f | %.1f | %d | %d | %d | %s |" % (
            s["t"], s["rss_mb"], s["fds"], s["threads"], s["kv_live"] / 2**20, s["kv_backed"] / 2**20,
            s["prefix_mb"], s["running"], s["waiting"], s["conns"], line), flush=True)
    stop.set()
    for t in threads:
        t.join(180)
    deadline = time.monotonic() + 30
    while True:
        idle = sample(t0)
        if (idle["running"] == 0 and idle["waiting"] == 0 and idle["kv_live"] == 0 and idle["conns"] <= 1 and
                idle["fds"] <= before["fds"] and idle["threads"] <= before["threads"]) or time.monotonic() > deadline:
            break
        time.sleep(0.5)

    fails = []
    n = len(samples)
    warm = max(1, n // 4, min(n // 2, 6))  # warm-up: the first quarter, and at least a minute of a short run
    early = samples[warm:warm + max(1, (n - warm) // 3)]
    late = samples[-max(1, (n - warm) // 3):]
    rss_early = sum(s["rss_mb"] for s in early) / len(early) if early else float("nan")
    rss_late = sum(s["rss_mb"] for s in late) / len(late) if late else float("nan")
    drift = (rss_late - rss_early) / rss_early * 100 if early and late else float("nan")
    with lock:
        total = sum(counts.values())
        errs = {k[6:]: v for k, v in counts.items() if k.startswith("error:")}
    print()
    print("| figure | value |")
    print("|---|---|")
    print("| duration, clients | %.0f s, %d |" % (SECONDS, CLIENTS))
    print("| requests | %d (%.1f/s) |" % (total, total / SECONDS))
    print("| ok | %d |" % counts.get("ok", 0))
    print("| 429 (intended: the budget and queue are tight) | %d |" % counts.get("429", 0))
    print("| hung up by the client after the first chunk (intended) | %d |" % counts.get("hung_up", 0))
    print("| errors | %s |" % (", ".join("%s %d" % kv for kv in sorted(errs.items())) or "0"))
    print("| RSS before the load / after warm-up / at the end (MB) | %.1f / %.1f / %.1f |"
          % (before["rss_mb"], rss_early, rss_late))
    print("| RSS drift after warm-up | %+.2f %% |" % drift)
    print("| descriptors before / at idle | %d / %d |" % (before["fds"], idle["fds"]))
    print("| threads before / at idle | %d / %d |" % (before["threads"], idle["threads"]))
    print("| live KV at idle | %d bytes |" % idle["kv_live"])
    print("| prompt tokens prefilled / taken from the prefix cache (hits) / generated | %d / %d (%d) / %d |"
          % (idle["prompt"] - before["prompt"], idle["reused"] - before["reused"],
             idle["prefix_hits"] - before["prefix_hits"], idle["generated"] - before["generated"]))
    for k, d in sorted(first_error.items()):
        print("first %s: %s" % (k, d), file=sys.stderr)
    if errs:
        fails.append("requests failed: %s" % errs)
    if not (abs(drift) < 5):
        fails.append("RSS drifted %.2f %% after warm-up" % drift)
    if idle["kv_live"] != 0 or idle["running"] != 0 or idle["waiting"] != 0:
        fails.append("not idle at the end: %s" % idle)
    if idle["fds"] > before["fds"] or idle["threads"] > before["threads"]:  # a leak grows them
        fails.append("descriptors %d -> %d, threads %d -> %d" % (before["fds"], idle["fds"], before["threads"],
                                                                    idle["threads"]))
    if counts.get("ok", 0) == 0:
        fails.append("no request succeeded")
    for f in fails:
        print("soak: FAIL: " + f)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()

"""Small clients of `offgraph serve` for tests/cli_serve.sh and bench/serve.sh
(standard library only, loopback only, every call under a timeout).

  python3 sse.py check-stream FILE             a saved SSE body: prints its text, checks the framing
  python3 sse.py concurrent PORT N EXPECT.json  N streaming clients at once, each text == EXPECT[i]
  python3 sse.py disconnect PORT                reads the first chunk of a long stream and hangs up
  python3 sse.py load PORT N SECONDS MAXTOK     N streaming clients for SECONDS: one JSON line of figures
"""
import http.client
import json
import sys
import threading
import time


def stream(port, path, body, timeout=60, on_chunk=None):
    """POSTs body with stream true; returns (status, events, text, t_first, t_end, t_start)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.monotonic()
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        data = r.read()
        c.close()
        return r.status, [json.loads(data)], "", None, time.monotonic(), t0
    events, text, t_first, buf = [], [], None, b""
    while True:
        line = r.readline()
        if not line:
            break
        buf = line.strip()
        if not buf.startswith(b"data: "):
            continue
        payload = buf[6:]
        if payload == b"[DONE]":
            events.append("[DONE]")
            break
        ev = json.loads(payload)
        events.append(ev)
        for ch in ev.get("choices", []):
            piece = ch.get("text") if "text" in ch else ch.get("delta", {}).get("content")
            if piece:
                if t_first is None:
                    t_first = time.monotonic()
                text.append(piece)
        if on_chunk and on_chunk(ev) is False:
            c.close()
            return 200, events, "".join(text), t_first, time.monotonic(), t0
    c.close()
    return 200, events, "".join(text), t_first, time.monotonic(), t0


def check_events(events):
    """The framing every stream must have, as OpenAI streams: one chunk with the
    finish reason; usage (when stream_options.include_usage asked for it) once,
    in a last chunk with no choices, null in the others. Returns the finish
    reason and the usage (None when not asked for)."""
    assert events and events[-1] == "[DONE]", "no [DONE] at the end"
    assert "error" not in events[-2], events[-2]
    fin = [e for e in events[:-1] if e.get("choices") and e["choices"][0].get("finish_reason")]
    assert len(fin) == 1, "one chunk has the finish reason: %r" % fin
    assert fin[0]["choices"][0]["finish_reason"] in ("stop", "length"), fin
    with_usage = [e for e in events[:-1] if e.get("usage")]
    asked = "usage" in events[0]
    assert all(("usage" in e) == asked for e in events[:-1]), "usage is in some chunks only"
    usage = None
    if asked:
        assert len(with_usage) == 1 and with_usage[0] is events[-2] and with_usage[0]["choices"] == [], \
            "usage once, in the last chunk, with no choices: %r" % with_usage
        usage = with_usage[0]["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage
    else:
        assert not with_usage, "usage without stream_options.include_usage: %r" % with_usage
    ids = {e["id"] for e in events[:-1]}
    assert len(ids) == 1, ids
    return fin[0]["choices"][0]["finish_reason"], usage


def main():
    cmd = sys.argv[1]
    if cmd == "check-stream":
        events = []
        for line in open(sys.argv[2], "rb").read().split(b"\n"):
            if line.startswith(b"data: "):
                p = line[6:]
                events.append("[DONE]" if p == b"[DONE]" else json.loads(p))
        check_events(events)
        text = "".join((ch.get("text") if "text" in ch else ch.get("delta", {}).get("content")) or ""
                       for e in events[:-1] for ch in e.get("choices", []))
        sys.stdout.write(text)
    elif cmd == "concurrent":
        port, n, expect = int(sys.argv[2]), int(sys.argv[3]), json.load(open(sys.argv[4]))
        results = [None] * n

        def one(i):
            try:
                body = {"prompt": expect[i]["prompt"], "max_tokens": expect[i]["max_tokens"], "temperature": 0,
                        "stream": True, "stream_options": {"include_usage": True}}
                st, ev, text, *_ = stream(port, "/v1/completions", body, timeout=120)
                assert st == 200, (st, ev)
                fin, usage = check_events(ev)
                assert text == expect[i]["text"], "client %d: %r != %r" % (i, text, expect[i]["text"])
                assert usage["completion_tokens"] == expect[i]["completion_tokens"], usage
                results[i] = "ok"
            except Exception as e:  # reported below
                results[i] = "client %d: %r" % (i, e)

        ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(180)
        bad = [r for r in results if r != "ok"]
        if bad:
            print("\n".join(str(b) for b in bad))
            sys.exit(1)
        print("%d streams complete and correct" % n)
    elif cmd == "disconnect":
        port = int(sys.argv[2])
        seen = []

        def first(ev):
            seen.append(ev)
            return not any(ch.get("text") for ch in ev.get("choices", []))

        body = {"prompt": "And it came to pass", "max_tokens": 100000, "temperature": 0, "stream": True}
        st, ev, text, *_ = stream(port, "/v1/completions", body, timeout=30, on_chunk=first)
        assert st == 200 and text and ev[-1] != "[DONE]", (st, ev[-1:])
        print("hung up after %d chunks" % len(seen))
    elif cmd == "load":
        port, n, seconds, max_tokens = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
        prompts = ["And it came to pass", "In the beginning", "The LORD is my shepherd", "And God said",
                   "Blessed are the", "Now the serpent was", "And the king said", "Hear, O Israel"]
        lock = threading.Lock()
        recs, errors = [], []
        t_stop = time.monotonic() + seconds

        def client(i):
            k = 0
            while time.monotonic() < t_stop:
                body = {"prompt": prompts[(i + k) % len(prompts)], "max_tokens": max_tokens, "temperature": 0.8,
                        "seed": i * 1000 + k, "stream": True, "stream_options": {"include_usage": True}}
                k += 1
                try:
                    st, ev, text, t_first, t_end, t0 = stream(port, "/v1/completions", body, timeout=120)
                    if st != 200:
                        raise RuntimeError("HTTP %d" % st)
                    fin, usage = check_events(ev)
                    with lock:
                        recs.append((t0, t_first or t_end, t_end, usage["completion_tokens"]))
                except Exception as e:
                    with lock:
                        errors.append(repr(e))

        t_begin = time.monotonic()
        ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(seconds + 180)
        wall = time.monotonic() - t_begin

        def pct(v, q):
            v = sorted(v)
            return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")

        ttft = [(f - s) * 1e3 for s, f, e, c in recs]
        tpot = [(e - f) * 1e3 / (c - 1) for s, f, e, c in recs if c > 1]
        toks = sum(c for s, f, e, c in recs)
        print(json.dumps({"clients": n, "requests": len(recs), "errors": len(errors), "wall_s": round(wall, 2),
                          "requests_per_s": round(len(recs) / wall, 2), "output_tok_per_s": round(toks / wall, 1),
                          "ttft_p50_ms": round(pct(ttft, 0.5), 1), "ttft_p99_ms": round(pct(ttft, 0.99), 1),
                          "tpot_p50_ms": round(pct(tpot, 0.5), 2), "tpot_p99_ms": round(pct(tpot, 0.99), 2),
                          "first_error": errors[0] if errors else None}))
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()

"""Slow and idle clients against `offgraph serve` (tests/cli_serve_flood.sh):
hundreds of connections that trickle a request's headers, hundreds that send
nothing, and a few streams that are never read, while an ordinary client's
requests are timed. Standard library only, loopback only, bounded in time.

  python3 flood.py PORT PID HEADER_TIMEOUT WRITE_TIMEOUT PER_IP [ADDRESSES [EXTRA [PHASES]]]

ADDRESSES (default 6) addresses each open PER_IP idle connections, and as
many PER_IP + EXTRA (default 10) trickling ones; up to 2 more PER_IP whose
bodies trickle. PHASES (default 1234) picks the floods: 1 trickling, 2 idle,
3 never read, 4 all at once.

The flooding connections come from other loopback addresses (127.0.0.2 and
up: all of 127/8 is this machine) than the ordinary client (127.0.0.1), so
the per-address limit of the server applies to them and not to it. Prints a
line of figures per phase; exits 1 when a check fails.
"""
import errno
import http.client
import json
import resource
import select
import socket
import sys
import threading
import time

PORT, PID = int(sys.argv[1]), int(sys.argv[2])
T_HEADER, T_WRITE, PER_IP = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
ADDRS = int(sys.argv[6]) if len(sys.argv) > 6 else 6
EXTRA = int(sys.argv[7]) if len(sys.argv) > 7 else 10
PHASES = sys.argv[8] if len(sys.argv) > 8 else "1234"
# How much slower than a quiet release build this server answers (a
# sanitizer build, a loaded machine): measured before the floods, it scales
# the time bounds below.
SLOW = 1.0
fails = []


def check(ok, what):
    if not ok:
        fails.append(what)
        print("FAIL: " + what, flush=True)


def threads():
    with open("/proc/%d/status" % PID) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def metrics():
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=20)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    m = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
    return m


# ------------------------------------------------------------ the flood
class Conn:
    def __init__(self, kind, src):
        self.kind, self.src = kind, src
        self.sock = None
        self.t_open = self.t_connected = None
        self.next_line = 0.0
        self.lines = 0
        self.got = b""


class Flood:
    """One thread, one epoll: connects, trickles, and notes how each
    connection ended (refused at once, or cut by a deadline, with or
    without a 408) and how long it was held."""

    def __init__(self):
        self.ep = select.epoll()
        self.conns = {}
        self.reopen = []  # (time, kind, src)
        self.lock = threading.Lock()
        self.stop = False
        self.ends = []  # (kind, held seconds, got 408, got anything)
        kinds = ("trickle", "body", "idle", "noread", "noread-whole")
        self.refused = {k: 0 for k in kinds}
        self.peak = {k: 0 for k in kinds}
        self.open_now = {k: 0 for k in kinds}
        self.wanted = []  # (kind, src, count): kept open while not stopping
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open(self, kind, src):
        c = Conn(kind, src)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if kind.startswith("noread"):  # a small window: the server's send buffer fills soon
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        s.bind((src, 0))
        s.connect_ex(("127.0.0.1", PORT))
        c.sock, c.t_open = s, time.monotonic()
        self.conns[s.fileno()] = c
        self.ep.register(s.fileno(), select.EPOLLOUT | select.EPOLLRDHUP)

    def ended(self, c, now, ours=False):
        """c was closed by the server (or refused), or by us (ours: not counted)."""
        fd = c.sock.fileno()
        self.ep.unregister(fd)
        del self.conns[fd]
        c.sock.close()
        if c.t_connected is not None:
            self.open_now[c.kind] -= 1
        if ours:
            return
        if c.t_connected is not None:
            held = now - c.t_connected
            # closed before a deadline could have passed, with nothing said:
            # refused at accept (the per-address or the total limit)
            if held < T_HEADER / 2 and not c.got:
                self.refused[c.kind] += 1
            else:
                self.ends.append((c.kind, held, c.got.startswith(b"HTTP/1.1 408"), bool(c.got)))
        else:
            self.refused[c.kind] += 1
        if not self.stop and not c.kind.startswith("noread"):
            self.reopen.append((now + 0.2, c.kind, c.src))

    def connected(self, c, now):
        err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.ended(c, now)
            return
        c.t_connected = now
        self.open_now[c.kind] += 1
        self.peak[c.kind] = max(self.peak[c.kind], self.open_now[c.kind])
        fd = c.sock.fileno()
        try:
            if c.kind == "trickle":
                c.sock.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
                c.next_line = now + 0.5
                self.ep.modify(fd, select.EPOLLIN | select.EPOLLRDHUP)
            elif c.kind == "body":  # whole headers, then a byte of the body now and then
                c.sock.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 1000\r\n\r\n{")
                c.next_line = now + 0.5
                self.ep.modify(fd, select.EPOLLIN | select.EPOLLRDHUP)
            elif c.kind == "idle":
                self.ep.modify(fd, select.EPOLLIN | select.EPOLLRDHUP)
            else:  # a stream, or a whole answer too big for the socket buffers
                whole = c.kind == "noread-whole"
                body = json.dumps({"prompt": "In the beginning", "max_tokens": 300 if whole else 1000,
                                   "temperature": 0, "ignore_eos": True, "logprobs": 20,
                                   "stream": not whole}).encode()
                c.sock.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\n\r\n" % len(body) + body)
                self.ep.modify(fd, select.EPOLLRDHUP)  # never read: only its end is watched
        except OSError:
            self.ended(c, now)

    def run(self):
        while True:
            with self.lock:
                if self.stop and not self.conns:
                    return
                now = time.monotonic()
                for t, kind, src in [x for x in self.reopen if x[0] <= now]:
                    self.reopen.remove((t, kind, src))
                    self.open(kind, src)
                for c in list(self.conns.values()):
                    if self.stop:
                        self.ended(c, now, ours=True)
                    elif c.kind in ("trickle", "body") and c.t_connected is not None and now >= c.next_line:
                        c.lines += 1
                        c.next_line = now + 0.5
                        try:
                            c.sock.send(b"X-Trickle-%d: x\r\n" % c.lines if c.kind == "trickle" else b" ")
                        except OSError:
                            self.ended(c, now)
                try:
                    events = self.ep.poll(0.05)
                except InterruptedError:
                    continue
                now = time.monotonic()
                for fd, ev in events:
                    c = self.conns.get(fd)
                    if c is None:
                        continue
                    if c.t_connected is None:
                        if ev & (select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP):
                            self.connected(c, now)
                        continue
                    if c.kind.startswith("noread"):
                        if ev & (select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR):
                            c.got = b"?"
                            self.ended(c, now)
                        continue
                    try:
                        data = c.sock.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if data:
                        c.got += data
                    if not data or ev & (select.EPOLLHUP | select.EPOLLERR):
                        self.ended(c, now)
            time.sleep(0.001)

    def add(self, kind, src, n):
        with self.lock:
            for _ in range(n):
                self.open(kind, src)

    def halt(self, kind=None):
        """Stops reopening (one kind, or all) and closes those connections."""
        with self.lock:
            self.reopen = [x for x in self.reopen if kind is not None and x[1] != kind]
            for c in list(self.conns.values()):
                if kind is None or c.kind == kind:
                    self.ended(c, time.monotonic(), ours=True)
            self.reopen = [x for x in self.reopen if kind is not None and x[1] != kind]

    def take_ends(self, kind):
        with self.lock:
            mine = [e for e in self.ends if e[0] == kind]
            self.ends = [e for e in self.ends if e[0] != kind]
            refused, self.refused[kind] = self.refused[kind], 0
            peak, self.peak[kind] = self.peak[kind], self.open_now[kind]
        return mine, refused, peak


# ------------------------------------------------------------ the ordinary client
def ordinary_once():
    """Three requests, each on a new connection: /health, a completion, a
    stream. Returns their times in seconds; raises on any failure."""
    times = []
    for kind in ("health", "complete", "stream"):
        t0 = time.monotonic()
        c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
        if kind == "health":
            c.request("GET", "/health")
            r = c.getresponse()
            body = r.read()
            assert r.status == 200, (kind, r.status, body[:200])
        else:
            req = {"prompt": "And God said", "max_tokens": 8, "temperature": 0, "stream": kind == "stream"}
            c.request("POST", "/v1/completions", json.dumps(req), {"Content-Type": "application/json"})
            r = c.getresponse()
            body = r.read()
            assert r.status == 200, (kind, r.status, body[:200])
            if kind == "stream":
                assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]
            else:
                assert json.loads(body)["usage"]["completion_tokens"] >= 1, body[:200]
        c.close()
        times.append(time.monotonic() - t0)
    return times


class Ordinary:
    def __init__(self):
        self.times, self.errors, self.stop = [], [], False
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop:
            try:
                self.times.extend(ordinary_once())
            except Exception as e:  # noqa: BLE001 - every failure is reported
                self.errors.append(repr(e))
                time.sleep(0.2)
            time.sleep(0.1)


def during(name, seconds):
    """Runs the ordinary client for `seconds`; prints and checks its times."""
    o = Ordinary()
    o.thread.start()
    time.sleep(seconds)
    o.stop = True
    o.thread.join(60)
    t = sorted(o.times)
    med = t[len(t) // 2] if t else float("nan")
    worst = t[-1] if t else float("nan")
    print("%-28s ordinary requests: %3d ok, %d failed, median %.3f s, slowest %.3f s"
          % (name, len(t), len(o.errors), med, worst), flush=True)
    check(not o.errors, "%s: ordinary requests failed: %s" % (name, o.errors[:3]))
    check(len(t) >= 3, "%s: only %d ordinary requests finished" % (name, len(t)))
    check(not t or worst < 5.0 * SLOW, "%s: an ordinary request took %.2f s (bound %.1f s)" % (name, worst, 5.0 * SLOW))
    return t


def cut_figures(name, kind, ends, refused, peak):
    held = [e[1] for e in ends]
    n408 = sum(1 for e in ends if e[2])
    worst = max(held) if held else float("nan")
    print("%-28s %s: %d held at once at most, %d cut by the deadline (%d with a 408), held %.2f s at most, "
          "%d refused at once" % (name, kind, peak, len(ends), n408, worst, refused), flush=True)
    check(len(ends) > 0, "%s: no %s connection was cut" % (name, kind))
    check(not held or worst <= T_HEADER + 1.5 * SLOW, "%s: a %s connection was held %.2f s (deadline %.1f s)"
          % (name, kind, worst, T_HEADER))
    check(n408 * 2 >= len(ends), "%s: only %d of %d cut %s connections got a 408" % (name, n408, len(ends), kind))


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192) if hard != resource.RLIM_INFINITY else 8192, hard))
    ordinary_once()  # every thread the server starts for a request exists
    time.sleep(0.5)
    base_threads = threads()
    m0 = metrics()
    global SLOW
    t = during("no flood", 3)
    SLOW = max(1.0, t[len(t) // 2] / 0.1) if t else 1.0
    print("time bounds scaled by %.1f (an ordinary request's median before the floods / 0.1 s)" % SLOW, flush=True)

    f = Flood()
    f.thread.start()

    if "1" in PHASES:
        # 1: connections that trickle their headers, PER_IP + EXTRA from each of
        # ADDRS addresses (PER_IP of each are let in), and PER_IP from 2 more
        # that send their headers whole and then a byte of the body every 0.5 s
        for a in range(ADDRS):
            f.add("trickle", "127.0.0.%d" % (2 + a), PER_IP + EXTRA)
        for a in range(min(2, ADDRS)):
            f.add("body", "127.0.0.%d" % (100 + a), PER_IP)
        during("trickling headers, bodies", 3 * T_HEADER + 1)
        f.halt("trickle")
        f.halt("body")
        ends, refused, peak = f.take_ends("trickle")
        cut_figures("trickling headers", "trickle", ends, refused, peak)
        check(peak >= ADDRS * PER_IP * 0.8, "trickling headers: only %d held at once" % peak)
        check(refused > 0, "trickling headers: none past --max-connections-per-ip was refused")
        ends, refused, peak = f.take_ends("body")
        cut_figures("trickling bodies", "body", ends, refused, peak)

    if "2" in PHASES:
        # 2: connections that send nothing
        for a in range(ADDRS):
            f.add("idle", "127.0.0.%d" % (110 + a), PER_IP)
        during("idle connections", 3 * T_HEADER + 1)
        f.halt("idle")
        ends, refused, peak = f.take_ends("idle")
        cut_figures("idle connections", "idle", ends, refused, peak)
        check(peak >= ADDRS * PER_IP * 0.8, "idle connections: only %d held at once" % peak)

    if "3" in PHASES:
        # 3: streams never read (each request cancelled, its session freed), and
        # whole answers never read
        before = metrics()
        t0 = time.monotonic()
        f.add("noread", "127.0.0.200", 4)
        f.add("noread-whole", "127.0.0.201", 2)
        during("streams never read", T_WRITE + 6)
        deadline = time.monotonic() + 60 * SLOW
        while time.monotonic() < deadline:
            with f.lock:
                left = sum(1 for c in f.conns.values() if c.kind.startswith("noread"))
            if not left:
                break
            time.sleep(0.2)
        ends, refused, peak = f.take_ends("noread")
        closed_after = [e[1] for e in ends]
        ends_w, refused_w, _ = f.take_ends("noread-whole")
        closed_after_w = [e[1] for e in ends_w]
        after = metrics()
        cancelled = after['offgraph_requests_total{outcome="cancelled"}'] - before['offgraph_requests_total{outcome="cancelled"}']
        cut = sum(after.get('offgraph_http_timeouts_total{kind="%s"}' % k, 0) -
                  before.get('offgraph_http_timeouts_total{kind="%s"}' % k, 0) for k in ("write", "unsent"))
        print("%-28s 4 streams closed by the server %s s after their request, 2 whole answers %s s after; "
              "%d requests cancelled, %d connections cut for not reading"
              % ("streams never read", ",".join("%.1f" % x for x in closed_after),
                 ",".join("%.1f" % x for x in closed_after_w), cancelled, cut), flush=True)
        check(len(closed_after) == 4 and refused == 0, "streams never read: %d of 4 closed by the server (%d refused)"
              % (len(closed_after), refused))
        check(len(closed_after_w) == 2 and refused_w == 0, "whole answers never read: %d of 2 closed by the server"
              % len(closed_after_w))
        check(cancelled >= 4, "streams never read: %d requests cancelled, not 4" % cancelled)
        check(cut >= 6, "never read: %d connections cut for not reading, not 6" % cut)
        check(not closed_after or max(closed_after) < T_WRITE + 15 * SLOW,
              "streams never read: not all closed %.0f s after they started" % (T_WRITE + 15 * SLOW))

    if "4" in PHASES:
        # 4: everything at once
        for a in range(ADDRS):
            f.add("trickle", "127.0.0.%d" % (2 + a), PER_IP)
            f.add("idle", "127.0.0.%d" % (110 + a), PER_IP)
        f.add("body", "127.0.0.100", PER_IP)
        f.add("noread", "127.0.0.200", 4)
        during("all of them at once", 2 * T_HEADER + 2)
    f.stop = True
    f.halt()
    f.thread.join(30)

    # afterwards: nothing leaked, the threads are back
    deadline = time.monotonic() + 30
    while True:
        m = metrics()
        n = threads()
        idle = (m["offgraph_requests_running"] == 0 and m["offgraph_requests_waiting"] == 0 and
                m["offgraph_sessions_busy"] == 0 and m["offgraph_http_connections"] <= 1 and
                m["offgraph_http_requests_active"] <= 1)
        if (idle and n == base_threads) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    print("afterwards: threads %d (before the floods %d); running %d, waiting %d, sessions busy %d, "
          "connections open %d; requests ok %d, cancelled %d, error %d; connections cut: headers %d, body %d, "
          "write %d, unsent %d; %d connections in all"
          % (n, base_threads, m["offgraph_requests_running"], m["offgraph_requests_waiting"],
             m["offgraph_sessions_busy"], m["offgraph_http_connections"],
             m['offgraph_requests_total{outcome="ok"}'] - m0['offgraph_requests_total{outcome="ok"}'],
             m['offgraph_requests_total{outcome="cancelled"}'] - m0['offgraph_requests_total{outcome="cancelled"}'],
             m['offgraph_requests_total{outcome="error"}'] - m0['offgraph_requests_total{outcome="error"}'],
             m['offgraph_http_timeouts_total{kind="headers"}'], m['offgraph_http_timeouts_total{kind="body"}'],
             m['offgraph_http_timeouts_total{kind="write"}'], m['offgraph_http_timeouts_total{kind="unsent"}'],
             m["offgraph_http_connections_total"]), flush=True)
    check(idle, "afterwards: a request, session or connection is left: %s"
          % {k: v for k, v in m.items() if "running" in k or "waiting" in k or "busy" in k or "http_" in k})
    check(n == base_threads, "afterwards: %d threads, %d before the floods" % (n, base_threads))
    check(m['offgraph_requests_total{outcome="error"}'] == m0['offgraph_requests_total{outcome="error"}'],
          "afterwards: requests ended in an error")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()

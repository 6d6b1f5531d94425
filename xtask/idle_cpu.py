#!/usr/bin/env python3
"""Idle CPU and CPU per call at a low rate of a `soulbased` binary (docs/performance.md).

usage: python3 xtask/idle_cpu.py [--floor BENCH_BINARY] BINARY [IDLE_SECONDS=10] [RATE_SECONDS=10] [RATE=20]

Starts BINARY on loopback with a dev config in a temporary directory (with an empty
`skills/`, so the WASM executor starts too), waits 5 s, then reports:
- idle: CPU per second over IDLE_SECONDS, context switches per second, and the
  threads that ran;
- paced: RATE HTTP invokes of the builtin echo per second over one keep-alive
  connection for RATE_SECONDS: server CPU per call, and per thread;
- flat out: the same connection one call after another for RATE_SECONDS / 2.

CPU is the sum over the process's threads of their run time (`/proc/<pid>/task/*/
schedstat`, nanoseconds). With `--floor`, BENCH_BINARY (`target/release/deps/
http_load-<hash>`, built by `cargo build --release -p soulbased --benches`) is then
started as the bare axum floor of the `http_load` bench (`BENCH_ROLE=floor-http`)
and given the same paced load, and the ratio governed/floor of CPU per call is
reported. With `BENCH_FLOOR_FSYNC=1` in the environment that floor is the durable
one: it answers each call once the call is on disk (docs/performance.md, Method).
"""
import http.client, os, subprocess, sys, time

from dev_server import echo, server_args, workspace

args = sys.argv[1:]
floor_bin = None
if args[:1] == ["--floor"]:
    floor_bin, args = args[1], args[2:]
if not args:
    sys.exit(__doc__)
binary = args[0]
idle_s = float(args[1]) if len(args) > 1 else 10
rate_s = float(args[2]) if len(args) > 2 else 10
rate = float(args[3]) if len(args) > 3 else 20


def threads(pid):
    """(tid, name) -> (run time in s from schedstat, context switches)."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{t}/comm").read().strip()
            run = int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0]) / 1e9
            sw = sum(int(l.split()[1]) for l in open(f"/proc/{pid}/task/{t}/status")
                     if "ctxt_switches" in l)
            out[(t, name)] = (run, sw)
        except FileNotFoundError:
            pass
    return out


def cpu(pid):
    """The process's CPU time in s, summed over its threads (as `threads` reads it)."""
    return sum(run for run, _ in threads(pid).values())


def used(t0, t1):
    """CPU seconds the threads of snapshot `t1` ran since snapshot `t0` (a thread that
    ended in between is in neither sum)."""
    return sum(run - t0.get(k, (0, 0))[0] for k, (run, _) in t1.items())


def faults(pid):
    """(minor, major) page faults of the process so far (`/proc/<pid>/stat`, fields 10
    and 12): a fault a call is kernel work a call, and at a low rate the allocator
    returning freed pages to the system between calls shows up here."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[7]), int(fields[9])


def report(t0, t1, per, unit):
    rows = []
    for k, (run, sw) in t1.items():
        r0, s0 = t0.get(k, (0, 0))
        if run - r0 > 0:
            rows.append((run - r0, sw - s0, k[1]))
    for run, sw, name in sorted(rows, reverse=True)[:6]:
        print(f"  {name}: {1000 * run / per:.2f} ms, {sw / per:.1f} switches per {unit}")


def paced(pid, conn, who):
    """RATE invokes a second on `conn` for RATE_SECONDS, after 20 to warm up; returns
    the server's CPU per call in ms."""
    for _ in range(20):
        echo(conn)
    n = int(rate_s * rate)
    f0, t0, s0 = faults(pid), threads(pid), time.monotonic()
    for i in range(n):
        time.sleep(max(0, s0 + i / rate - time.monotonic()))
        echo(conn)
    time.sleep(max(0, s0 + n / rate - time.monotonic()))
    t1, s1, f1 = threads(pid), time.monotonic(), faults(pid)
    total = 1000 * used(t0, t1)
    print(f"{who}, {rate:g} calls/s: {n} calls in {s1 - s0:.1f} s, server CPU {total:.0f} ms = {total / n:.3f} ms/call, "
          f"page faults {(f1[0] - f0[0]) / n:.1f} minor, {(f1[1] - f0[1]) / n:.2f} major a call")
    report(t0, t1, n, "call")
    return total / n


d, env = workspace()
p = subprocess.Popen(server_args(binary, d), cwd=d, stdout=subprocess.PIPE, text=True, env=env)
addr = None
for line in p.stdout:
    if line.startswith("soulbased: http listening on "):
        addr = line.split()[-1]
    if line.strip() == "soulbased: ready":
        break

time.sleep(5)
t0, s0 = threads(p.pid), time.monotonic()
time.sleep(idle_s)
t1, s1 = threads(p.pid), time.monotonic()
el = s1 - s0
idle_cpu = used(t0, t1)
switches = sum(sw - t0.get(k, (0, 0))[1] for k, (_, sw) in t1.items() if k in t0)
print(f"idle: {1000 * idle_cpu / el:.2f} ms CPU/s over {el:.1f} s, {switches / el:.1f} context switches/s")
report(t0, t1, el, "second")

conn = http.client.HTTPConnection(addr)
governed = paced(p.pid, conn, "governed")

c0, s0, k = cpu(p.pid), time.monotonic(), 0
while time.monotonic() - s0 < rate_s / 2:
    echo(conn)
    k += 1
c1, s1 = cpu(p.pid), time.monotonic()
print(f"flat out, one connection: {k / (s1 - s0):.0f} calls/s, server CPU {1000 * (c1 - c0) / k:.3f} ms/call")
conn.close()
p.terminate()
p.wait(30)

if floor_bin:
    env["BENCH_ROLE"] = "floor-http"
    f = subprocess.Popen([os.path.abspath(floor_bin)], cwd=d, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    line = f.stdout.readline()
    if not line.startswith("floor listening on "):
        sys.exit(f"the floor did not start: {line!r}")
    conn = http.client.HTTPConnection(line.split()[-1])
    time.sleep(1)
    floor = paced(f.pid, conn, "floor")
    conn.close()
    f.stdin.close()
    f.wait(30)
    print(f"ratio governed/floor, CPU per call at {rate:g} calls/s: {governed / floor:.2f}")

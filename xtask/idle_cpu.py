#!/usr/bin/env python3
"""Idle CPU and CPU per call at a low rate of a `soulbased` binary (docs/performance.md).

usage: python3 xtask/idle_cpu.py BINARY [IDLE_SECONDS=10] [RATE_SECONDS=10] [RATE=20]

Starts BINARY on loopback with a dev config in a temporary directory (with an empty
`skills/`, so the WASM executor starts too), waits 5 s, then reports:
- idle: CPU (utime + stime from /proc/<pid>/stat, 10 ms ticks) per second over
  IDLE_SECONDS, context switches per second, and the threads that ran;
- paced: RATE HTTP invokes of the builtin echo per second over one keep-alive
  connection for RATE_SECONDS: server CPU per call, and per thread;
- flat out: the same connection one call after another for RATE_SECONDS / 2.
"""
import http.client, os, subprocess, sys, time

from dev_server import echo, server_args, workspace

binary = sys.argv[1]
idle_s = float(sys.argv[2]) if len(sys.argv) > 2 else 10
rate_s = float(sys.argv[3]) if len(sys.argv) > 3 else 10
rate = float(sys.argv[4]) if len(sys.argv) > 4 else 20
TCK = os.sysconf("SC_CLK_TCK")

d, env = workspace()
p = subprocess.Popen(server_args(binary, d), cwd=d, stdout=subprocess.PIPE, text=True, env=env)
addr = None
for line in p.stdout:
    if line.startswith("soulbased: http listening on "):
        addr = line.split()[-1]
    if line.strip() == "soulbased: ready":
        break


def cpu():
    f = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TCK


def threads():
    """(tid, name) -> (run time in s from schedstat, context switches)."""
    out = {}
    for t in os.listdir(f"/proc/{p.pid}/task"):
        try:
            name = open(f"/proc/{p.pid}/task/{t}/comm").read().strip()
            run = int(open(f"/proc/{p.pid}/task/{t}/schedstat").read().split()[0]) / 1e9
            sw = sum(int(l.split()[1]) for l in open(f"/proc/{p.pid}/task/{t}/status")
                     if "ctxt_switches" in l)
            out[(t, name)] = (run, sw)
        except FileNotFoundError:
            pass
    return out


def report(t0, t1, per, unit):
    rows = []
    for k, (run, sw) in t1.items():
        r0, s0 = t0.get(k, (0, 0))
        if run - r0 > 0:
            rows.append((run - r0, sw - s0, k[1]))
    for run, sw, name in sorted(rows, reverse=True)[:6]:
        print(f"  {name}: {1000 * run / per:.2f} ms, {sw / per:.1f} switches per {unit}")


time.sleep(5)
c0, t0, s0 = cpu(), threads(), time.monotonic()
time.sleep(idle_s)
c1, t1, s1 = cpu(), threads(), time.monotonic()
el = s1 - s0
switches = sum(sw - t0.get(k, (0, 0))[1] for k, (_, sw) in t1.items() if k in t0)
print(f"idle: {1000 * (c1 - c0) / el:.1f} ms CPU/s over {el:.1f} s, {switches / el:.0f} context switches/s")
report(t0, t1, el, "second")

conn = http.client.HTTPConnection(addr)


def call():
    echo(conn)


for _ in range(20):
    call()
n = int(rate_s * rate)
c0, t0, s0 = cpu(), threads(), time.monotonic()
for i in range(n):
    time.sleep(max(0, s0 + i / rate - time.monotonic()))
    call()
time.sleep(max(0, s0 + n / rate - time.monotonic()))
c1, t1, s1 = cpu(), threads(), time.monotonic()
total = 1000 * (c1 - c0)
print(f"{rate:g} calls/s: {n} calls in {s1 - s0:.1f} s, server CPU {total:.0f} ms = {total / n:.2f} ms/call")
report(t0, t1, n, "call")

c0, s0, k = cpu(), time.monotonic(), 0
while time.monotonic() - s0 < rate_s / 2:
    call()
    k += 1
c1, s1 = cpu(), time.monotonic()
print(f"flat out, one connection: {k / (s1 - s0):.0f} calls/s, server CPU {1000 * (c1 - c0) / k:.2f} ms/call")
conn.close()
p.terminate()
p.wait(30)

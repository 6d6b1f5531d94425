#!/usr/bin/env python3
"""Instructions per call of the builtin echo, under callgrind: the governed `soulbased`
against the bare floor of the `http_load` bench (HTTP invoke against axum) or, with
`--mcp`, of the `mcp_load` bench (MCP `tools/call` against rmcp) (docs/performance.md).

usage: python3 xtask/call_instructions.py [--mcp] SOULBASED BENCH_BINARY [CALLS=1000] [TOP=25]

BENCH_BINARY is `target/release/deps/http_load-<hash>` (or `mcp_load-<hash>` with
`--mcp`), built by `cargo build --release -p soulbased --benches`; it serves the floor
when run with `BENCH_ROLE=floor-http` (`floor-mcp`). Each server runs under
`valgrind --tool=callgrind` with instrumentation off; MCP calls go on one session,
initialized first. After 200 warm-up calls over one keep-alive connection it is
switched on (`callgrind_control -i on`) for CALLS calls one after another and half a
second more (so the drain's lingering write of those calls' evidence is counted),
then dumped. Reported: user-space instructions per call (valgrind sees no kernel
work), their ratio, the governed server's TOP crates and functions by their own
instructions per call, and the TOP functions by how many more the governed server
runs than the floor. Counts are exact for the same build and load, so two builds
compare without the noise of timing on a shared VM.
"""
import http.client, json, os, re, subprocess, sys, time
from collections import defaultdict

from dev_server import HEADERS, echo, server_args, workspace

args = sys.argv[1:]
mcp = args[:1] == ["--mcp"]
if mcp:
    args = args[1:]
if len(args) < 2:
    sys.exit(__doc__)
soulbased, floor_bin = args[0], args[1]
calls = int(args[2]) if len(args) > 2 else 1000
top = int(args[3]) if len(args) > 3 else 25

MCP_HEADERS = dict(HEADERS, accept="application/json, text/event-stream")


def mcp_message(r, rid):
    """The JSON-RPC message with id `rid` in a response, JSON or server-sent events."""
    body = r.read().decode()
    assert r.status == 200, (r.status, body)
    if r.getheader("content-type", "").startswith("text/event-stream"):
        texts = [l[5:].strip() for l in body.splitlines() if l.startswith("data:")]
    else:
        texts = [body]
    for t in texts:
        if t:
            msg = json.loads(t)
            if msg.get("id") == rid:
                return msg
    raise AssertionError(f"no message with id {rid} in {body!r}")


class McpSession:
    """An MCP session on one connection: initialized, then `tools/call` of the echo."""

    def __init__(self, conn):
        self.conn, self.id = conn, 0
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "call_instructions", "version": "0"}}}
        conn.request("POST", "/mcp", body=json.dumps(init), headers=MCP_HEADERS)
        r = conn.getresponse()
        assert "result" in mcp_message(r, 0)
        self.headers = dict(MCP_HEADERS, **{"mcp-session-id": r.getheader("mcp-session-id"),
                                            "mcp-protocol-version": "2025-06-18"})
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        conn.request("POST", "/mcp", body=json.dumps(note), headers=self.headers)
        r = conn.getresponse()
        r.read()
        assert r.status == 202, r.status

    def call(self):
        self.id += 1
        body = ('{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":'
                '{"name":"soulbase.builtin.echo","arguments":{"x":1}}}' % self.id)
        self.conn.request("POST", "/mcp", body=body, headers=self.headers)
        msg = mcp_message(self.conn.getresponse(), self.id)
        assert msg["result"]["isError"] is False, msg


def profile(governed):
    d, env = workspace()
    vg = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg.%p", "--instr-atstart=no"]
    if governed:
        cmd = vg + server_args(soulbased, d)
    else:
        env["BENCH_ROLE"] = "floor-mcp" if mcp else "floor-http"
        cmd = vg + [os.path.abspath(floor_bin)]
    p = subprocess.Popen(cmd, cwd=d, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=env, stderr=open(f"{d}/valgrind.log", "w"))
    addr = None
    for line in p.stdout:
        if line.startswith(("soulbased: http listening on ", "floor listening on ")):
            addr = line.split()[-1]
            if not governed:
                break
        if line.strip() == "soulbased: ready":
            break
    if addr is None:
        sys.exit(f"the server did not start; see {d}/valgrind.log")
    conn = http.client.HTTPConnection(addr, timeout=120)

    if mcp:
        call = McpSession(conn).call
    else:
        def call():
            echo(conn)

    for _ in range(200):
        call()

    def ctl(*args):
        subprocess.run(["callgrind_control", *args, str(p.pid)], check=True, capture_output=True)

    ctl("-i", "on")
    for _ in range(calls):
        call()
    time.sleep(0.5)
    ctl("-d")
    conn.close()
    p.terminate()
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    dumps = [f for f in os.listdir(d) if re.fullmatch(r"cg\.\d+\.\d+", f)]
    if not dumps:
        sys.exit(f"no callgrind dump; see {d}/valgrind.log")
    out = subprocess.run(["callgrind_annotate", "--threshold=100", os.path.join(d, dumps[0])],
                         check=True, capture_output=True, text=True).stdout
    total, funcs = 0, []
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        n = int(m.group(1).replace(",", ""))
        if m.group(2).startswith("PROGRAM TOTALS"):
            total = n
        else:
            funcs.append((n, m.group(2)))
    return total, funcs


def crate_of(name):
    """The crate of a `file:function [object]` line (a shared library's name for C code)."""
    m = re.match(r"(.*?) \[(.*)\]$", name)
    entry, obj = (m.group(1), m.group(2)) if m else (name, "")
    # `file:function`: the file part never holds `::`.
    fn = re.sub(r"^[^:]*:(?!:)", "", entry, count=1).lstrip("<&*")
    m = re.match(r"(?:dyn )?([a-z_][a-z0-9_]*)::", fn)
    if m:
        return m.group(1)
    if obj and not obj.endswith(os.path.basename(soulbased)):
        return os.path.basename(obj)
    return "other: " + fn[:40]


governed, gfuncs = profile(True)
floor, ffuncs = profile(False)
print(f"instructions per call: governed {governed / calls:,.0f}, floor {floor / calls:,.0f}, "
      f"ratio {governed / max(floor, 1):.2f}")
by_crate = defaultdict(int)
for n, name in gfuncs:
    by_crate[crate_of(name)] += n
print("governed, by crate (self instructions per call):")
for c, n in sorted(by_crate.items(), key=lambda kv: -kv[1])[:top]:
    print(f"  {n / calls:>9,.0f}  {c}")
print("governed, by function:")
for n, name in sorted(gfuncs, reverse=True)[:top]:
    print(f"  {n / calls:>9,.0f}  {name[:150]}")


def by_function(funcs):
    """Self instructions by function, named without the binary it is in (so the
    governed server's and the floor's copies of a library function meet)."""
    out = defaultdict(int)
    for n, name in funcs:
        out[re.sub(r"^\?\?\?:", "", re.sub(r" \[.*\]$", "", name))] += n
    return out


# Approximate: the two binaries inline differently, so a function's work may sit
# under another name in one of them; read it as where to look.
g, f = by_function(gfuncs), by_function(ffuncs)
excess = sorted(((g.get(k, 0) - f.get(k, 0), k) for k in set(g) | set(f)), reverse=True)
print("excess over the floor, by function (governed - floor, self instructions per call):")
for n, name in excess[:top]:
    print(f"  {n / calls:>9,.0f}  {name[:150]}")

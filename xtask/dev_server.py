"""What the measuring scripts in xtask/ share (`idle_cpu.py`, `call_instructions.py`):
a `soulbased` dev configuration in a temporary working directory, and the HTTP
invoke of the builtin echo they load it with."""
import os, tempfile

CONFIG = """server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"] }
"""
HEADERS = {"content-type": "application/json", "x-soulbase-tenant": "acme", "x-soulbase-actor": "bench"}


def workspace():
    """A temporary working directory with `config.yaml` and an empty `skills/` (so the
    WASM executor starts too), and the environment to start a server in: no
    `SOULBASE_` overrides, only errors logged."""
    d = tempfile.mkdtemp()
    with open(f"{d}/config.yaml", "w") as f:
        f.write(CONFIG)
    os.mkdir(f"{d}/skills")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOULBASE_")}
    env["RUST_LOG"] = "error"
    return d, env


def server_args(binary, d):
    """`binary` on loopback ports of its own choosing, with the workspace's config."""
    return [os.path.abspath(binary), "--config", f"{d}/config.yaml",
            "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]


def echo(conn):
    """One invoke of the builtin echo on `conn`; it must answer 200."""
    conn.request("POST", "/api/tools/soulbase.builtin.echo/invoke", body=b'{"x":1}', headers=HEADERS)
    r = conn.getresponse()
    r.read()
    assert r.status == 200, r.status

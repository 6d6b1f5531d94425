"""Drives one MCP session of soulbased with the official MCP Python SDK: asks for
the session's log (`logging/setLevel`), makes a call with a progress token, a
refused call, and a slow call it cancels; prints one JSON document of the log
messages and progress it received, for the Rust test
(crates/soulbased/tests/mcp_python.rs) to judge.

Usage: python mcp_session.py URL CANCELLED_CALL_ID
"""

import asyncio
import json
import sys

import anyio
from mcp import Client


async def main(url: str, cancelled_id: str) -> None:
    logs = []
    progress = []

    async def on_log(params):
        logs.append({"level": params.level, "logger": params.logger, "data": params.data})

    async def on_progress(value, total, message):
        progress.append({"progress": value, "total": total, "message": message})

    out = {}
    # Logging is a session feature of the 2025 protocol (the 2026 one asks per
    # request): a legacy session asks for it once and gets one message per call.
    async with Client(url, mode="legacy", logging_callback=on_log) as client:
        await client.set_logging_level("info")
        await client.call_tool("soulbase.builtin.echo", {"a": 0})
        await client.call_tool("soulbase.builtin.sleep", {"ms": "soon"})
        await client.call_tool("soulbase.builtin.echo", {"b": 0})
        # Messages travel on the session's own stream, beside the answers.
        with anyio.move_on_after(10):
            while len(logs) < 3:
                await anyio.sleep(0.02)
    async with Client(url) as client:
        ok = await client.call_tool("soulbase.builtin.echo", {"a": 1}, progress_callback=on_progress)
        out["ok"] = ok.structured_content
        refused = await client.call_tool("soulbase.builtin.sleep", {"ms": "soon"})
        out["refused"] = refused.structured_content
        with anyio.move_on_after(1.0) as scope:
            await client.call_tool(
                "soulbase.builtin.sleep", {"ms": 20000}, meta={"soulbase/callId": cancelled_id}
            )
        out["cancelled"] = scope.cancelled_caught
        # A call after the cancellation still works.
        after = await client.call_tool("soulbase.builtin.echo", {"b": 2})
        out["after"] = after.structured_content
    out["logs"] = logs
    out["progress"] = progress
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1], sys.argv[2]), 60))

"""Calls soulbased's MCP endpoint with the official MCP Python SDK, passing call
options in `params._meta`; prints one JSON line per call for the Rust test
(crates/soulbased/tests/mcp_python.rs) to judge.

Usage: python mcp_meta.py URL CONSENT_TOKEN TRACEPARENT
"""

import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url: str, consent: str, traceparent: str) -> None:
    headers = {"x-soulbase-tenant": "acme", "x-soulbase-actor": "py"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()

                async def call(label, name, args, meta=None):
                    r = await session.call_tool(name, args, meta=meta)
                    print(
                        json.dumps(
                            {
                                "label": label,
                                "is_error": bool(r.is_error),
                                "structured": r.structured_content,
                            }
                        ),
                        flush=True,
                    )

                key = {"soulbase/idempotencyKey": "py-key-1"}
                # A keyed tool retried with its key: one execution.
                for i in range(3):
                    await call(f"keyed-{i}", "soulbase.builtin.counter", {}, key)
                await call(
                    "keyed-other",
                    "soulbase.builtin.counter",
                    {},
                    {"soulbase/idempotencyKey": "py-key-2"},
                )
                await call("keyed-missing", "soulbase.builtin.counter", {})
                await call("consent-missing", "skills.memo.memo", {"text": "x"})
                await call(
                    "consent", "skills.memo.memo", {"text": "x"}, {"soulbase/consent": consent}
                )
                await call(
                    "trace", "soulbase.builtin.echo", {"a": 1}, {"traceparent": traceparent}
                )
                await call(
                    "trace-malformed", "soulbase.builtin.echo", {}, {"traceparent": "garbage"}
                )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))

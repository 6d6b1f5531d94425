"""Elicitation for consent with the official MCP Python SDK: a client that
declares elicitation is asked (`elicitation/create`) before a tool that needs
consent runs; one that does not declare it is refused as before. Prints one
JSON line per call (and one per question asked) for the Rust test
(crates/soulbased/tests/mcp_python.rs) to judge.

Usage: python mcp_elicit.py URL
"""

import asyncio
import json
import sys

import httpx2
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

HEADERS = {"x-soulbase-tenant": "acme", "x-soulbase-actor": "py"}


def report(label, r):
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


async def session_with(url, callback, calls):
    async with httpx2.AsyncClient(headers=HEADERS, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            kwargs = {"elicitation_callback": callback} if callback else {}
            async with ClientSession(read, write, **kwargs) as session:
                await session.initialize()
                for label, args in calls:
                    report(label, await session.call_tool("skills.memo.memo", args))


async def main(url: str) -> None:
    answers = iter(["accept", "decline"])

    async def answer(context, params):
        action = next(answers)
        print(
            json.dumps(
                {
                    "label": f"asked-{action}",
                    "message": params.message,
                    "schema": params.requested_schema,
                }
            ),
            flush=True,
        )
        if action == "accept":
            return types.ElicitResult(action="accept", content={"approve": True})
        return types.ElicitResult(action="decline")

    # Asked, approved: the call runs. Asked again (a new call), declined: refused.
    await session_with(
        url, answer, [("approved", {"text": "one"}), ("declined", {"text": "two"})]
    )
    # A client that cannot be asked is refused, as before.
    await session_with(url, None, [("not-asked", {"text": "three"})])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))

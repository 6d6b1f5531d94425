"""A running tool's own requests to the client, with the official MCP Python
SDK: the conformance pack's `test_elicitation` asks the user
(`elicitation/create`) and `test_sampling` the client's model
(`sampling/createMessage`) while they run. Prints one JSON line per call and
per request the client answered, for the Rust test
(crates/soulbased/tests/mcp_python.rs) to judge.

Usage: python mcp_asks.py URL
"""

import asyncio
import json
import sys

import httpx2
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

HEADERS = {"x-soulbase-tenant": "acme", "x-soulbase-actor": "py"}


def emit(line):
    print(json.dumps(line), flush=True)


def report(label, r):
    text = "".join(c.text for c in r.content if getattr(c, "type", "") == "text")
    emit(
        {
            "label": label,
            "is_error": bool(r.is_error),
            "text": text,
            "structured": r.structured_content,
        }
    )


async def elicited(context, params):
    emit({"label": "asked-elicitation", "message": params.message,
          "schema": params.requested_schema})
    return types.ElicitResult(
        action="accept", content={"username": "ada", "email": "ada@example.com"}
    )


async def sampled(context, params):
    emit({"label": "asked-sampling",
          "prompt": params.messages[0].content.text,
          "max_tokens": params.max_tokens})
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text="forty-two"),
        model="scripted-model",
        stop_reason="endTurn",
    )


async def session(url, calls, **callbacks):
    async with httpx2.AsyncClient(headers=HEADERS, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write, **callbacks) as s:
                await s.initialize()
                for label, tool, args in calls:
                    report(label, await s.call_tool(tool, args))


async def main(url: str) -> None:
    # A client that answers both: the elicitation runs; sampling is asked only
    # if the tenant's grant allows it (the Rust test's config decides).
    await session(
        url,
        [
            ("elicitation", "test_elicitation", {"message": "Who are you?"}),
            ("sampling", "test_sampling", {"prompt": "The answer?"}),
        ],
        elicitation_callback=elicited,
        sampling_callback=sampled,
    )
    # A client that declares neither cannot be asked: the tool fails.
    await session(
        url, [("no-client", "test_elicitation", {"message": "Anyone?"})]
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))

"""Drives one MCP session of soulbased with the official MCP Python SDK against the
conformance fixture pack (`server.mcp_conformance_tools`): lists the tools, calls
them by their plain MCP names, collects the content blocks, log messages and
progress each call produced; prints one JSON document for the Rust test
(crates/soulbased/tests/mcp_content.rs) to judge.

Usage: python mcp_content.py URL IMAGE_CALL_ID
"""

import asyncio
import json
import sys

import anyio

from mcp import Client


def blocks(result):
    return [c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in result.content]


async def main(url: str, image_call_id: str) -> None:
    logs = []
    progress = []

    async def on_log(params):
        logs.append({"level": params.level, "logger": params.logger, "data": params.data})

    async def on_progress(value, total, message):
        progress.append({"progress": value, "total": total, "message": message})

    out = {}
    async with Client(url, mode="legacy", logging_callback=on_log) as client:
        listed = await client.list_tools()
        out["tools"] = {t.name: t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in listed.tools}
        await client.set_logging_level("debug")
        calls = {}
        for name in [
            "test_simple_text",
            "test_audio_content",
            "test_embedded_resource",
            "test_multiple_content_types",
        ]:
            r = await client.call_tool(name, {})
            calls[name] = {"is_error": r.is_error, "content": blocks(r), "structured": r.structured_content}
        r = await client.call_tool("test_image_content", {}, meta={"soulbase/callId": image_call_id})
        calls["test_image_content"] = {"is_error": r.is_error, "content": blocks(r)}
        r = await client.call_tool("test_error_handling", {})
        calls["test_error_handling"] = {"is_error": r.is_error, "content": blocks(r)}
        r = await client.call_tool("json_schema_2020_12_tool", {"name": "n", "address": {"city": "c"}})
        calls["json_schema_2020_12_tool"] = {"is_error": r.is_error, "content": blocks(r)}
        r = await client.call_tool("json_schema_2020_12_tool", {"unknown": 1})
        calls["json_schema_refused"] = {"is_error": r.is_error, "structured": r.structured_content}
        # The id names the same tool.
        r = await client.call_tool("soulbase.conformance.simple_text", {})
        calls["by_id"] = {"is_error": r.is_error, "content": blocks(r)}
        r = await client.call_tool("test_tool_with_logging", {})
        calls["test_tool_with_logging"] = {"is_error": r.is_error, "content": blocks(r)}
        # Log messages travel on the session's own stream, beside the answers:
        # the tool's three and the call's own.
        def of_logging_tool():
            return [l for l in logs if (l["data"] or {}).get("tool") == "test_tool_with_logging"]

        with anyio.move_on_after(10):
            while len(of_logging_tool()) < 4:
                await anyio.sleep(0.02)
        out["logging_logs"] = of_logging_tool()
        r = await client.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
        calls["test_tool_with_progress"] = {"is_error": r.is_error, "content": blocks(r)}
        out["calls"] = calls
    out["progress"] = progress
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1], sys.argv[2]), 60))

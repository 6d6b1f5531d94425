"""Reads soulbased's skills as MCP resources and prompts with the official MCP
Python SDK (a standard client), then follows one resource: prints one JSON
document of what it saw, `LISTENING` once subscribed, and one JSON line per
change event, for the Rust test (crates/soulbased/tests/mcp_python.rs) to judge.

Usage: python mcp_resources.py URL
"""

import asyncio
import base64
import json
import sys

from mcp import Client
from mcp.types import ResourceTemplateReference


async def main(url: str) -> None:
    async with Client(url) as client:
        out = {}
        listed = await client.list_resources()
        out["resources"] = [str(r.uri) for r in listed.resources]
        reads = {}
        for r in listed.resources:
            got = await client.read_resource(str(r.uri))
            c = got.contents[0]
            reads[str(r.uri)] = {
                "text": getattr(c, "text", None),
                "blob_hex": base64.b64decode(c.blob).hex() if getattr(c, "blob", None) else None,
                "mime": c.mime_type,
            }
        out["reads"] = reads
        templates = await client.list_resource_templates()
        out["templates"] = [t.uri_template for t in templates.resource_templates]
        prompts = await client.list_prompts()
        out["prompts"] = [p.name for p in prompts.prompts]
        got = await client.get_prompt("notes", {"task": "Summarize my notes."})
        out["prompt"] = [m.content.text for m in got.messages]
        done = await client.complete(
            ResourceTemplateReference(uri="skill://{name}/SKILL.md"),
            {"name": "name", "value": "no"},
        )
        out["complete"] = done.completion.values
        try:
            await client.read_resource("skill://hidden/SKILL.md")
            out["hidden"] = "read"
        except Exception as e:  # the SDK raises MCPError
            out["hidden"] = str(e)
        print(json.dumps(out), flush=True)

        async with client.listen(resource_subscriptions=["skill://notes/SKILL.md"]) as sub:
            print("LISTENING", flush=True)
            async for event in sub:
                print(json.dumps({"event": type(event).__name__, "uri": str(getattr(event, "uri", ""))}), flush=True)
                break


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1]), 60))

"""Talks to soulbased's governed agent loop with the official OpenAI Python client
(`openai`), authenticated by a Soulbase API key as its `api_key`: one plain
conversation, one streamed, and one for a model the tenant may not use. Prints
one JSON document for the Rust test (crates/soulbased/tests/agent.rs) to judge.

Usage: python openai_chat.py BASE_URL API_KEY
"""

import json
import sys

import openai
from openai import OpenAI


def main(base_url: str, api_key: str) -> None:
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)
    ask = [{"role": "user", "content": "Echo hello."}]
    out = {}
    plain = client.chat.completions.create(model="gpt-test", messages=ask)
    out["plain"] = plain.choices[0].message.content
    out["plain_summary"] = (plain.model_extra or {}).get("soulbase")
    chunks = list(client.chat.completions.create(model="gpt-test", messages=ask, stream=True))
    out["stream"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    out["stream_finish"] = chunks[-1].choices[0].finish_reason
    out["stream_chunks"] = len(chunks)
    try:
        client.chat.completions.create(model="claude-x", messages=ask)
        out["forbidden"] = None
    except openai.PermissionDeniedError as e:
        out["forbidden"] = e.status_code
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

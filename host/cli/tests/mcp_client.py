"""A real MCP client for the tests, built on the official Python SDK (`mcp` on PyPI).

It connects to a clawcage MCP server, lists the tools and makes the calls it is given, then
prints one JSON object on stdout with what the server answered; the Rust tests assert on it.

    python mcp_client.py CALLS_JSON stdio COMMAND [ARG...]
    python mcp_client.py CALLS_JSON http URL

CALLS_JSON is a JSON list of {"name": TOOL, "arguments": {...}}, or of lists of them: the calls
of a list are made concurrently, in one session. A call naming a tool the server does not list
is skipped and reported as {"skipped": true}.

With MCP_ELICIT_ANSWERS set to a JSON list of decisions ("allow-once", "allow-always", "deny",
or "decline"), the client declares elicitation and answers the server's elicitation requests with
them in order (the messages are reported under "elicitations").
"""

import asyncio
import json
import os
import sys
from datetime import timedelta

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client


async def exercise(session: ClientSession, calls: list) -> dict:
    initialized = await session.initialize()
    listed = await session.list_tools()
    tools = {
        tool.name: {"description": tool.description, "input_schema": tool.inputSchema}
        for tool in listed.tools
    }

    async def one(call: dict) -> dict:
        if call["name"] not in tools:
            return {"name": call["name"], "skipped": True}
        result = await session.call_tool(
            call["name"], call.get("arguments", {}), read_timeout_seconds=timedelta(seconds=120)
        )
        return {
            "name": call["name"],
            "is_error": bool(result.isError),
            "text": "\n".join(
                block.text for block in result.content if getattr(block, "type", "") == "text"
            ),
        }

    results = []
    for call in calls:
        if isinstance(call, list):
            results.extend(await asyncio.gather(*(one(each) for each in call)))
        else:
            results.append(await one(call))
    return {
        "server": {
            "name": initialized.serverInfo.name,
            "version": initialized.serverInfo.version,
            "protocol_version": str(initialized.protocolVersion),
            "instructions": initialized.instructions,
        },
        "tools": tools,
        "calls": results,
    }


ELICITATIONS: list = []


def elicitation_callback():
    answers = os.environ.get("MCP_ELICIT_ANSWERS")
    if answers is None:
        return None
    queue = json.loads(answers)

    async def answer(_context, params):
        ELICITATIONS.append({"message": params.message, "schema": params.requestedSchema})
        decision = queue.pop(0) if queue else "decline"
        if decision == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"decision": decision})

    return answer


async def main() -> None:
    calls = json.loads(sys.argv[1])
    callback = elicitation_callback()
    transport = sys.argv[2]
    if transport == "stdio":
        parameters = StdioServerParameters(
            command=sys.argv[3], args=sys.argv[4:], env=dict(os.environ)
        )
        async with stdio_client(parameters) as (read, write):
            async with ClientSession(read, write, elicitation_callback=callback) as session:
                report = await exercise(session, calls)
    elif transport == "http":
        async with streamablehttp_client(sys.argv[3]) as (read, write, _session_id):
            async with ClientSession(read, write, elicitation_callback=callback) as session:
                report = await exercise(session, calls)
    else:
        raise SystemExit(f"unknown transport {transport!r}; use stdio or http")
    report["elicitations"] = ELICITATIONS
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())

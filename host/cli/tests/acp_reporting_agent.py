"""An external ACP agent that reports what it used, for the budget and scrubbing tests.

It speaks newline-delimited JSON-RPC on stdio. Its prompt streams the value of $SECRET_TO_LEAK
cut across two `agent_message_chunk` updates (as a model told a key might), then ends its turn
reporting $REPORTED_TOKENS tokens in ACP's `usage`.
"""

import json
import os
import sys

secret = os.environ.get("SECRET_TO_LEAK", "")
tokens = int(os.environ.get("REPORTED_TOKENS", "0"))


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def chunk(session_id, text):
    send({
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": session_id,
            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
        },
    })


for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    method = message.get("method", "")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": message["id"],
              "result": {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": message["id"], "result": {"sessionId": "report-1"}})
    elif method == "session/prompt":
        half = len(secret) // 2
        chunk("report-1", "The key is " + secret[:half])
        chunk("report-1", secret[half:] + ", and the work is done.")
        send({"jsonrpc": "2.0", "id": message["id"],
              "result": {"stopReason": "end_turn",
                         "usage": {"totalTokens": tokens, "inputTokens": tokens - 100, "outputTokens": 100}}})

"""An external ACP agent that hangs, for the time-limit tests of external agents.

It speaks newline-delimited JSON-RPC on stdio, writes its pid to $HUNG_PID_FILE, and stops
answering at the step $HUNG_AT names:

  initialize   never answers `initialize`;
  session/new  answers `initialize`, never `session/new`;
  cancel       answers `initialize` and `session/new`, never `session/prompt`, and ignores
               `session/cancel`.

Each method it receives is appended to $HUNG_LOG_FILE. A hung agent does not end when its
stdin closes, and ignores SIGTERM: only SIGKILL ends it.
"""

import json
import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
hang_at = os.environ.get("HUNG_AT", "initialize")
with open(os.environ["HUNG_PID_FILE"], "w") as pid_file:
    pid_file.write(str(os.getpid()))


def log(method):
    with open(os.environ["HUNG_LOG_FILE"], "a") as log_file:
        log_file.write(method + "\n")


def answer(request_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    method = message.get("method", "")
    log(method)
    if method == "initialize" and hang_at != "initialize":
        answer(
            message["id"],
            {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []},
        )
    elif method == "session/new" and hang_at == "cancel":
        answer(message["id"], {"sessionId": "hung-1"})

# Hung: stdin closed, but the process stays.
while True:
    time.sleep(3600)

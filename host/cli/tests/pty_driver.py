"""Drive a program through a pseudo-terminal the way a person at a keyboard does.

Usage: python3 pty_driver.py STEPS_JSON -- PROGRAM ARGS...

The program runs with a pseudo-terminal as its controlling terminal (so Ctrl-C becomes SIGINT,
as in a real terminal) and a 120x40 window. STEPS_JSON is a list of steps:
  {"send": "text"}                 write the text in ONE write (a paste, or tmux send-keys)
  {"expect": "regex", "timeout": s} wait until the output since the last expect matches
  {"sleep": s}                      wait
Prints one JSON object: {"ok": bool, "failed_step": n or null, "output": all output (ANSI kept),
"marks": [[step, seconds since start, output length]]}. Exits 0 even when a step fails; the
caller asserts on the report.
"""

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time


def main():
    separator = sys.argv.index("--")
    steps = json.loads(sys.argv[1])
    program = sys.argv[separator + 1 :]
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(program[0], program)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    started = time.monotonic()
    output = bytearray()
    searched_from = 0
    marks = []
    failed = None

    def pump(deadline):
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.05))
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    return False
                if not chunk:
                    return False
                output.extend(chunk)
                return True

    for number, step in enumerate(steps):
        if "send" in step:
            os.write(fd, step["send"].encode())
        elif "sleep" in step:
            deadline = time.monotonic() + step["sleep"]
            while time.monotonic() < deadline and pump(deadline):
                pass
        elif "expect" in step:
            pattern = re.compile(step["expect"].encode(), re.S)
            deadline = time.monotonic() + step.get("timeout", 30)
            matched = None
            while True:
                matched = pattern.search(output, searched_from)
                if matched or time.monotonic() >= deadline:
                    break
                if not pump(deadline):
                    matched = pattern.search(output, searched_from)
                    break
            if not matched:
                failed = number
                break
            searched_from = matched.end()
        marks.append([number, round(time.monotonic() - started, 3), len(output)])

    # Let the program finish what it prints, then stop it.
    end = time.monotonic() + 0.5
    while time.monotonic() < end and pump(end):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    print(
        json.dumps(
            {
                "ok": failed is None,
                "failed_step": failed,
                "output": output.decode("utf-8", "replace"),
                "marks": marks,
            }
        )
    )


main()

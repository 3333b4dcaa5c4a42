"""Drive a program through a pseudo-terminal the way a person at a keyboard does.

Usage: python3 pty_driver.py STEPS_JSON -- PROGRAM ARGS...

The program runs with a pseudo-terminal as its controlling terminal (so Ctrl-C becomes SIGINT,
as in a real terminal) and a 120x40 window. STEPS_JSON is a list of steps:
  {"send": "text"}                 write the text in ONE write (a paste, or tmux send-keys)
  {"expect": "regex", "timeout": s} wait until the output since the last expect matches
  {"sleep": s}                      wait
  {"screen": "name"}                keep the screen as a terminal shows it now, under that name
  {"signal": n}                     send signal n to the program
  {"exited": s}                     wait up to s seconds for the program to end; keep its status
  {"echo": "name"}                  keep whether the terminal echoes now (its line discipline's ECHO)
  {"wait_file": path, "timeout": s}  wait (reading the output) until the file exists: the test
                                    says when something outside the terminal has happened
Prints one JSON object: {"ok": bool, "failed_step": n or null, "output": all output (ANSI kept),
"echo": {name: bool}, "status": the wait status of an ended program or null,
"marks": [[step, seconds since start, output length]], "screens": {name: [the 40 lines of the
screen]} or null when no terminal emulator is installed, "screen_error": why}. The screen is
rendered by pyte (a VT100 emulator) from everything written so far. Exits 0 even when a step
fails; the caller asserts on the report.
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

try:
    import pyte
except ImportError as error:  # the caller decides whether that is a skip or a failure
    pyte = None
    PYTE_ERROR = str(error)
else:
    PYTE_ERROR = None


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
    echo = {}
    status = None
    screens = {} if pyte else None
    if pyte:
        screen = pyte.Screen(120, 40)
        stream = pyte.ByteStream(screen)
        fed = [0]

    def snapshot():
        stream.feed(bytes(output[fed[0]:]))
        fed[0] = len(output)
        return list(screen.display)

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
        elif "signal" in step:
            os.kill(pid, step["signal"])
        elif "exited" in step:
            deadline = time.monotonic() + step["exited"]
            while status is None and time.monotonic() < deadline:
                pump(time.monotonic() + 0.05)
                ended, code = os.waitpid(pid, os.WNOHANG)
                if ended:
                    status = code
            if status is None:
                failed = number
                break
        elif "echo" in step:
            echo[step["echo"]] = bool(termios.tcgetattr(fd)[3] & termios.ECHO)
        elif "screen" in step:
            if pyte:
                screens[step["screen"]] = snapshot()
        elif "wait_file" in step:
            deadline = time.monotonic() + step.get("timeout", 30)
            while not os.path.exists(step["wait_file"]) and time.monotonic() < deadline:
                if not pump(min(deadline, time.monotonic() + 0.05)):
                    break
            if not os.path.exists(step["wait_file"]):
                failed = number
                break
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
    if status is None:
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
                "screens": screens,
                "echo": echo,
                "status": status,
                "screen_error": PYTE_ERROR,
            }
        )
    )


main()

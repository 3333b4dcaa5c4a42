"""A WASI preview 2 command program built by componentize-py, run by clawcage's exec from
`[exec] programs_dir` as any published program is: it prints its arguments, reads `notes.txt`
relative to its working directory (it never changes directory itself) and, given a number,
exits with exactly that status through `wasi:cli/exit.exit-with-code`."""

import sys

from wit_world import exports
from wit_world.imports import exit as wasi_exit


class Run(exports.Run):
    def run(self) -> None:
        print("args", sys.argv[1:])
        with open("notes.txt") as notes:
            print(notes.read().strip())
        sys.stdout.flush()
        code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
        if code:
            wasi_exit.exit_with_code(code)

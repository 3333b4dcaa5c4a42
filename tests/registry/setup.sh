#!/usr/bin/env bash
# Installs what the OCI plugin tests need (tests/support/registry.rs) and prints the path of
# `wkg` as the last line of its output.
#
# - `wkg`, the Bytecode Alliance's WebAssembly package tool, pushes components to a registry the
#   way publishers do (`wkg oci push`), so the tests install what a real publisher's tool wrote,
#   not what the client under test would itself write. It comes from crates.io, pinned by
#   version here (the one place it is written) and by its lock file (`cargo install --locked`),
#   built into target/wkg/bin/wkg, its build in target/wkg/build, apart from the workspace's own
#   target directories. The build runs once: when target/wkg/bin/wkg reports the pinned version
#   nothing is built again.
# - `docker-registry` (the CNCF distribution registry, Debian's docker-registry package), the
#   registry the tests push to and install from, started on a free loopback port without TLS or
#   authentication in a temporary directory;
# - `skopeo` (Debian's skopeo package), which reads back what the registry holds (the manifest
#   and the config a push wrote) independently of both wkg and the client under test.
# The last two are system packages (.ci/run installs them); this script only checks for them.
# Exit status: 0 ready (the path printed); 3 something could not be installed (the message says
# why; the tests skip on this status only, and fail under CI); anything else: a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."

version=0.16.1

out=target/wkg
wkg=$out/bin/wkg
say() { echo "registry-setup: $*" >&2; }
cannot_install() { say "$1"; exit 3; }

command -v docker-registry >/dev/null \
    || cannot_install "docker-registry is not installed (Debian: apt-get install docker-registry)"
command -v skopeo >/dev/null \
    || cannot_install "skopeo is not installed (Debian: apt-get install skopeo)"

if [ -x "$wkg" ] && "$wkg" --version 2>/dev/null | grep -q " $version\$"; then
    echo "$PWD/$wkg"
    exit 0
fi
command -v cargo >/dev/null || cannot_install "cannot install wkg $version: cargo is not installed"
mkdir -p "$out"
say "building wkg $version from crates.io into $out (once; several minutes on 2 cores)"
CARGO_TARGET_DIR=$out/build cargo install wkg --version "$version" --locked --root "$out" --force >&2 \
    || cannot_install "cannot install wkg $version: 'cargo install wkg --version $version --locked' failed"
"$wkg" --version 2>/dev/null | grep -q " $version\$" \
    || { say "$wkg does not report version $version: $("$wkg" --version 2>&1 || true)"; exit 1; }
echo "$PWD/$wkg"

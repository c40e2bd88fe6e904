#!/usr/bin/env bash
# Builds the ggml peer: downloads llama-cpp-python's source package (which vendors
# llama.cpp's ggml), builds only ggml as static libraries, and compiles our own
# harness ggml_peer.c against it. Nothing from ggml is committed: everything lands
# in target/ggml-peer/ (gitignored).
#
#   bash bench/peers/ggml/build.sh        # prints the matmul harness path on success
#                                         # (ggml_attention_peer lands beside it)
#
# Re-running is cheap: every step is skipped when its output already exists.
set -euo pipefail

VERSION=0.3.36
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="$root/target/ggml-peer"
src="$out/llama_cpp_python-$VERSION/vendor/llama.cpp/ggml"
build="$out/build"
jobs="${GGML_BUILD_JOBS:-2}"

mkdir -p "$out"
cd "$out"

if ! command -v cmake >/dev/null 2>&1; then
    echo "ggml peer: cmake missing, installing it with apt-get" >&2
    apt-get update >/dev/null && apt-get install -y cmake >/dev/null
fi

if [ ! -f "llama_cpp_python-$VERSION.tar.gz" ]; then
    pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$out" >&2
fi
if [ ! -d "$src" ]; then
    tar xzf "llama_cpp_python-$VERSION.tar.gz"
fi

# The sdist leaves out ggml.pc.in, which a standalone ggml configure needs.
if [ ! -f "$src/ggml.pc.in" ]; then
    cat > "$src/ggml.pc.in" <<'PC'
prefix=@CMAKE_INSTALL_PREFIX@
libdir=${prefix}/lib
includedir=${prefix}/include

Name: ggml
Description: ggml (built for the Tessera benchmark peer)
Version: 0.0.0
Libs: -L${libdir} -lggml -lggml-base
Cflags: -I${includedir}
PC
fi

if [ ! -f "$build/src/libggml-cpu.a" ] && [ ! -f "$build/src/ggml-cpu/libggml-cpu.a" ]; then
    cmake -S "$src" -B "$build" \
        -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON \
        -DBUILD_SHARED_LIBS=OFF \
        -DGGML_BACKEND_DL=OFF \
        -DGGML_CCACHE=OFF \
        -DGGML_BUILD_TESTS=OFF \
        -DGGML_BUILD_EXAMPLES=OFF >&2
    cmake --build "$build" -j "$jobs" >&2
fi

libs=()
for name in ggml ggml-cpu ggml-base; do
    lib="$(find "$build" -name "lib$name.a" | head -n 1)"
    if [ -z "$lib" ]; then
        echo "ggml peer: lib$name.a not found under $build" >&2
        exit 1
    fi
    libs+=("$lib")
done

# Two harnesses: ggml_peer (matmul, run by tessera-bench) and
# ggml_attention_peer (decode attention, beside runtime/examples/attention_bench).
for name in ggml_peer ggml_attention_peer; do
    bin="$out/$name"
    if [ ! -x "$bin" ] || [ "$here/$name.c" -nt "$bin" ] || [ "$here/peer_common.h" -nt "$bin" ]; then
        cc -O2 -std=c11 -march=native -I"$src/include" "$here/$name.c" \
            -Wl,--start-group "${libs[@]}" -Wl,--end-group \
            -lstdc++ -lm -lpthread -fopenmp -o "$bin"
    fi
done
echo "$out/ggml_peer"

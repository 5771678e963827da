#!/usr/bin/env bash
# Regenerate the images' hashed locks (docker/locks/*.txt) from pyproject.toml and
# docker/locks/*.in:
#
#     docker/lock.sh
#
# Each lock pins every distribution with its PyPI hashes for CPython 3.11 on x86_64 Linux
# (Debian bookworm's Python, which the images use); the images install them with
# `pip install --require-hashes --no-deps --only-binary :all:`, so a build either gets
# exactly these files or fails. Resolves against PyPI only (no local indexes or wheel
# directories), so the hashes are the ones any machine will download.
#   api.txt    the project's dependencies (the API image: no TensorFlow)
#   cpu.txt    + the docker extra and tensorflow-cpu (the CPU worker image)
#   gpu.txt    + tensorflow[and-cuda] and the pinned CUDA 12.5 / cuDNN 9.3 wheels
#   build.txt  setuptools and wheel, to build the project's wheel in the image
#   s3.txt     SeaweedFS's wheel, for the compose stack's object store (docker/s3.Dockerfile)
# Needs `uv` on PATH (pip install uv; the project's `deploy` extra has it).
set -euo pipefail
cd "$(dirname "$0")/.."

UV="${UV:-uv}"
if ! command -v "$UV" >/dev/null 2>&1 && [[ -x .venv/bin/uv ]]; then UV=.venv/bin/uv; fi

compile() {
    local out="$1"
    shift
    # No find-links/extra indexes from the environment: hashes must be PyPI's.
    env -u PIP_FIND_LINKS -u UV_FIND_LINKS -u UV_EXTRA_INDEX_URL -u UV_INDEX \
        UV_CUSTOM_COMPILE_COMMAND="docker/lock.sh" \
        "$UV" pip compile --quiet --generate-hashes --no-config \
        --index-url https://pypi.org/simple \
        --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
        --only-binary :all: --output-file "docker/locks/$out" "$@"
    echo "docker/locks/$out: $(grep -c '==' "docker/locks/$out") pins"
}

compile api.txt pyproject.toml
compile cpu.txt pyproject.toml --extra docker docker/locks/cpu.in
compile gpu.txt pyproject.toml --extra docker docker/locks/gpu.in
compile build.txt docker/locks/build.in
compile s3.txt docker/locks/s3.in

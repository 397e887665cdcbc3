#!/usr/bin/env bash
# Build the infermux container image (Containerfile beside this script).
#
#   packaging/container/build.sh VARIANT [extra arguments for `build`]
#
#   VARIANT  dgpu    BASE nvcr.io/nvidia/tensorrt:24.08-py3 (TensorRT 10.3, CUDA 12.6), extras tensorrt
#            jetson  BASE nvcr.io/nvidia/l4t-jetpack:r36.4.0 (JetPack 6.1, TensorRT 10.3), extras tensorrt
#            cpu     BASE debian:bookworm-slim, extras onnx (onnxruntime on the CPU)
#
# Environment: BASE (another base image), TAG (default infermux:VERSION-VARIANT),
# ENGINE (podman, buildah or docker; the first found), PYTHON (the host Python
# whose setuptools makes infermux's sdist and whose pip fetches the
# wheelhouse), OFFLINE=1 (put every dependency in the
# wheelhouse and build without a package index: the host's Python version and
# architecture must then be the image's).
#
# Prints the tag on its last line. Exit status: 0 built, 1 failed, 2 usage.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VARIANT=${1:-}
[ $# -gt 0 ] && shift
case $VARIANT in
    dgpu)   base=nvcr.io/nvidia/tensorrt:24.08-py3;   extras=tensorrt ;;
    jetson) base=nvcr.io/nvidia/l4t-jetpack:r36.4.0;  extras=tensorrt ;;
    cpu)    base=debian:bookworm-slim;                extras=onnx ;;
    *) echo "usage: $0 dgpu|jetson|cpu [build arguments...]" >&2; exit 2 ;;
esac
BASE=${BASE:-$base}
PYTHON=${PYTHON:-python3}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml" | head -n 1)
TAG=${TAG:-infermux:$VERSION-$VARIANT}
ENGINE=${ENGINE:-$(command -v podman || command -v buildah || command -v docker || true)}
[ -n "$ENGINE" ] || { echo "build.sh: no podman, buildah or docker: apt install podman" >&2; exit 1; }

CTX=$(mktemp -d "${TMPDIR:-/tmp}/infermux-image.XXXXXX")
trap 'rm -rf "$CTX"' EXIT
cp "$HERE/Containerfile" "$HERE/infermux.toml" "$CTX/"
mkdir "$CTX/wheels"
echo "wheelhouse: infermux $VERSION's sdist${OFFLINE:+ and its dependencies ($extras)}" >&2
# An sdist, not a wheel: the image builds it, so the compiled socket calls (a C extension) are made for the
# image's architecture and Python, not this machine's. The project's own build backend makes it.
"$PYTHON" -c 'import setuptools' 2>/dev/null ||
    { echo "build.sh: $PYTHON has no setuptools to make infermux's sdist: $PYTHON -m pip install setuptools" >&2; exit 1; }
(cd "$REPO" && "$PYTHON" -c 'import sys; sys.path.insert(0, "packaging"); import infermux_build
infermux_build.build_sdist(sys.argv[1])' "$CTX/wheels") >&2
offline=0
if [ "${OFFLINE:-0}" = 1 ]; then
    offline=1
    # With no index, the image's pip builds the sdist with what pyproject.toml's [build-system] requires
    # (unquoted below: one argument a requirement) from here.
    build_requires=$(sed -n '/^\[build-system\]/,/^\[/ s/^requires = \[\(.*\)\]$/\1/p' "$REPO/pyproject.toml" | tr -d '" ' | tr ',' ' ')
    "$PYTHON" -m pip download --quiet --only-binary=:all: --dest "$CTX/wheels" \
        "$(ls "$CTX"/wheels/infermux-*.tar.gz)[$extras]" $build_requires >&2
fi

case $(basename "$ENGINE") in   # HEALTHCHECK is kept only in the docker image format
    buildah) build=(bud --format docker) ;;
    podman) build=(build --format docker) ;;
    *) build=(build) ;;
esac
echo "building $TAG from $BASE with $(basename "$ENGINE")" >&2
"$ENGINE" "${build[@]}" -f "$CTX/Containerfile" -t "$TAG" \
    --build-arg BASE="$BASE" --build-arg EXTRAS="$extras" --build-arg PIP_OFFLINE="$offline" \
    "$@" "$CTX" >&2
echo "$TAG"

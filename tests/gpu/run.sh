#!/usr/bin/env bash
# One-command GPU check for a machine with (at least) one NVIDIA GPU: build with the `cuda`
# feature (release), run gpucheck with 2 and then 4 ranks sharing GPU 0 (the CUDA IPC path),
# then 4 ranks as two emulated nodes (IPC in the node, TCP between), checking every data type
# and operator, then print the busbw table beside the device-to-device copy bandwidth. See tests/gpu/README.md. Exit status: 0 pass, 1 fail, 2 no GPU (skipped).
set -uo pipefail
cd "$(dirname "$0")/../.."

LIMIT=${GPUCHECK_LIMIT:-150}          # seconds per run
DEVICE=${GPUCHECK_DEVICE:-0}
ARGS=${GPUCHECK_ARGS:-}               # e.g. "--quick" or "--max-bytes 64M"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIPPED: no NVIDIA driver/GPU here (nvidia-smi -L failed)"
    exit 2
fi
nvidia-smi -L
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true

BIN=${GPUCHECK_BIN:-}                 # a folder holding railrun and gpucheck built elsewhere
if [ -n "$BIN" ]; then
    # A GPU machine without a Rust toolchain: binaries built with the same command on another
    # x86-64 Linux machine (cudarc loads libcuda and libnvrtc at run time).
    for b in railrun gpucheck; do
        if [ ! -x "$BIN/$b" ]; then echo "FAIL: GPUCHECK_BIN=$BIN has no executable $b"; exit 1; fi
    done
    echo "== prebuilt binaries from $BIN (no build)"
    RR=$BIN/railrun
    GC=$BIN/gpucheck
else
    echo "== build: cargo build --release -p railrun -p railring-examples --features railring-examples/cuda"
    t0=$(date +%s)
    if ! cargo build --release -p railrun -p railring-examples --features railring-examples/cuda \
            --bin railrun --bin gpucheck; then
        echo "FAIL: build"
        exit 1
    fi
    echo "== built in $(( $(date +%s) - t0 )) s"
    RR=target/release/railrun
    GC=target/release/gpucheck
fi

# cudarc opens NVRTC as libnvrtc.so or libnvrtc.so.{12,11,...}: a CUDA 13 toolkit or the
# nvidia-cuda-nvrtc wheel ships only libnvrtc.so.13 outside the loader's path. Point a private
# libnvrtc.so at the newest one found, and put its folder (libnvrtc-builtins) on the path.
NVRTC_LINK=$(mktemp -d)
if ! python3 -c 'import ctypes; ctypes.CDLL("libnvrtc.so")' 2>/dev/null; then
    lib=$(ls /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda*/targets/*/lib/libnvrtc.so* \
              2>/dev/null | grep -v builtins | sort -V | tail -1)
    [ -n "$lib" ] || lib=$(find / -xdev -path /proc -prune -o -name 'libnvrtc.so*' -print \
                               2>/dev/null | grep -v builtins | sort -V | tail -1)
    if [ -n "$lib" ]; then
        ln -s "$lib" "$NVRTC_LINK/libnvrtc.so"
        export LD_LIBRARY_PATH="$NVRTC_LINK:$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "== NVRTC: $lib (as libnvrtc.so)"
    else
        echo "== NVRTC: none found; the kernels cannot be compiled"
    fi
fi
LOG=$(mktemp -d)
trap 'rm -rf "$LOG" "$NVRTC_LINK"' EXIT
status=0
for np in 2 4; do
    echo
    echo "== $np ranks on GPU $DEVICE (limit ${LIMIT}s)"
    t=$(date +%s)
    RAILRING_DEBUG=INFO RAILRING_DEBUG_SUBSYS=init \
        timeout -k 10 "$LIMIT" "$RR" -np "$np" "$GC" --device "$DEVICE" $ARGS \
        > >(tee "$LOG/out.$np") 2> "$LOG/err.$np"
    rc=$?
    sleep 0.2
    echo "== exit $rc after $(( $(date +%s) - t )) s"
    grep -E "GPU in-node path|WARN|WRONG|error|panicked" "$LOG/err.$np" | sort | uniq -c | head -20
    if [ "$rc" -ne 0 ]; then
        echo "FAIL: $np ranks: exit status $rc; last lines of stderr:"
        tail -30 "$LOG/err.$np"
        status=1
        continue
    fi
    if ! grep -q "direct reads of peers' device buffers" "$LOG/err.$np"; then
        echo "FAIL: $np ranks: the CUDA IPC path was not used (staged through host instead?)"
        status=1
    fi
    if ! grep -q "^# gpucheck: PASS" "$LOG/out.$np"; then
        echo "FAIL: $np ranks: gpucheck did not report PASS"
        status=1
    fi
done

# Two emulated nodes x 2 ranks on the same GPU (RAILRING_HOST_ID splits the machine): the
# hybrid path — in-node steps through CUDA IPC, the network ring (TCP over loopback) on a
# pinned host copy of each rank's half.
echo
echo "== 4 ranks as 2 nodes x 2 on GPU $DEVICE (limit ${LIMIT}s)"
t=$(date +%s)
RAILRING_DEBUG=INFO RAILRING_DEBUG_SUBSYS=init \
    timeout -k 10 "$LIMIT" "$RR" -np 4 sh -c \
    'RAILRING_HOST_ID=gpunode$((RAILRING_RANK / 2)) exec "$0" "$@"' "$GC" --device "$DEVICE" --max-bytes 64M $ARGS \
    > >(tee "$LOG/out.nodes") 2> "$LOG/err.nodes"
rc=$?
sleep 0.2
echo "== exit $rc after $(( $(date +%s) - t )) s"
grep -E "GPU collectives across|GPU in-node path|WARN|WRONG|error|panicked" "$LOG/err.nodes" | sort | uniq -c | head -20
if [ "$rc" -ne 0 ]; then
    echo "FAIL: 2 nodes x 2: exit status $rc; last lines of stderr:"
    tail -30 "$LOG/err.nodes"
    status=1
elif ! grep -q "in-node steps on the GPUs" "$LOG/err.nodes"; then
    echo "FAIL: 2 nodes x 2: the hybrid path was not used (whole buffers staged instead?)"
    status=1
elif ! grep -q "^# gpucheck: PASS" "$LOG/out.nodes"; then
    echo "FAIL: 2 nodes x 2: gpucheck did not report PASS"
    status=1
fi
echo
if [ "$status" -eq 0 ]; then echo "GPU CHECK: PASS"; else echo "GPU CHECK: FAIL"; fi
exit "$status"

#!/usr/bin/env bash
# GPU checks for a machine with a real NVIDIA GPU (and its driver). Builds
# gpuq, starts `gpuq dev --gpus nvml --nodes 1`, and prints PASS/FAIL for:
# the NVML inventory (model, memory, UUID, PCI, NUMA, topology), a real job
# through gpuq (nvidia-smi; a PyTorch matmul when python3 has torch), that the
# job saw only its CUDA_VISIBLE_DEVICES, and that XID/ECC event registration
# succeeded. Finishes within 5 minutes; exit status = number of FAILs.
set -u
cd "$(dirname "$0")/.."
fails=0
pass() { printf 'PASS  %s\n' "$*"; }
fail() { printf 'FAIL  %s\n' "$*"; fails=$((fails + 1)); }

work=$(mktemp -d)
trap 'kill "$dev" 2>/dev/null; wait "$dev" 2>/dev/null; rm -rf "$work"' EXIT

echo "== build"
if ! timeout 240 cargo build --release -q 2>"$work/build.log"; then
  tail -20 "$work/build.log"; fail "cargo build --release"; exit "$fails"
fi
gpuq=$PWD/target/release/gpuq
export GPUQ_SOCKET=$work/dev/gpuq.sock

echo "== start gpuq dev on NVML"
GPUQ_LOG=info "$gpuq" dev --gpus nvml --nodes 1 --dir "$work/dev" --fresh >"$work/dev.log" 2>&1 &
dev=$!
for _ in $(seq 1 100); do
  "$gpuq" nodes --json >"$work/nodes.json" 2>/dev/null && grep -q '"name"' "$work/nodes.json" && break
  sleep 0.2
done

echo "== inventory"
if python3 - "$work/nodes.json" <<'PY'
import json, sys
nodes = json.load(open(sys.argv[1]))
inv = nodes[0]["inventory"]
gpus = inv["gpus"]
assert gpus, "no GPUs found through NVML"
for g in gpus:
    print(f"  GPU {g['index']}: {g['model']} {g['memory_mb']} MiB {g['uuid']} pci={g['pci_bus_id']} numa={g['numa_node']} healthy={g['healthy']}")
    assert g["uuid"].startswith("GPU-") and g["memory_mb"] > 0 and g["pci_bus_id"]
for i, row in enumerate(inv["gpu_links"]):
    print(f"  links from GPU {i}: {row}")
assert len(inv["gpu_links"]) == len(gpus)
PY
then pass "NVML inventory (model, memory, UUID, PCI, NUMA, topology)"; else fail "NVML inventory"; cat "$work/dev.log" | tail -20; fi

if grep -q "NVML health events registered" "$work/dev.log"; then
  pass "XID/ECC event registration"
else
  fail "XID/ECC event registration: $(grep -i 'health events' "$work/dev.log" | tail -1)"
fi

echo "== a CUDA job through gpuq"
cat >"$work/job.sh" <<'JOB'
#!/bin/sh
echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
nvidia-smi -L
if python3 -c 'import torch' 2>/dev/null; then
python3 - <<'PY'
import torch
print("device_count", torch.cuda.device_count())
a = torch.randn(4096, 4096, device="cuda"); b = a @ a; torch.cuda.synchronize()
print("matmul_ok", float(b.norm()) > 0)
PY
else
  echo "torch not installed"
fi
JOB
chmod +x "$work/job.sh"
id=$("$gpuq" submit --parsable --gpus-per-node 1 --time 3:00 -D "$work" "$work/job.sh")
for _ in $(seq 1 600); do
  state=$("$gpuq" show "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  case $state in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
  sleep 0.2
done
out=$work/gpuq-$id.out
cat "$out" 2>/dev/null | sed 's/^/  /'
[ "$state" = COMPLETED ] && grep -q '^GPU 0' "$out" && pass "nvidia-smi in a gpuq job ($state)" || fail "nvidia-smi in a gpuq job ($state)"
if grep -q '^CUDA_VISIBLE_DEVICES=[0-9]*$' "$out"; then pass "the job got exactly one CUDA_VISIBLE_DEVICES"; else fail "CUDA_VISIBLE_DEVICES"; fi
if grep -q 'torch not installed' "$out"; then
  echo "SKIP  PyTorch matmul (python3 has no torch)"
else
  grep -q 'device_count 1' "$out" && pass "torch sees only its one GPU" || fail "torch device count"
  grep -q 'matmul_ok True' "$out" && pass "PyTorch matmul on the GPU" || fail "PyTorch matmul"
fi
echo "== $fails failed"
exit "$fails"

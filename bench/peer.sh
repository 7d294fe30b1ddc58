#!/usr/bin/env bash
# bench/peer.sh: gpuq side by side with a real Slurm 22.05 on the same shape,
# in one run on this machine (issue 8, item 3g). Prints one table (figure |
# Slurm's best profile | gpuq | gpuq/Slurm | target) and writes
# target/bench/peer.json; the Slurm summaries and logs go to target/bench/peer/.
#
#   bench/peer.sh           full run (needs root):
#                             1. builds benches/peer.rs (release) first, so
#                                no compiler runs while Slurm is measured;
#                             2. for each profile in SLURM_PROFILES: the
#                                peer's setup.sh (installs slurm-wlm + munge
#                                with apt on first use, ~30 s), its bench.sh
#                                (TESTS below), then its stop.sh, so Slurm
#                                takes no CPU from gpuq's half;
#                             3. benches/peer.rs: one gpuq server and 8 agents
#                                in network namespaces (10.88.150.0/24, names
#                                gqp*), the same tests through the real CLI.
#                           About 25 minutes at the defaults on 2 cores (the
#                           default profile's end to end is slow).
#   bench/peer.sh --smoke   gpuq's half only, tiny sizes, dev profile: proves
#                           the bench runs (CI); no Slurm (installing and
#                           starting it is not a smoke test's job). Its
#                           figures mean nothing.
#
# Knobs (environment), passed to both halves:
#   N=1000 REPS=3 PAR=4 LAT_REPS=20 MN_REPS=5
#   TESTS="lat multi seq par held array"   (gpuq's half adds "sbatch": the
#                                   seq/par jobs through `gpuq slurm sbatch`,
#                                   beside Slurm's sbatch rates; and "floor":
#                                   how fast this machine starts /bin/true
#                                   and gpuq --version, the ceiling of any
#                                   one-process-per-job submit rate)
#   SLURM_PROFILES="tuned default"  Slurm's best profile is taken per figure
#                                   (tuned wins end to end and srun, default
#                                   the submit rates); "tuned" alone halves
#                                   the Slurm time
#   SLURM_SUMMARIES=a.txt,b.txt     skip running Slurm; use these summaries
#   SLURM_PEER_SRC=../shared/peers/slurm   SLURM_PEER_DIR=/tmp/slurm-peer
# Cleans up on exit, also on Ctrl-C: gqp* namespaces and what runs in them,
# and Slurm if this script started it. Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=0
case "${1:-}" in
  --smoke) smoke=1 ;;
  "") ;;
  -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
  *) echo "bench/peer.sh: unknown argument $1 (use --smoke or nothing)" >&2; exit 1 ;;
esac
[ "$(id -u)" = 0 ] || { echo "bench/peer.sh: needs root (network namespaces, Slurm daemons)" >&2; exit 1; }

N=${N:-1000}; REPS=${REPS:-3}; PAR=${PAR:-4}; LAT_REPS=${LAT_REPS:-20}; MN_REPS=${MN_REPS:-5}
TESTS=${TESTS:-"lat multi seq par held array"}
SLURM_PROFILES=${SLURM_PROFILES:-"tuned default"}
SRC=${SLURM_PEER_SRC:-../shared/peers/slurm}
export SLURM_PEER_DIR=${SLURM_PEER_DIR:-/tmp/slurm-peer}
OUT=target/bench/peer
mkdir -p "$OUT"

# gpuq's namespaces and everything in them (the bench's Drop does this too,
# unless it was killed).
gqp_cleanup() {
  local ns pid link
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^gqp-' || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^gqp' || true); do
    ip link del "$link" 2>/dev/null || true
  done
}
slurm_started=0
cleanup() {
  gqp_cleanup
  if [ "$slurm_started" = 1 ]; then "$SRC/stop.sh" >>"$OUT/slurm-stop.log" 2>&1 || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$(date +%s)
gqp_cleanup
if [ "$smoke" = 1 ]; then
  export GPUQ_BENCH_SMOKE=1
  cargo bench --profile dev --bench peer
  echo "bench/peer.sh --smoke: done in $(( $(date +%s) - start )) s (gpuq half only)"
  exit 0
fi

cargo bench --bench peer --no-run

summaries=${SLURM_SUMMARIES:-}
if [ -z "$summaries" ]; then
  [ -x "$SRC/setup.sh" ] || { echo "bench/peer.sh: no Slurm peer at $SRC (set SLURM_PEER_SRC)" >&2; exit 1; }
  for prof in $SLURM_PROFILES; do
    echo "== Slurm, profile $prof: setup"
    slurm_started=1
    "$SRC/stop.sh" >>"$OUT/slurm-stop.log" 2>&1 || true   # a cluster with another config
    PROFILE=$prof "$SRC/setup.sh" >"$OUT/slurm-setup-$prof.log" 2>&1 \
      || { tail -20 "$OUT/slurm-setup-$prof.log" >&2; exit 1; }
    echo "== Slurm, profile $prof: bench.sh N=$N REPS=$REPS TESTS='$TESTS'"
    N=$N REPS=$REPS PAR=$PAR LAT_REPS=$LAT_REPS MN_REPS=$MN_REPS TESTS="$TESTS" \
      "$SRC/bench.sh" >"$OUT/slurm-bench-$prof.log" 2>&1 \
      || { tail -20 "$OUT/slurm-bench-$prof.log" >&2; exit 1; }
    cp "$SLURM_PEER_DIR/results/latest/summary.txt" "$OUT/slurm-$prof.txt"
    summaries="${summaries:+$summaries,}$PWD/$OUT/slurm-$prof.txt"
    "$SRC/stop.sh" >>"$OUT/slurm-stop.log" 2>&1
    slurm_started=0
  done
fi

echo "== gpuq: server + 8 agents in namespaces, same tests"
GPUQ_PEER_SLURM=$summaries GPUQ_PEER_N=$N GPUQ_PEER_REPS=$REPS GPUQ_PEER_PAR=$PAR \
  GPUQ_PEER_LAT_REPS=$LAT_REPS GPUQ_PEER_MN_REPS=$MN_REPS GPUQ_PEER_TESTS="$TESTS sbatch floor" \
  cargo bench --bench peer | tee "$OUT/table.txt"
echo "bench/peer.sh: done in $(( $(date +%s) - start )) s; target/bench/peer.json, $OUT/"

#!/usr/bin/env bash
# bench/run.sh: runs gpuq's benchmarks; each prints a table and writes JSON
# under target/bench/ (submit.json, fleet.json, peer.json, ...).
#
#   bench/run.sh           full runs in the release profile:
#                            benches/submit.rs  submit path: socket latency,
#                                               CLI rate, 4 and 8 clients
#                            benches/fleet.rs   simulated fleet: 64x8 gang start
#                                               on 64/256/1000 nodes, ITP replay
#                                               FIFO+backfill vs full policy,
#                                               synthetic mix
#                            benches/scale.rs   leader state at 1k/5k/10k nodes
#                                               with 100k and 1M jobs: pass
#                                               p50/p99, CPU, peak RSS, acct
#                                               query; idle agents' heartbeat
#                                               load at 1k/2k/5k agents
#                            benches/failover.rs leader SIGKILL -> writes and
#                                               scheduling on the new leader
#                                               (3 servers, 20 kills)
#                            benches/ha.rs      3 servers vs 1 submit rate,
#                                               redb size after 100,000 jobs,
#                                               snapshot size/time, join+catch-up
#                            benches/sacct.rs   sacct over 100,000 archived
#                                               jobs through the real binary:
#                                               every job, one job, one array
#                            benches/interactive.rs srun --pty true and a
#                                               shell's prompt round trips,
#                                               keystroke echo through the pty
#                                               path (1 server, 1 agent)
#                            benches/observe.rs the HTTP port at 1,000
#                                               simulated nodes and 100,000
#                                               jobs: /metrics scrape time
#                                               and size, API list p50
#                            benches/replay.rs  virtual-time ITP replay: each
#                                               built-in policy on the whole
#                                               trace and on cluster04 at load
#                                               0.9, and 69k jobs on 1,000
#                                               nodes: jobs/s
#                            benches/fuzz.rs    10 million fuzz inputs over the
#                                               local socket's frames, agent and
#                                               Raft protocols, apply, snapshots,
#                                               job specs, configs, hostlists:
#                                               crashes (must be 0), inputs/s
#                                               (GPUQ_BENCH_FUZZ_CASES=N)
#                            benches/chaos.rs   100 leader kills, 50 partitions
#                                               and 10 other faults under 3
#                                               clients, checked: lost,
#                                               duplicated, double-booked (all 0),
#                                               failover p50/p99 (about 20
#                                               minutes; root)
#                            bench/peer.sh      side by side with a real Slurm
#                                               22.05 (../shared/peers/slurm,
#                                               tuned and default profiles) on
#                                               8 nodes x 8 GPUs in network
#                                               namespaces: gpuq/Slurm ratios
#                                               (about 25 minutes by itself)
#                          About 75 minutes on 2 cores, plus the first release
#                          build (about 4 minutes).
#   bench/run.sh --smoke   tiny versions of each in the dev profile (the build
#                          `cargo test` already made), to prove the benchmarks
#                          still run: well under a minute once built. Its
#                          figures mean nothing. CI runs this. The peer bench
#                          runs only its gpuq half here (bench/peer.sh --smoke,
#                          ~25 s): installing and starting Slurm is left to
#                          the full run.
#
# Knobs pass through the environment; each bench's header lists its own, e.g.
#   GPUQ_BENCH_FLEETS=64,256 GPUQ_BENCH_RUNS=20 bench/run.sh
#   GPUQ_BENCH_REPLAY_JOBS=15802 GPUQ_BENCH_REPLAY_COMPRESSION=20000 bench/run.sh
# The fleet bench needs the ITP trace at ../shared/traces/itp (or
# GPUQ_BENCH_TRACE=PATH); without it the replay is skipped with a note.
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=0
case "${1:-}" in
  --smoke) smoke=1 ;;
  "") ;;
  -h|--help) sed -n '2,71p' "$0"; exit 0 ;;
  *) echo "bench/run.sh: unknown argument $1 (use --smoke or nothing)" >&2; exit 1 ;;
esac

start=$(date +%s)
if [ "$smoke" = 1 ]; then
  export GPUQ_BENCH_SMOKE=1
  GPUQ_BENCH_N=100 cargo bench --profile dev --bench submit
  cargo bench --profile dev --bench fleet
  cargo bench --profile dev --bench scale
  cargo bench --profile dev --bench failover
  cargo bench --profile dev --bench ha
  cargo bench --profile dev --bench sacct
  cargo bench --profile dev --bench interactive
  cargo bench --profile dev --bench observe
  cargo bench --profile dev --bench replay
  cargo bench --profile dev --bench fuzz
  cargo bench --profile dev --bench chaos
  bench/peer.sh --smoke
else
  cargo bench --bench submit
  cargo bench --bench fleet
  cargo bench --bench scale
  cargo bench --bench failover
  cargo bench --bench ha
  cargo bench --bench sacct
  cargo bench --bench interactive
  cargo bench --bench observe
  cargo bench --bench replay
  cargo bench --bench fuzz
  cargo bench --bench chaos
  bench/peer.sh
fi
echo "bench/run.sh: done in $(( $(date +%s) - start )) s; JSON in target/bench/"

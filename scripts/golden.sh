#!/usr/bin/env bash
# Makes tests/golden/<commit>/: what this build writes, kept so that later
# builds prove they still read it (tests/golden.rs, tests/upgrade.rs).
#
# A real server and two agents with fake GPUs build representative state
# through the CLI (jobs in every state, an array, holds, dependencies, a
# preemption, a requeue, archived history, tokens, accounts, QoS,
# partitions, a drain), then the script saves:
#   data/       the server's data dir (gpuq.redb.gz: log + state, gzipped;
#               node_id; tls/)
#   backup.gpuq `gpuq cluster snapshot save`
#   cli/*.json  what the CLI showed of jobs, nodes, tokens, policy, history
#   state.json, log.json, wire.json   written by this build's test helper
#                (`GPUQ_GOLDEN_WRITE=DIR cargo test --test golden`): the state
#                and log as this build decodes them, and encoded samples of
#                every wire message and log command.
# Run it once per release, on the release's commit, from the repo root:
#   scripts/golden.sh            (as root: the agents run jobs as root)
set -euo pipefail

root=$(git rev-parse --show-toplevel)
commit=$(git rev-parse --short=7 HEAD)
out="$root/tests/golden/$commit"
cd "$root"
cargo build --quiet
bin="$root/target/debug/gpuq"
work=$(mktemp -d /tmp/gpuq-golden.XXXXXX)
pids=()
# The agents' tasks outlive them by design; these must not: each task's
# shim and process group, by the pids the agent wrote.
kill_tasks() {
    for f in "$work"/n*/data/tasks/*/pid "$work"/n*/data/tasks/*/shim.pid; do
        [ -f "$f" ] || continue
        for p in $(grep -o '"pid": *[0-9]*' "$f" | grep -o '[0-9]*$'); do
            [ "$p" -gt 1 ] && { kill -9 -- "-$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; }
        done
    done
}
cleanup() {
    for p in "${pids[@]}" "${spid:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
    kill_tasks
}
trap cleanup EXIT

port=$((20000 + RANDOM % 20000))
sock="$work/s/gpuq.sock"
mkdir -p "$work/s" "$work/w"
q() { GPUQ_SOCKET="$sock" "$bin" "$@"; }
server() { # retention_secs
    printf '[server]\nnode_ttl_secs = 3600\nhistory_retention_secs = %s\n' "$1" >"$work/s/server.toml"
    GPUQ_LOG=info "$bin" server --node-name s1 --bootstrap --config "$work/s/server.toml" \
        --data-dir "$work/s/data" --listen "127.0.0.1:$port" --socket "$sock" \
        2>>"$work/s/server.log" &
    spid=$!
    for _ in $(seq 200); do q token list >/dev/null 2>&1 && return; sleep 0.1; done
    echo "the server did not start" >&2; exit 1
}
agent() { # name gpus token
    local d="$work/$1"
    mkdir -p "$d"
    printf '[agent]\nnode_name = "%s"\ndata_dir = "%s/data"\nsocket = "%s/agent.sock"\nallow_root = true\nkill_grace_secs = 1\ncpus = 16\nmemory_mb = 65536\ngpus = { fake = { count = %s } }\n' \
        "$1" "$d" "$d" "$2" >"$d/agent.toml"
    GPUQ_LOG=info "$bin" agent --config "$d/agent.toml" --join "127.0.0.1:$port" --token "$3" \
        2>>"$d/agent.log" &
    pids+=($!)
}
state_of() { q show "$1" --json | sed -n 's/^  "state": "\(.*\)",$/\1/p'; }
wait_state() { # id state
    for _ in $(seq 600); do [ "$(state_of "$1")" = "$2" ] && return; sleep 0.1; done
    echo "job $1 is $(state_of "$1"), not $2" >&2; exit 1
}
sub() { q submit --parsable -D "$work/w" -t 1:00:00 "$@"; }

# Phase 1: jobs that end and are archived (retention 1 s).
server 1
server1=$spid
token=$(q token create --ttl 1d)
agent n1 4 "$token"
agent n2 4 "$token"
for _ in $(seq 200); do [ "$(q nodes --json | grep -c '"connected": true')" = 2 ] && break; sleep 0.1; done
old_ok=$(sub -J archived-ok --gpus-per-node 1 --wrap true)
old_bad=$(sub -J archived-failed --gpus-per-node 1 --wrap false)
wait_state "$old_ok" COMPLETED
wait_state "$old_bad" FAILED
for _ in $(seq 100); do q acct --json | grep -c "\"id\": $old_bad" >/dev/null && break; sleep 0.1; done
kill -TERM "$spid"; wait "$spid" || true

# Phase 2: the same server keeps finished jobs active for a day.
server 86400
for _ in $(seq 200); do [ "$(q nodes --json | grep -c '"connected": true')" = 2 ] && break; sleep 0.1; done
q token create --role server --ttl 1h >/dev/null
revoked=$(q token create --ttl 1h --json | sed -n 's/.*"id": "\([^"]*\)".*/\1/p' | head -1)
q token revoke "$revoked" >/dev/null
q admin account add ml --add-user root --shares 3 >/dev/null
q admin qos add low --grace 1s --preempt-mode requeue >/dev/null
q admin qos add high --priority 10 --preempts low >/dev/null
q admin partition add long --nodes 'n[1-2]' --max-time 7-00:00:00 >/dev/null
q admin priority set --age 100 >/dev/null
q node drain n2 --reason golden >/dev/null
q node resume n2 >/dev/null

ok=$(sub -J completed -A ml --gpus-per-node 1 --wrap true)
bad=$(sub -J failed --gpus-per-node 1 --wrap 'exit 3')
retried=$(sub -J retried --requeue --max-restarts 1 --gpus-per-node 1 --wrap false)
wait_state "$ok" COMPLETED
wait_state "$bad" FAILED
wait_state "$retried" FAILED
printf -- '-J many-a --wrap true\n-J many-b --wrap true\n' >"$work/many"
q submit --parsable -D "$work/w" --from "$work/many" >/dev/null
long=$(sub -J running-2gpu --gpus-per-node 2 --wrap 'sleep 100000')
arr=$(sub -J array --array 0-3%2 --gpus-per-node 1 --wrap 'sleep 100000')
wait_state "$long" RUNNING
wait_state "${arr}_0" RUNNING
wait_state "${arr}_1" RUNNING
low=$(sub -J low --qos low --gpus-per-node 4 --wrap 'sleep 100000')
wait_state "$low" RUNNING
cancelled=$(sub -J cancelled --gpus-per-node 4 --wrap 'sleep 100000')
q cancel "$cancelled" >/dev/null
high=$(sub -J high --qos high --gpus-per-node 4 --wrap 'sleep 100000')
wait_state "$high" RUNNING
held=$(sub -J held --hold --gpus-per-node 1 --wrap true)
dep=$(sub -J after-long -d "afterok:$long" --gpus-per-node 1 --wrap true)
waiting=$(sub -J waiting -p long --gpus-per-node 4 --wrap true)
sleep 2

# The agents go (their tasks with them); the state says what ran.
for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
kill_tasks
rm -rf "$out"
mkdir -p "$out/cli"
q cluster snapshot save "$out/backup.gpuq" --json >"$out/cli/snapshot.json"
q queue --all --json >"$out/cli/queue.json"
q nodes --json >"$out/cli/nodes.json"
q token list --json >"$out/cli/tokens.json"
q acct --json >"$out/cli/acct.json"
for what in account qos partition; do q admin "$what" list --json >"$out/cli/$what.json"; done
printf '{"archived":[%s,%s],"completed":%s,"failed":%s,"retried":%s,"running":%s,"array":%s,"low":%s,"cancelled":%s,"high":%s,"held":%s,"dependent":%s,"waiting":%s}\n' \
    "$old_ok" "$old_bad" "$ok" "$bad" "$retried" "$long" "$arr" "$low" "$cancelled" "$high" "$held" "$dep" "$waiting" >"$out/cli/ids.json"
kill -TERM "$spid"; wait "$spid" || true
mkdir -p "$out/data"
cp -a "$work/s/data/node_id" "$work/s/data/tls" "$work/s/data/gpuq.redb" "$out/data/"
gzip -9 "$out/data/gpuq.redb"
printf '[server]\nnode_ttl_secs = 3600\nhistory_retention_secs = 86400\n' >"$out/server.toml"
echo "$port" >"$out/port"
GPUQ_GOLDEN_WRITE="$out" cargo test --quiet --test golden -- --exact this_build_round_trips_its_samples
git rev-parse HEAD >"$out/COMMIT"
du -sh "$out"

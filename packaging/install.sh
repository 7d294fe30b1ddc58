#!/bin/sh
# gpuq installer: puts the gpuq binary, its config, its directories and its
# systemd unit on a bare-metal host, for one role: server, compute agent or
# login agent. It is what `curl -fsSL URL/install.sh | sudo sh -s -- ...` runs,
# so it carries everything it writes: the example configs and unit files at the
# bottom are copies of config/*.toml and systemd/*.service, which
# tests/install.rs holds equal.
#
# Every input is checked before anything is written, so a bad flag exits 2 and
# leaves the host as it was. Running it again is safe: the binary and the unit
# are replaced, an existing /etc/gpuq/gpuq.toml is kept. Nothing runs until the
# last line calls main, so a download cut short runs nothing at all.
#
# POSIX sh only: dash and busybox run this.

set -eu

# Release builds fill this in; empty means there is no default download.
GPUQ_DEFAULT_URL=""

usage() {
    cat <<'EOF'
Install gpuq on this host for one role.

  curl -fsSL URL/install.sh | sudo sh -s -- ROLE [OPTIONS]

Roles (exactly one):
  --server --bootstrap        the first server: creates a new cluster
  --server --join HOST:PORT --token T
                              a later server, joining through HOST:PORT
  --agent --join HOST:PORT --token T
                              a compute node (runs jobs)
  --login --join HOST:PORT --token T
                              a login node (runs no jobs; its users submit)
  An admin prints a token on a server: gpuq token create --role agent
  A role given alone keeps the flags and token from its earlier install
  (an upgrade); on a new host it needs the flags above.

Binary (one of; default: the URL in $GPUQ_URL):
  --binary PATH               install this local gpuq binary
  --url URL                   download it with curl or wget

Options:
  --advertise IP:PORT         (server) the address agents and peers dial;
                              default: this host's primary IPv4, port 7420
  --prefix DIR                install the binary as DIR/bin/gpuq
                              (default: $PREFIX, else /usr/local)
  --root DIR                  install under DIR, every path prefixed (image
                              builds, tests); starts nothing
  --no-start                  install, start nothing, print how to start
  --no-slurm-links            make no sbatch, srun, salloc, sattach, squeue, sacct,
                              scancel, scontrol, sinfo links (a real Slurm's
                              are here)
  -h, --help                  show this help

Writes:
  PREFIX/bin/gpuq
  PREFIX/bin/sbatch srun salloc sattach squeue sacct scancel scontrol sinfo: links to gpuq,
                              which speaks Slurm under those names (a file there
                              that is not a link is left alone)
  /etc/gpuq/gpuq.toml         from the role's example, only if absent: an
                              existing config is kept as it is
  /etc/gpuq/server.env        (server) or agent.env (agent, login), mode 0600:
                              GPUQ_TOKEN and the daemon's flags, read by the unit
  /etc/systemd/system/gpuq-server.service or gpuq-agent.service
  /var/lib/gpuq/server (0700) or /var/lib/gpuq/agent (0711), /run/gpuq
With systemd running it then runs systemctl daemon-reload and
systemctl enable --now for the unit; without systemd it prints the command
line to run by hand.

Exit codes: 0 installed; 1 a step failed (download, systemctl); 2 bad input,
nothing written.
EOF
}

say() { printf '%s\n' "$*"; }
# A user's mistake: one line naming the flag and the fix, before any write.
bad() {
    printf 'gpuq install: %s\n' "$*" >&2
    exit 2
}
# A step that failed after the input was accepted.
die() {
    printf 'gpuq install: %s\n' "$*" >&2
    exit 1
}

set_role() {
    if [ -n "$role" ] && [ "$role" != "$1" ]; then
        bad "--$role and --$1 are two roles; give one (run the installer once per role)"
    fi
    role=$1
}

# need_value FLAG [VALUE...]: refuses a flag whose value is missing.
need_value() {
    if [ $# -lt 2 ] || [ -z "$2" ]; then
        bad "$1 needs a value; see --help"
    fi
    case $2 in
        -*) bad "$1 needs a value, not the flag $2; see --help" ;;
    esac
}

# HOST:PORT with a port in 1-65535; an IPv6 host in brackets.
host_port_ok() {
    hp_host=${1%:*}
    hp_port=${1##*:}
    [ "$hp_host" != "$1" ] && [ -n "$hp_host" ] || return 1
    case $hp_port in '' | *[!0-9]*) return 1 ;; esac
    [ "$hp_port" -ge 1 ] 2>/dev/null && [ "$hp_port" -le 65535 ] || return 1
    case $hp_host in
        \[*\])
            hp_inner=${hp_host#?}
            hp_inner=${hp_inner%?}
            case $hp_inner in '' | *[!0-9a-fA-F:.]*) return 1 ;; esac
            ;;
        *[!A-Za-z0-9._-]*) return 1 ;;
    esac
}

# IP:PORT, the form gpuq's --join and --advertise parse (no host names).
ip_port_ok() {
    host_port_ok "$1" || return 1
    case ${1%:*} in
        \[*\]) ;;
        *[!0-9.]* | *.*.*.*.* | *..*) return 1 ;;
        *.*.*.*) ;;
        *) return 1 ;;
    esac
}

# kept_args FILE VAR: the daemon flags an earlier install wrote into FILE.
kept_args() {
    sed -n "s/^$2=\"\(.*\)\"\$/\1/p" "$1"
}

main() {
    role=""
    bootstrap=0
    join=""
    token=""
    advertise=""
    binary=""
    url=""
    root=""
    prefix="${PREFIX:-/usr/local}"
    no_start=0
    slurm_links=1

    while [ $# -gt 0 ]; do
        inline=0
        case $1 in
            --*=*)
                opt=${1%%=*}
                val=${1#*=}
                shift
                set -- "$opt" "$val" "$@"
                inline=1
                ;;
        esac
        case $1 in
            --server | --agent | --login | --bootstrap | --no-start | --no-slurm-links | --help)
                [ "$inline" = 0 ] || bad "$1 takes no value; give it as plain $1"
                ;;
        esac
        case $1 in
            --server) set_role server ;;
            --agent) set_role agent ;;
            --login) set_role login ;;
            --bootstrap) bootstrap=1 ;;
            --no-start) no_start=1 ;;
            --no-slurm-links) slurm_links=0 ;;
            --join | --token | --advertise | --binary | --url | --prefix | --root)
                need_value "$@"
                case $1 in
                    --join) join=$2 ;;
                    --token) token=$2 ;;
                    --advertise) advertise=$2 ;;
                    --binary) binary=$2 ;;
                    --url) url=$2 ;;
                    --prefix) prefix=$2 ;;
                    --root) root=$2 ;;
                esac
                shift
                ;;
            -h | --help)
                usage
                exit 0
                ;;
            *) bad "unknown option $1; see --help" ;;
        esac
        shift
    done

    # ---- checks: nothing is written until every one has passed ------------

    [ -n "$role" ] || bad "no role given: add --server, --agent or --login; see --help"

    case $prefix in
        *[!A-Za-z0-9._/+-]*) bad "--prefix $prefix: use a plain absolute path, e.g. --prefix /usr/local" ;;
        /?*) prefix=${prefix%/} ;;
        *) bad "--prefix $prefix is not an absolute path below /; give e.g. --prefix /usr/local" ;;
    esac

    if [ -n "$root" ]; then
        case $root in
            /*) ;;
            *) root="$(pwd)/$root" ;;
        esac
        root=${root%/}
        if [ -e "$root" ] && [ ! -d "$root" ]; then
            bad "--root $root is not a directory; give a directory to install under"
        fi
    elif [ "$(id -u)" != 0 ]; then
        bad "installing on this host needs root: run it with sudo (... | sudo sh -s -- ...), or give --root DIR"
    fi

    if [ -n "$join" ] && ! host_port_ok "$join"; then
        bad "--join $join is not HOST:PORT; give the server's address, e.g. --join 10.0.0.1:7420"
    fi
    case $token in
        *[!A-Za-z0-9._-]*) bad "--token has characters a gpuq token never has; paste the gpuq1-... line that gpuq token create printed" ;;
    esac
    if [ -n "$join" ] && [ -z "$token" ]; then
        bad "--join needs --token T too; an admin prints one on a server with: gpuq token create --role agent"
    fi
    if [ -n "$token" ] && [ -z "$join" ]; then
        bad "--token needs --join HOST:PORT too: the server to join through"
    fi
    if [ "$bootstrap" = 1 ] && [ "$role" != server ]; then
        bad "--bootstrap is only for --server (it creates a new cluster); --$role joins with --join HOST:PORT --token T"
    fi
    if [ -n "$advertise" ]; then
        [ "$role" = server ] || bad "--advertise is only for --server; give an agent's address in its gpuq.toml"
        ip_port_ok "$advertise" || bad "--advertise $advertise is not IP:PORT; give this server's reachable address, e.g. --advertise 10.0.0.1:7420"
    fi

    # What each role writes, and the daemon flags its env file carries: from
    # the flags given, else (an upgrade) from the env file already there.
    args=""
    write_env=1
    case $role in
        server)
            unit=gpuq-server
            daemon=server
            envfile=server.env
            argsvar=GPUQ_SERVER_ARGS
            if [ "$bootstrap" = 1 ] && [ -n "$join" ]; then
                bad "--bootstrap and --join exclude each other: --bootstrap starts a new cluster, --join enters an existing one"
            elif [ "$bootstrap" = 1 ]; then
                args="--bootstrap"
            elif [ -n "$join" ]; then
                args="--join $join"
            elif [ ! -f "$root/etc/gpuq/$envfile" ]; then
                bad "--server needs --bootstrap (the first server) or --join HOST:PORT --token T (a later server)"
            else
                write_env=0
                args=$(kept_args "$root/etc/gpuq/$envfile" "$argsvar")
            fi
            ;;
        agent | login)
            unit=gpuq-agent
            daemon=agent
            envfile=agent.env
            argsvar=GPUQ_AGENT_ARGS
            agent_role=compute
            [ "$role" = agent ] || agent_role=login
            if [ -n "$join" ]; then
                join_ip=$join
                if ! ip_port_ok "$join"; then
                    # gpuq agent --join takes an address: resolve the name once.
                    name=${join%:*}
                    addr=""
                    if command -v getent >/dev/null 2>&1; then
                        addr=$(getent ahostsv4 "$name" 2>/dev/null | awk 'NR == 1 { print $1 }') || addr=""
                    fi
                    [ -n "$addr" ] || bad "--join $join: cannot resolve $name on this host; give the server's IP, e.g. --join 10.0.0.1:${join##*:}"
                    join_ip="$addr:${join##*:}"
                fi
                args="--role $agent_role --join $join_ip"
            elif [ ! -f "$root/etc/gpuq/$envfile" ]; then
                bad "--$role needs --join HOST:PORT --token T: the server to join through, and a token from: gpuq token create --role agent"
            else
                write_env=0
                args=$(kept_args "$root/etc/gpuq/$envfile" "$argsvar")
                case " $args " in
                    *" --role $agent_role "*) ;;
                    *) bad "--$role: $root/etc/gpuq/$envfile holds \"$args\", another role; give --join HOST:PORT --token T to install this one" ;;
                esac
            fi
            ;;
    esac

    if [ -n "$binary" ] && [ -n "$url" ]; then
        bad "--binary and --url both name the binary; give one"
    fi
    fetch=""
    if [ -n "$binary" ]; then
        [ -f "$binary" ] || bad "--binary $binary: no such file; give the path of a gpuq binary, or --url URL"
        [ -r "$binary" ] || bad "--binary $binary is not readable; check its permissions"
    else
        [ -n "$url" ] || url=${GPUQ_URL:-$GPUQ_DEFAULT_URL}
        [ -n "$url" ] || bad "no gpuq binary to install: give --binary PATH or --url URL (or set GPUQ_URL)"
        if command -v curl >/dev/null 2>&1; then
            fetch=curl
        elif command -v wget >/dev/null 2>&1; then
            fetch=wget
        else
            bad "--url needs curl or wget and neither is installed: install one, or download gpuq yourself and give --binary PATH"
        fi
    fi

    # ---- install -----------------------------------------------------------

    tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpuq-install.XXXXXX") || die "cannot create a temporary directory"
    trap 'rm -rf "$tmp"' EXIT
    trap 'exit 1' HUP INT TERM

    if [ -n "$binary" ]; then
        cp "$binary" "$tmp/gpuq" || die "cannot copy $binary"
    else
        say "downloading $url"
        if [ "$fetch" = curl ]; then
            curl -fsSL --retry 3 -o "$tmp/gpuq" "$url" || die "downloading $url failed (curl); check the URL, or give --binary PATH"
        else
            wget -q -O "$tmp/gpuq" "$url" || die "downloading $url failed (wget); check the URL, or give --binary PATH"
        fi
    fi
    chmod 0755 "$tmp/gpuq"

    # An image build may carry a binary for another machine; on a live host a
    # binary that does not run (an HTML error page, another architecture) is
    # refused before it replaces a working one.
    runs=0
    if "$tmp/gpuq" --version >/dev/null 2>&1; then
        runs=1
    elif [ -z "$root" ]; then
        die "the gpuq binary from ${binary:-$url} does not run on this host (another architecture, or not gpuq at all?)"
    else
        say "note: the binary does not run on this host; installing it anyway (--root)"
    fi

    umask 022
    bindir="$root$prefix/bin"
    etc="$root/etc/gpuq"
    mkdir -p "$bindir" "$etc" "$root/etc/systemd/system" "$root/var/lib/gpuq/$daemon" "$root/run/gpuq"
    # The server's dir holds the cluster's keys; the agent's is traversable
    # (its tasks' users reach their own scripts below it) but not listable.
    # An existing dir is closed too: gpuq refuses to start on an open one.
    # Files an older release left open (its store, its tls dir) are closed
    # too; a task's directory under the agent's tasks/ keeps its owner's mode.
    if [ "$daemon" = server ]; then
        chmod -R go= "$root/var/lib/gpuq/$daemon"
    else
        chmod 0711 "$root/var/lib/gpuq/$daemon"
        if [ -d "$root/var/lib/gpuq/$daemon/tls" ]; then
            chmod -R go= "$root/var/lib/gpuq/$daemon/tls"
        fi
    fi

    # Replaced by rename: a running gpuq keeps its old file, never a torn one.
    cp "$tmp/gpuq" "$bindir/.gpuq.new" || die "cannot write $bindir"
    chmod 0755 "$bindir/.gpuq.new"
    mv -f "$bindir/.gpuq.new" "$bindir/gpuq" || die "cannot install $bindir/gpuq"
    say "installed $bindir/gpuq"

    # Slurm's commands are this binary under their names: relative links,
    # so an image moved elsewhere keeps them. A real file of that name (a
    # Slurm installed here) is left alone.
    if [ "$slurm_links" = 1 ]; then
        for cmd in sbatch srun salloc sattach squeue sacct scancel scontrol sinfo; do
            if [ -e "$bindir/$cmd" ] && [ ! -L "$bindir/$cmd" ]; then
                say "note: $bindir/$cmd exists and is not a link; left as it is"
                continue
            fi
            ln -sf gpuq "$bindir/$cmd" || die "cannot link $bindir/$cmd to gpuq"
        done
        say "linked sbatch, srun, salloc, sattach, squeue, sacct, scancel, scontrol, sinfo to gpuq in $bindir (--no-slurm-links skips)"
    fi

    no_advertise=0
    conf="$etc/gpuq.toml"
    if [ -e "$conf" ]; then
        say "kept $conf: an existing config is never overwritten (config/$daemon.toml in the gpuq sources documents every key)"
        [ -z "$advertise" ] || say "note: --advertise was not written into the kept config; set advertise in its [server] table"
    elif [ "$role" = server ]; then
        if [ -z "$advertise" ] && [ -z "$root" ]; then
            ip=""
            if command -v ip >/dev/null 2>&1; then
                ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p') || ip=""
            fi
            if [ -z "$ip" ] && command -v hostname >/dev/null 2>&1; then
                ip=$(hostname -I 2>/dev/null | awk '{ print $1 }') || ip=""
            fi
            if ip_port_ok "$ip:7420"; then
                advertise="$ip:7420"
                say "advertising $advertise (this host's primary IPv4; --advertise IP:PORT chooses another)"
            fi
        fi
        if [ -n "$advertise" ]; then
            example_server_toml | sed "s|^# advertise = .*|advertise = \"$advertise\"|" >"$tmp/gpuq.toml"
        else
            example_server_toml >"$tmp/gpuq.toml"
            no_advertise=1
        fi
    else
        edit=""
        if [ -n "$join" ]; then
            edit="s|^# servers = .*|servers = [\"$join\"]|;"
        fi
        if [ "$role" = login ]; then
            edit="${edit}s|^# role = \"compute\"|role = \"login\"|"
        fi
        example_agent_toml | sed "$edit" >"$tmp/gpuq.toml"
    fi
    if [ ! -e "$conf" ]; then
        chmod 0644 "$tmp/gpuq.toml"
        mv -f "$tmp/gpuq.toml" "$conf" || die "cannot write $conf"
        say "wrote $conf"
    fi

    if [ "$write_env" = 1 ]; then
        (
            umask 077
            {
                say "# gpuq $role: written by install.sh, read by $unit.service (EnvironmentFile)."
                say "$argsvar=\"$args\""
                if [ -n "$token" ]; then
                    say "# Used once, to join; the daemon then keeps its certificate."
                    say "GPUQ_TOKEN=$token"
                fi
            } >"$etc/.$envfile.new"
        ) || die "cannot write $etc/$envfile"
        chmod 0600 "$etc/.$envfile.new"
        mv -f "$etc/.$envfile.new" "$etc/$envfile" || die "cannot write $etc/$envfile"
        say "wrote $etc/$envfile (0600)"
    else
        chmod 0600 "$etc/$envfile"
        say "kept $etc/$envfile (no --bootstrap or --join given)"
    fi

    unitfile="$root/etc/systemd/system/$unit.service"
    if [ "$role" = server ]; then
        example_server_unit >"$tmp/unit"
    else
        example_agent_unit >"$tmp/unit"
    fi
    sed "s|/usr/local/bin/gpuq|$prefix/bin/gpuq|" "$tmp/unit" >"$tmp/unit.out"
    chmod 0644 "$tmp/unit.out"
    mv -f "$tmp/unit.out" "$unitfile" || die "cannot write $unitfile"
    say "wrote $unitfile"

    # ---- start -------------------------------------------------------------

    why=""
    if [ "$role" = server ] && [ -n "$join" ] && [ "$runs" = 1 ] &&
        ! "$bindir/gpuq" server --help 2>/dev/null | grep -q -e '--join'; then
        say "note: this gpuq's server has no --join yet (joining servers comes in a later release); $envfile passes it, so install a newer binary before starting $unit"
        why="this binary's server cannot join"
    elif [ "$no_advertise" = 1 ]; then
        say "note: set advertise = \"IP:7420\" in the [server] table of /etc/gpuq/gpuq.toml (or GPUQ_ADVERTISE): agents and peers dial that address"
        why="advertise is not set"
    elif [ -n "$root" ]; then
        why="--root"
    elif [ "$no_start" = 1 ]; then
        why="--no-start"
    elif [ ! -d /run/systemd/system ]; then
        why="systemd is not running"
    fi

    if [ -z "$why" ]; then
        was_active=0
        if systemctl is-active --quiet "$unit"; then
            was_active=1
        fi
        systemctl daemon-reload || die "systemctl daemon-reload failed"
        systemctl enable --now "$unit" || die "systemctl enable --now $unit failed; see journalctl -u $unit"
        # enable --now leaves a running daemon on its old binary.
        if [ "$was_active" = 1 ]; then
            systemctl restart "$unit" || die "systemctl restart $unit failed; see journalctl -u $unit"
        fi
        say "started $unit; journalctl -u $unit -f follows its log"
        return 0
    fi

    say "not started: $why."
    if [ -d /run/systemd/system ]; then
        say "to start it: systemctl daemon-reload && systemctl enable --now $unit"
    else
        cmd="$prefix/bin/gpuq $daemon --config /etc/gpuq/gpuq.toml${args:+ $args}"
        if grep -q '^GPUQ_TOKEN=.' "$etc/$envfile"; then
            cmd="sh -c '. /etc/gpuq/$envfile && export GPUQ_TOKEN && exec $cmd'"
        fi
        say "systemd is not running here; run the $daemon by hand, as root, under whatever keeps it running:"
        say "  $cmd"
    fi
}

# ---- the files this script writes (copies; tests/install.rs compares them,
# packaging/embed.py refreshes them) ----

# config/server.toml
example_server_toml() {
    cat <<'GPUQ_EOF'
# gpuq server configuration: a member of the Raft control plane.
#
# Install as /etc/gpuq/gpuq.toml (one file per host; a host that also runs an
# agent adds the [agent] table from agent.toml to the same file). Every key is
# optional: each line below shows the key commented out with its default.
# Unknown keys are errors.
#
# Environment variables override the file, and command-line flags override
# both: GPUQ_CLUSTER_NAME, GPUQ_NODE_NAME, GPUQ_DATA_DIR, GPUQ_LISTEN,
# GPUQ_ADVERTISE, GPUQ_SOCKET, GPUQ_HTTP_LISTEN, GPUQ_ADMIN_GROUP. An empty GPUQ_ADVERTISE or
# GPUQ_ADMIN_GROUP clears the setting.

[server]

# Name of the cluster; shown by `gpuq cluster` and written into certificates.
# Letters, digits, '-', '_' and '.'.
# cluster_name = "gpuq"

# Name of this server in the cluster. Default: this host's name up to the
# first dot (as Slurm names nodes).
# node_name = "gpu-server-01"

# Where the Raft log and the replicated state (one redb file) live.
# data_dir = "/var/lib/gpuq/server"

# UDP address for QUIC: Raft peers, agents and API clients connect here.
# listen = "0.0.0.0:7420"

# The address other servers and agents dial to reach this server. Default:
# unset, meaning `listen`; required when `listen` is 0.0.0.0 or [::].
# advertise = "10.0.0.1:7420"

# Unix socket for the gpuq CLI on this host.
# socket = "/run/gpuq/gpuq.sock"

# TCP address of the HTTP port: Prometheus metrics at /metrics, /healthz,
# the JSON API under /api/v1/ (bearer tokens from `gpuq token create --role
# user`) and the web page at /. A request from this host's loopback may read
# without a token; any other needs one. An address beyond loopback is served
# over TLS with this server's certificate (signed by the cluster CA, named
# for node_name: `curl --cacert ca.pem https://NODE_NAME:7480/`); the
# port taken by another process is an error at start.
# http_listen = "127.0.0.1:7480"

# Members of this Unix group are gpuq admins (as is root). Default: unset,
# only root.
# admin_group = "gpuq-admin"

# Users who are admins when they run gpuq on another host (a login node or a
# compute node), where that host says they are admin (root or its
# admin_group). Default: none, so admin commands (tokens, drain, policy,
# membership) work only on a server itself: root on one compute node is not
# root of the cluster. Whoever controls any node can claim these names, so
# list only what you must (and "root" only if you trust every node's root).
# admin_users = ["alice"]

# Hide other users' jobs from ordinary users in `gpuq queue`, `show` and
# `acct` (Slurm's PrivateData=jobs). Either way, a job's environment and
# script are shown only to its owner and admins.
# private_jobs = false

# The longest lifetime a join token may be given (`gpuq token create --ttl`).
# max_token_ttl_secs = 604800

# Seconds without a heartbeat after which a node is declared down: its tasks
# are lost and their jobs requeue (or end NODE_FAIL, per their policy). After a
# leader change every node gets this long again before it can be declared down.
# node_ttl_secs = 10

# Seconds after a job ends before it moves from memory to the history archive
# on disk (same redb file, replicated in snapshots). `gpuq show` and `gpuq acct`
# answer for archived jobs too; `gpuq queue --all` lists only those not yet
# archived. The leader's value counts.
# history_retention_secs = 300

# Seconds an interactive allocation (salloc, srun outside an allocation, gpuq
# run) is held without a word from its client, which renews it every third of
# this while it runs: a client that was killed, or whose laptop closed, has its
# allocation released (ended TIMEOUT) this long after its last renewal, not held
# until its time limit. Slurm's InactiveLimit. 0: never. The leader's counts.
# inactive_limit_secs = 300
# Seconds a running job's GPUs may all sit idle (no GPU over 5% busy, as
# its agents sample them) before `gpuq queue` and `gpuq show` flag the job
# idle: a hung rank, a crashed worker, a notebook left open. 0: never.
# idle_gpu_secs = 1800

# Ports MASTER_PORT is chosen from, FIRST-LAST: each job gets one no other
# running job with its rank 0 on the same node has. A cluster setting: the
# server that bootstraps the cluster writes its value into the replicated
# state (every server must pick the same ports), so on servers that join later
# this key has no effect. Ports below 1024 are refused (tasks run as users).
# master_port_range = "29500-30499"

[server.raft]

# How often the leader heartbeats followers. Must be below
# election_timeout_min_ms (a quarter of it is usual).
# heartbeat_ms = 150

# A follower that hears no leader for a random time in [min, max) starts an
# election, after openraft 0.9's leader lease of max on top: a follower
# stands max + [min, max) after the last heartbeat (and a peer refuses
# votes for max after it), so a leader failover takes about that long
# (1.8-2.4 s with the defaults). min must be below max.
# election_timeout_min_ms = 600
# election_timeout_max_ms = 1200

# Take a snapshot of the state (and purge the log behind it) after this many
# log entries.
# snapshot_after_logs = 10000

# Log entries kept behind the latest snapshot: a follower that lags by fewer
# catches up from the log; one further behind (or a new server) is sent the
# snapshot, in chunks.
# logs_kept_after_snapshot = 1000

# At most this many log entries per replication message.
# max_payload_entries = 512

[server.bootstrap]

# Form a new cluster of this many servers, all started at once, with no
# server created first by hand (`--bootstrap-expect`). 0: off. Every server
# gets the same expect, peers and secret; the lowest peer address creates the
# cluster and the others join it, proving the shared secret. Ignored once the
# data dir holds a cluster.
# expect = 0

# Every server's advertised IP:PORT, this one's included (`--peers`).
# peers = ["10.0.0.1:7420", "10.0.0.2:7420", "10.0.0.3:7420"]

# A file (mode 0600) holding the shared secret, at least 16 characters, e.g.
# from `openssl rand -hex 16`. GPUQ_BOOTSTRAP_SECRET overrides it.
# secret_file = "/etc/gpuq/bootstrap.secret"
GPUQ_EOF
}

# config/agent.toml
example_agent_toml() {
    cat <<'GPUQ_EOF'
# gpuq agent configuration: one per compute node, and one per login node.
#
# Install as /etc/gpuq/gpuq.toml (one file per host; a host that also runs a
# server adds the [server] tables from server.toml to the same file). Every
# key is optional: each line below shows the key commented out with its
# default. Unknown keys are errors.
#
# Environment variables override the file, and command-line flags override
# both: GPUQ_NODE_NAME, GPUQ_DATA_DIR, GPUQ_LISTEN, GPUQ_SOCKET,
# GPUQ_HTTP_LISTEN, GPUQ_ADMIN_GROUP, GPUQ_SERVERS (comma-separated
# HOST:PORT). An empty GPUQ_ADMIN_GROUP clears the setting.

[agent]

# Name of this node in the cluster, as `gpuq nodes` shows it. Default: this
# host's name up to the first dot (as Slurm names nodes).
# node_name = "gpu-node-01"

# Where the agent keeps its ledger of tasks, so a restart re-adopts them.
# data_dir = "/var/lib/gpuq/agent"

# UDP address for QUIC.
# listen = "0.0.0.0:7421"

# Unix socket for the gpuq CLI on this host.
# socket = "/run/gpuq/gpuq.sock"

# TCP address of the agent's HTTP port: Prometheus metrics at /metrics (the
# node's GPUs: utilisation, memory, temperature, power, ECC and XID counts,
# labelled with the job and user holding each) and /healthz. Loopback only
# for now: scrape it from a Prometheus agent on the node. The port taken by
# another process is an error at start.
# http_listen = "127.0.0.1:7481"

# A directory for dcgm-exporter's job mapping (its --hpc-job-mapping-dir):
# one file per GPU index, holding the ids of the jobs on that GPU, one per
# line, so dcgm-exporter labels its metrics with hpc_job. Default: unset,
# no files.
# dcgm_job_map_dir = "/run/dcgm-job-map"

# Servers to contact, as HOST:PORT; any one of them will do, the agent finds
# the leader. The leader tells the agent every member's address; the agent
# adds them and keeps the list in data_dir/servers.json, so it fails over to
# servers not listed here, also after a restart. Default: none (given at
# join time).
# servers = ["gpu-server-01:7420", "gpu-server-02:7420", "gpu-server-03:7420"]

# "compute" runs jobs; "login" runs none and only vouches for the users who
# submit from this host.
# role = "compute"

# Members of this Unix group are gpuq admins (as is root). Default: unset,
# only root.
# admin_group = "gpuq-admin"

# Where this node's GPUs come from: "auto" (NVML if the NVIDIA driver loads,
# else no GPUs, said in one log line), "nvml" (the driver must load), "none",
# or simulated GPUs for tests and `gpuq dev` (every fake key is optional; the
# defaults describe a DGX H100):
#   gpus = { fake = { count = 8, model = "NVIDIA H100 80GB HBM3", memory_mb = 81559,
#                     numa_nodes = 2, nvlink = "nvswitch", fault_file = "/run/gpuq/faults" } }
# nvlink is "nvswitch" (all pairs NV18), "pairs" (0-1, 2-3, ...) or "none".
# Fake MIG: mig = "1g.10gb:7" partitions every fake GPU (profiles of an 80 GB
# H100: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb; a layout fits 7
# compute and 8 memory slices, e.g. "3g.40gb,2g.20gb,1g.10gb:2"), and the key
# mig_per_gpu, e.g. ["1g.10gb:7", "", "3g.40gb:2"], partitions GPUs by index
# ("" and GPUs past the list stay whole). With NVML, a GPU in MIG mode is
# reported as its MIG instances (partition it with nvidia-smi).
# gpus = "auto"

# CPUs kept for the system and the agent; jobs never get them.
# reserved_cpus = 0

# Memory in MiB kept for the system and the agent.
# reserved_memory_mb = 0

# The node's place in the network, as a path of domains, e.g. "spine1/leaf3".
# topology = ""

# Features jobs can ask for with --constraint, e.g. ["ib", "nvme"].
# features = []

# Schedulable CPUs and memory (MiB) to declare instead of what this host
# has: for simulated nodes and `gpuq dev`. Unset: read from /proc and /sys,
# less the reserved amounts.
# cpus = 64
# memory_mb = 524288

# Whether tasks may run as root. Off: a job submitted by root is refused on
# this node with a clear reason.
# allow_root = false

# Seconds between SIGTERM and SIGKILL when a task is stopped (cancel, a failed
# rank elsewhere in the gang, the time limit).
# kill_grace_secs = 10

# A node joining the cluster for the first time stays drained until its
# health check has passed once (needs [agent.health_check]).
# preflight = false

# A command run every interval_secs (with /bin/sh -c, as root): a non-zero
# exit, or no exit within timeout_secs, drains the node with the command's
# output as the reason; a later pass resumes a node it drained. Default: none.
# [agent.health_check]
# command = "/usr/local/sbin/node-health"
# interval_secs = 60
# timeout_secs = 30

# How the tasks of jobs with --container-image run here: the OCI runtime,
# a name looked up in PATH or an absolute path. Default: crun, else runc,
# from PATH when a task starts; with neither, such tasks fail saying so.
# Unpacked images (layouts, OCI and docker archives, squashfs files,
# docker:// references pulled with skopeo) are cached in data_dir/images,
# one directory per image digest (each unpack is one line of
# data_dir/images/unpacks.log); past cache_max_mb MiB, the least recently
# used images no task runs in are removed (0: no cap; default 102400).
# GPUs go into containers through the CDI spec files (JSON or YAML, as
# `nvidia-ctk cdi generate` writes them) in cdi_spec_dirs: each task gets
# its GPUs' device nodes, driver mounts, variables and hooks. With no spec
# there, a task gets its GPUs' device nodes only (`gpuq nodes` shows
# crun+cdi where specs were found at the agent's start).
# docker:// images are pulled with pull_tool (skopeo from PATH by default;
# "" pulls none). insecure_registries are reached over plain HTTP or
# unverified TLS (HOST or HOST:PORT as the image reference names them);
# registry_auth_file holds the pull credentials, as `podman login` or
# `docker login` writes them (default: the tool's own, root's).
# rootless: crun runs as the job's user in a user namespace that maps only
# that user (the image's root files show as nobody), where the kernel lets
# users make user namespaces; elsewhere, with runc, for root's own tasks and
# for tasks whose CDI spec has hooks, it runs as root (`gpuq nodes` shows
# crun+rootless where it is rootless). An agent that is not root runs
# containers only rootless. podman, docker and apptainer are engines, not
# runtimes: naming one as runtime is refused.
# [agent.containers]
# runtime = "/usr/bin/crun"
# cache_max_mb = 102400
# cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
# pull_tool = "skopeo"
# insecure_registries = ["registry.lan:5000"]
# registry_auth_file = "/etc/gpuq/registry-auth.json"
# rootless = true
GPUQ_EOF
}

# systemd/gpuq-server.service
example_server_unit() {
    cat <<'GPUQ_EOF'
[Unit]
Description=gpuq control-plane server (Raft member)
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
# server.env (written by packaging/install.sh, mode 0600) holds
# GPUQ_SERVER_ARGS: "--bootstrap" on the first server (harmless once the
# cluster exists), or "--join HOST:PORT" with GPUQ_TOKEN on later ones.
EnvironmentFile=-/etc/gpuq/server.env
ExecStart=/usr/local/bin/gpuq server --config /etc/gpuq/gpuq.toml $GPUQ_SERVER_ARGS
Restart=on-failure
RestartSec=2
LimitNOFILE=1048576
RuntimeDirectory=gpuq
RuntimeDirectoryPreserve=yes
# The data dir holds the replicated state, the cluster CA's key among it:
# nobody else reads it, and every file gpuq creates is its owner's alone.
StateDirectory=gpuq/server
StateDirectoryMode=0700
UMask=0077
# The Raft log is fsynced; give shutdown time to finish a write.
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
GPUQ_EOF
}

# systemd/gpuq-agent.service
example_agent_unit() {
    cat <<'GPUQ_EOF'
[Unit]
Description=gpuq node agent
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
# agent.env (written by packaging/install.sh, mode 0600) holds GPUQ_TOKEN,
# which gpuq reads, and GPUQ_AGENT_ARGS, e.g. "--join 10.0.0.1:7420" or
# "--role login --join 10.0.0.1:7420". The token is used once, to join; the
# agent then keeps its certificate in its data dir. Without the file the agent
# runs from gpuq.toml alone.
EnvironmentFile=-/etc/gpuq/agent.env
ExecStart=/usr/local/bin/gpuq agent --config /etc/gpuq/gpuq.toml $GPUQ_AGENT_ARGS
Restart=always
RestartSec=2
LimitNOFILE=1048576
RuntimeDirectory=gpuq
RuntimeDirectoryPreserve=yes
# 0711: the tasks' users pass through to their own task's script and list
# nothing; the node's key sits in a 0700 tls/ below. The daemon's files are
# its own (UMask); tasks get the usual umask 022.
StateDirectory=gpuq/agent
StateDirectoryMode=0711
UMask=0077
# Tasks run under their own shims in their own cgroups and must outlive an
# agent restart or upgrade: stop only the agent process itself.
KillMode=process
Delegate=yes

[Install]
WantedBy=multi-user.target
GPUQ_EOF
}

main "$@"

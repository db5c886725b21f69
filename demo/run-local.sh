#!/usr/bin/env bash
# The demo without Docker, in one command: starts what is missing — a PostgreSQL cluster with
# wal_level=logical and the outbox from sql/, and Apache Kafka — then Ferry and the demo writer,
# and prints the events as a consumer reads them back from Kafka. On a fresh machine it first
# installs what it needs (`bash .ci/install-deps`: PostgreSQL, a JDK, Apache Kafka's jars from
# Maven Central; root or sudo for the packages).
#
#   bash demo/run-local.sh              # until Ctrl-C; everything it started stops, its files go
#   bash demo/run-local.sh --check [N]  # exits 0 once N (default 30) events were read back, 1 if
#                                       # they do not arrive within DEMO_TIMEOUT seconds (CI)
#
# Needs: cargo, to build what is not given prebuilt (below); the rest it installs. Environment
# (none needed; all optional):
#
#   FERRY_BIN            a prebuilt `ferry` binary to run instead of building one (a release, or
#                        one copied out of the image)
#   FERRY_DEMO_CONSUMER_BIN
#                        a prebuilt `ferry-demo-consumer` (crates/ferry-testkit), the consumer that
#                        creates the demo topics and prints the events read back
#   FERRY_DEMO_KAFKA_BIN a prebuilt `ferry-test-kafka` (crates/ferry-testkit), which starts the local
#                        broker; not needed with DEMO_KAFKA_BROKERS
#                        What is not given is built with `cargo build` (debug, target/); with all
#                        three given (or two and DEMO_KAFKA_BROKERS), no cargo is needed. These are
#                        not Ferry's configuration: Ferry is started with FERRY_* variables of the
#                        script's own only.
#   DEMO_PG_URL          a superuser URL of a server with wal_level=logical to use instead of a
#                        local cluster (the script creates the outbox table and the publication if
#                        missing, and drops its slot `ferry_demo` on exit)
#   DEMO_KAFKA_BROKERS   bootstrap servers of a broker to use instead of a local one
#   DEMO_PG_PORT, DEMO_KAFKA_PORT, DEMO_HTTP_PORT
#                        ports for the local cluster, the local broker and Ferry's /metrics
#                        (default: free ports)
#   DEMO_PG_BINDIR       PostgreSQL server binaries (default: newest /usr/lib/postgresql/*/bin,
#                        else PATH)
#   DEMO_WRITE_INTERVAL  seconds between the writer's transactions (default 1; 0.2 with --check)
#   DEMO_TIMEOUT         seconds each start-up step and the --check may take (default 120)
#
# Readiness is waited for, never assumed: pg_ctl -w (the server accepts connections), the broker
# answering a metadata request, Ferry's /readyz (streaming from its slot) before the writer's first
# row; rows committed before the slot exists would not be in its stream. The variables are named
# DEMO_*, not FERRY_*: Ferry reads FERRY_* variables as its configuration, and the script hands
# Ferry an environment without any FERRY_* variable but the ones it sets.
set -euo pipefail
cd "$(dirname "$0")/.."

check=false
want=30
case "${1:-}" in
  --check) check=true; want=${2:-30} ;;
  "") ;;
  *) echo "usage: bash demo/run-local.sh [--check [N]]" >&2; exit 2 ;;
esac
timeout_s=${DEMO_TIMEOUT:-120}
interval=${DEMO_WRITE_INTERVAL:-$($check && echo 0.2 || echo 1)}
topics=outbox.event.order,outbox.event.customer
slot=ferry_demo

say() { echo "demo: $*" >&2; }
die() { echo "demo: error: $*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-demo.XXXXXX")
chmod 0755 "$work"
pids=()
pg_started=false
pg_ctl_as=()

cleanup() {
  local rc=$?
  # Ignored, not reset: bash re-raises a SIGINT that arrived during `wait` once the waited-for
  # child exits, which with the default action would kill this clean-up half-way.
  trap - EXIT
  trap '' INT TERM
  # In reverse order of start, each gone before the next: the consumer, the writer, Ferry
  # (SIGTERM: it drains and confirms while the broker is still there), the broker.
  for ((i=${#pids[@]}-1; i>=0; i--)); do
    kill -TERM "${pids[$i]}" 2>/dev/null || true
    wait "${pids[$i]}" 2>/dev/null || true
  done
  if [ -n "${DEMO_PG_URL:-}" ] && [ -n "${psql_cmd:-}" ]; then
    "${psql_cmd[@]}" -c "SELECT pg_drop_replication_slot('$slot') FROM pg_replication_slots \
      WHERE slot_name = '$slot' AND NOT active" >/dev/null 2>&1 || true
  fi
  if $pg_started; then
    "${pg_ctl_as[@]}" "$pg_bindir/pg_ctl" -D "$work/pg/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  if [ $rc -ne 0 ] && [ $rc -ne 130 ]; then
    for log in "$work"/*.log "$work"/pg/*.log; do
      [ -f "$log" ] || continue
      echo "--- last lines of $(basename "$log")" >&2
      tail -n 20 "$log" >&2
    done
  fi
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# http_get PATH: GET http://127.0.0.1:$http_port/PATH with bash's /dev/tcp (no curl needed);
# HTTP/1.0, so the body is never chunked. Prints the body, fails unless the status is 200.
http_get() {
  local status body
  exec 3<>"/dev/tcp/127.0.0.1/$http_port" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$1" >&3
  body=$(cat <&3)
  exec 3<&-
  status=$(head -n 1 <<<"$body")
  [[ $status == *" 200 "* ]] || return 1
  sed '1,/^\r\?$/d' <<<"$body"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_for WHAT PID CMD...: runs CMD until it succeeds; fails when PID (the server being waited
# for, or 0 for none) exits or DEMO_TIMEOUT passes. The pause between tries is the polling
# interval, not the synchronization: the condition is what is waited on.
wait_for() {
  local what=$1 pid=$2; shift 2
  local deadline=$(( $(date +%s) + timeout_s ))
  until "$@" >/dev/null 2>&1; do
    if [ "$pid" != 0 ] && ! kill -0 "$pid" 2>/dev/null; then die "$what: the process exited"; fi
    [ "$(date +%s)" -lt "$deadline" ] || die "$what: not ready within ${timeout_s}s"
    sleep 0.1
  done
}

# --- set-up and build ---------------------------------------------------------------------------
# Each binary: the prebuilt one given, else built here (cargo build, debug).
built="${CARGO_TARGET_DIR:-target}/debug"
ferry_bin=${FERRY_BIN:-}
consumer_bin=${FERRY_DEMO_CONSUMER_BIN:-}
kafka_bin=${FERRY_DEMO_KAFKA_BIN:-}
[ -n "${DEMO_KAFKA_BROKERS:-}" ] && kafka_bin=none
for given in FERRY_BIN:"$ferry_bin" FERRY_DEMO_CONSUMER_BIN:"$consumer_bin" \
  FERRY_DEMO_KAFKA_BIN:"$kafka_bin"; do
  var=${given%%:*} path=${given#*:}
  case "$path" in
    ""|none) ;;
    *) [ -x "$path" ] && [ -f "$path" ] || die "$var=$path is not an executable file: point it at \
a built binary, or leave $var unset to build one with cargo" ;;
  esac
done
build=()
[ -n "$ferry_bin" ] || build+=(-p ferry --bin ferry)
[ -n "$consumer_bin" ] || build+=(--bin ferry-demo-consumer)
[ -n "$kafka_bin" ] || build+=(--bin ferry-test-kafka)
if [ -z "$consumer_bin" ] || [ -z "$kafka_bin" ]; then
  build+=(-p ferry-testkit --features ferry-testkit/kafka)
fi
if [ ${#build[@]} -gt 0 ]; then
  command -v cargo >/dev/null || die "cargo is not on PATH: install the Rust toolchain (rustup.rs), \
or give prebuilt binaries (FERRY_BIN, FERRY_DEMO_CONSUMER_BIN, FERRY_DEMO_KAFKA_BIN; see the \
script's header)"
fi
if [ -z "${DEMO_PG_URL:-}" ] || [ -z "${DEMO_KAFKA_BROKERS:-}" ]; then
  say "installing what is missing (bash .ci/install-deps; nothing when all is there)"
  bash .ci/install-deps >/dev/null || die "bash .ci/install-deps failed (it says why above)"
fi
if [ ${#build[@]} -gt 0 ]; then
  say "building what was not given prebuilt (cargo build ${build[*]})"
  cargo build --quiet "${build[@]}"
fi
ferry_bin=${ferry_bin:-$built/ferry}
consumer_bin=${consumer_bin:-$built/ferry-demo-consumer}
kafka_bin=${kafka_bin:-$built/ferry-test-kafka}
say "ferry: $ferry_bin ($("$ferry_bin" --version 2>/dev/null || echo "version unknown"))"

# --- PostgreSQL ------------------------------------------------------------------------------
if [ -n "${DEMO_PG_URL:-}" ]; then
  pg_url=$DEMO_PG_URL
  say "PostgreSQL: using DEMO_PG_URL"
else
  pg_bindir=${DEMO_PG_BINDIR:-}
  if [ -z "$pg_bindir" ]; then
    # The newest version with server binaries (a client-only install has no initdb), else PATH.
    for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V); do
      [ -x "$d/initdb" ] && pg_bindir=$d
    done
    [ -n "$pg_bindir" ] \
      || pg_bindir=$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")
  fi
  { [ -x "$pg_bindir/initdb" ] && [ -x "$pg_bindir/pg_ctl" ]; } || die "no PostgreSQL server binaries \
(initdb, pg_ctl): run \`bash .ci/install-deps\` (needs root or sudo), set DEMO_PG_BINDIR to their \
directory, or DEMO_PG_URL to a server with wal_level=logical"
  if [ "$(id -u)" = 0 ]; then
    # initdb refuses to run as root: the cluster runs as `postgres`, as the tests' clusters do.
    id -u postgres >/dev/null 2>&1 || die "running as root, and initdb refuses root, but there is \
no user postgres to run the cluster as: run \`bash .ci/install-deps\` (creates it) or run as a \
non-root user"
    pg_ctl_as=(runuser -u postgres --)
  fi
  pg_port=${DEMO_PG_PORT:-$(free_port)}
  mkdir -p "$work/pg"
  [ "$(id -u)" = 0 ] && chown postgres: "$work/pg"
  say "PostgreSQL: initdb and start on 127.0.0.1:$pg_port ($pg_bindir)"
  "${pg_ctl_as[@]}" "$pg_bindir/initdb" -D "$work/pg/data" -U postgres -A trust -E UTF8 \
    --locale=C --no-sync >"$work/initdb.log" 2>&1 || die "initdb failed (log above)"
  pg_started=true
  # -w: pg_ctl returns once the server accepts connections (or fails when it cannot start).
  "${pg_ctl_as[@]}" "$pg_bindir/pg_ctl" -D "$work/pg/data" -l "$work/pg/postgres.log" -w \
    -t "$timeout_s" -o "-c port=$pg_port -c listen_addresses=127.0.0.1 \
      -c unix_socket_directories='$work/pg' -c wal_level=logical -c fsync=off" start >/dev/null \
    || die "PostgreSQL did not start on port $pg_port (log above)"
  pg_url="host=127.0.0.1 port=$pg_port user=postgres dbname=postgres sslmode=disable"
fi
psql_cmd=(psql "$pg_url" -X -q -v ON_ERROR_STOP=1)
[ "$("${psql_cmd[@]}" -tAc 'SHOW wal_level')" = logical ] \
  || die "the server's wal_level is not logical: set wal_level = logical and restart it"
"${psql_cmd[@]}" -f sql/outbox.sql
if [ "$("${psql_cmd[@]}" -tAc "SELECT count(*) FROM pg_publication WHERE pubname = 'ferry_outbox'")" = 0 ]; then
  "${psql_cmd[@]}" -f sql/publication.sql
fi

# --- broker ----------------------------------------------------------------------------------
if [ -n "${DEMO_KAFKA_BROKERS:-}" ]; then
  brokers=$DEMO_KAFKA_BROKERS
  say "Kafka: using DEMO_KAFKA_BROKERS=$brokers"
  broker_pid=0
else
  kafka_port=${DEMO_KAFKA_PORT:-$(free_port)}
  say "Kafka: Apache Kafka (one KRaft node) on 127.0.0.1:$kafka_port (log: $work/broker.log)"
  # ferry-test-kafka formats fresh storage, starts the broker, prints the bootstrap list once the
  # metadata lists it, and stops it cleanly on SIGTERM.
  "$kafka_bin" --port "$kafka_port" >"$work/broker.out" 2>"$work/broker.log" &
  broker_pid=$!
  pids+=("$broker_pid")
  wait_for "Apache Kafka on port $kafka_port" "$broker_pid" test -s "$work/broker.out"
  brokers=$(head -n 1 "$work/broker.out")
fi
# Waits until the broker answers metadata (up to DEMO_TIMEOUT), then creates the demo topics:
# a broker need not auto-create them (managed Kafka does not).
"$consumer_bin" --brokers "$brokers" --topics "$topics" --create-topics --prepare-only \
  --timeout "$timeout_s" || die "the broker at $brokers is not usable"

# --- Ferry -----------------------------------------------------------------------------------
http_port=${DEMO_HTTP_PORT:-$(free_port)}
say "Ferry: slot $slot, /metrics on http://127.0.0.1:$http_port (log: $work/ferry.log)"
unset_ferry=()
while read -r v; do unset_ferry+=(-u "$v"); done < <(compgen -e | grep '^FERRY_' || true)
# A progress topic per run: the demo's slot is dropped on exit (and a local cluster is new each
# run), so a record an earlier run left in a reused broker would rightly be a gap to this one.
progress_topic="ferry-demo.progress.$(date +%s).$$"
env "${unset_ferry[@]}" \
  FERRY_POSTGRES_URL="$pg_url" FERRY_POSTGRES_SLOT=$slot FERRY_POSTGRES_CREATE_PUBLICATION=false \
  FERRY_KAFKA_BROKERS="$brokers" FERRY_HTTP_LISTEN="127.0.0.1:$http_port" \
  FERRY_KAFKA_PROGRESS_TOPIC="$progress_topic" \
  "$ferry_bin" run >"$work/ferry.log" 2>&1 &
ferry_pid=$!
pids+=("$ferry_pid")
wait_for "Ferry's /readyz (streaming from slot $slot)" "$ferry_pid" \
  http_get /readyz

# --- writer and consumer ---------------------------------------------------------------------
say "writer: demo/writer.sql every ${interval}s (3 events per transaction)"
(
  while true; do
    "${psql_cmd[@]}" -f demo/writer.sql >/dev/null || exit 1
    sleep "$interval"  # the writer's pace, not a synchronization
  done
) >"$work/writer.log" 2>&1 &
pids+=("$!")

if $check; then
  say "reading $want events back from $topics (up to ${timeout_s}s)"
  "$consumer_bin" --brokers "$brokers" --topics "$topics" --count "$want" \
    --timeout "$timeout_s" || die "fewer than $want events arrived"
  produced=$(http_get /metrics \
    | awk '/^ferry_records_produced_total/ {s += $2} END {print s + 0}')
  say "ok: $want events read back from Kafka (ferry_records_produced_total $produced)"
else
  say "events as they arrive (Ctrl-C stops everything):"
  "$consumer_bin" --brokers "$brokers" --topics "$topics" --timeout "$timeout_s" &
  pids+=("$!")
  wait "$!"
fi

#!/usr/bin/env bash
# What costs the bench's ZooKeeper its throughput (issue 19 §6): the same
# cells (W1 at 64 clients, W2) against a standalone ZooKeeper started by hand
# in the tests' configuration, then with one production setting changed at a
# time, then in the production configuration (fencelock-testkit's
# `Profile::Production`). Variants run round-robin, `RUNS` rounds, so drift on
# a shared machine hits them alike; each prints cycles/s per cell and run, with
# every client on its own connection (as separate processes: the backend then
# opens and closes a ZooKeeper session per cycle, since a client that holds
# nothing keeps no session) and with one shared connection (one session, kept
# open by the other clients' guards).
#
#   bench/zk-ablation.sh [BENCH_BINARY] [OUT_DIR]
#
# Env: RUNS (default 2), SECONDS_PER_RUN (default 3), TTL_MS (default 10000).
set -euo pipefail

BENCH=${1:-target/release/fencelock-bench}
OUT=${2:-$(mktemp -d /tmp/zk-ablation.XXXXXX)}
RUNS=${RUNS:-2}
SECS=${SECONDS_PER_RUN:-3}
TTL_MS=${TTL_MS:-10000}
ZK_JAR=/usr/share/java/zookeeper.jar
LOG4J=/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar

# name: tick, JVM flags, logging (none | warn-file)
VARIANTS=(
  "test|100|-Xmx256m -XX:+UseSerialGC|none"
  "tick2000|2000|-Xmx256m -XX:+UseSerialGC|none"
  "g1-1g|100|-Xmx1g -XX:+UseG1GC|none"
  "log-warn|100|-Xmx256m -XX:+UseSerialGC|warn-file"
  "log-info|100|-Xmx256m -XX:+UseSerialGC|info-file"
  "production|2000|-Xmx1g -XX:+UseG1GC|warn-file"
)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_zk() { # dir tick jvm logging -> prints pid, port in $dir/port
  local dir=$1 tick=$2 jvm=$3 logging=$4 port cp
  port=$(free_port)
  mkdir -p "$dir"
  {
    echo "tickTime=$tick"
    echo "dataDir=$dir/data"
    echo "dataLogDir=$dir/txlog"
    echo "clientPort=$port"
    echo "clientPortAddress=127.0.0.1"
    echo "maxClientCnxns=0"
    echo "admin.enableServer=false"
    echo "4lw.commands.whitelist=srvr,ruok"
    echo "forceSync=yes"
    if [ "$tick" = 100 ]; then echo "minSessionTimeout=200"; echo "maxSessionTimeout=60000"; fi
  } >"$dir/zoo.cfg"
  cp="/etc/zookeeper/conf:$ZK_JAR"
  if [ "$logging" != none ]; then
    local level=WARN
    [ "$logging" = info-file ] && level=INFO
    printf 'log4j.rootLogger=%s, FILE\nlog4j.appender.FILE=org.apache.log4j.FileAppender\nlog4j.appender.FILE.File=%s/zk.log\nlog4j.appender.FILE.layout=org.apache.log4j.PatternLayout\nlog4j.appender.FILE.layout.ConversionPattern=%%d %%-5p [%%t] %%c{1}: %%m%%n\n' \
      "$level" "$dir" >"$dir/log4j.properties"
    cp="$dir:$ZK_JAR:$LOG4J"
  fi
  # shellcheck disable=SC2086
  java $jvm -cp "$cp" -Dzookeeper.log.dir="$dir" org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg" \
    >"$dir/stdout.log" 2>&1 &
  echo $! >"$dir/pid"
  echo "$port" >"$dir/port"
  for _ in $(seq 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port" && printf srvr >&3 && timeout 1 cat <&3) 2>/dev/null | grep -q Mode; then
      return 0
    fi
    sleep 0.2
  done
  echo "ZooKeeper ($dir) did not start" >&2
  exit 1
}

mkdir -p "$OUT"
echo "variant round W1@64 W2 W1@64-shared W2-shared" | tee "$OUT/summary.txt"
for round in $(seq "$RUNS"); do
  for v in "${VARIANTS[@]}"; do
    IFS='|' read -r name tick jvm logging <<<"$v"
    dir="$OUT/$name-$round"
    start_zk "$dir" "$tick" "$jvm" "$logging"
    port=$(cat "$dir/port")
    "$BENCH" --engines zookeeper --url "zookeeper=zk://127.0.0.1:$port" --workloads W1,W2 --clients 64 \
      --client-mode both --runs 1 --seconds "$SECS" --ttl-ms "$TTL_MS" --out "$dir/results" \
      >/dev/null 2>"$dir/bench.log" || true
    kill "$(cat "$dir/pid")" 2>/dev/null || true
    wait "$(cat "$dir/pid")" 2>/dev/null || true
    rates=()
    for cell in W1:zookeeper W2:zookeeper W1:zookeeper/shared W2:zookeeper/shared; do
      rates+=("$(jq -r --arg w "${cell%%:*}" --arg e "${cell#*:}" \
        '.cells[] | select(.workload==$w and .engine==$e) | .median.cycles_per_sec | floor' \
        "$dir/results/results.json" 2>/dev/null || echo failed)")
    done
    echo "$name $round ${rates[*]}" | tee -a "$OUT/summary.txt"
    rm -rf "$dir/data" "$dir/txlog"
  done
done

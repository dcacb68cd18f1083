#!/usr/bin/env bash
# Install the real servers that the tests start (fences, backends, benchmarks):
# PostgreSQL (initdb + postgres), Redis (redis-server), etcd (etcd-server) and
# ZooKeeper (zookeeper, which brings a Java runtime), from Debian's packages;
# strace, with which the benchmark counts the native server's fsyncs; and
# libfaketime, which skews clocks of the chaos suite's processes (K3); curl
# and jq, with which the HTTP guide (docs/http-api.md) is run as written, and
# python3 and nodejs, which run its examples; python3-venv, in which the
# Python package is installed and tested; chromium and chromium-driver, in
# which the dashboard's test drives the web page (fencelock-testkit's browser);
# tmux, under which `fencelock top`'s test runs it; promtool (Debian's
# prometheus, its service stopped), which checks the alerting rules and the
# nodes' /metrics; man (man-db), which renders the pages of `fencelock man`
# in their test; systemd, whose systemd-analyze verifies the Debian package's
# unit in its test (nothing is started; the package itself is built with
# dpkg-deb, part of every Debian system); podman with runc, its CNI plugins
# and iptables, which build and run packaging/Containerfile's image in its
# test.
#
# Idempotent: installs only what is missing and says what it did. Safe to run
# from .ci/run on every build. Needs root (or sudo) only when something is
# missing.
set -euo pipefail

have_postgres() {
    compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null &&
        compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}
have_redis() { command -v redis-server >/dev/null 2>&1; }
have_etcd() { command -v etcd >/dev/null 2>&1; }
have_zookeeper() { [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; }
have_strace() { command -v strace >/dev/null 2>&1; }
have_faketime() { compgen -G '/usr/lib/*/faketime/libfaketimeMT.so.1' >/dev/null; }
have_command() { command -v "$1" >/dev/null 2>&1; }

missing=()
if have_postgres; then
    echo "install-test-deps: postgresql present: $(ls -d /usr/lib/postgresql/*/bin/postgres | head -n1)"
else
    missing+=(postgresql)
fi
if have_redis; then
    echo "install-test-deps: redis-server present: $(command -v redis-server)"
else
    missing+=(redis-server)
fi

if have_etcd; then
    echo "install-test-deps: etcd present: $(command -v etcd)"
else
    missing+=(etcd-server)
fi
if have_zookeeper; then
    echo "install-test-deps: zookeeper present: /usr/share/java/zookeeper.jar"
else
    missing+=(zookeeper)
fi
if have_strace; then
    echo "install-test-deps: strace present: $(command -v strace)"
else
    missing+=(strace)
fi
if have_faketime; then
    echo "install-test-deps: libfaketime present: $(ls /usr/lib/*/faketime/libfaketimeMT.so.1 | head -n1)"
else
    missing+=(libfaketime)
fi

for tool in curl jq python3 node chromium chromedriver tmux promtool man systemd-analyze podman runc iptables; do
    if have_command "$tool"; then
        echo "install-test-deps: $tool present: $(command -v "$tool")"
    elif [ "$tool" = node ]; then
        missing+=(nodejs)
    elif [ "$tool" = chromedriver ]; then
        missing+=(chromium-driver)
    elif [ "$tool" = promtool ]; then
        missing+=(prometheus)
    elif [ "$tool" = man ]; then
        missing+=(man-db)
    elif [ "$tool" = systemd-analyze ]; then
        missing+=(systemd)
    else
        missing+=("$tool")
    fi
done

# The container test's published ports go through podman's bridge network.
if [ -x /usr/lib/cni/bridge ]; then
    echo "install-test-deps: CNI plugins present: /usr/lib/cni"
else
    missing+=(containernetworking-plugins)
fi

# The Python package's tests run in a virtual environment (python3 -m venv).
if python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
    echo "install-test-deps: python3 venv present"
else
    missing+=(python3-venv)
fi

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-test-deps: nothing to install"
    exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else
        echo "install-test-deps: need root to install: ${missing[*]}" >&2
        exit 1
    fi
fi

echo "install-test-deps: installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

# Debian starts the services on install; the tests run their own instances
# on free ports, so the system ones are not needed. Stop the ones this
# script just installed, quietly (a service that was already there is left).
for pkg in "${missing[@]}"; do
    case "$pkg" in etcd-server) svc=etcd ;; strace | chromium | chromium-driver | tmux | man-db | systemd) continue ;; *) svc=$pkg ;; esac
    if command -v service >/dev/null 2>&1; then
        "${SUDO[@]}" service "$svc" stop >/dev/null 2>&1 || true
    fi
done

have_postgres || { echo "install-test-deps: postgres still missing" >&2; exit 1; }
have_redis || { echo "install-test-deps: redis-server still missing" >&2; exit 1; }
have_etcd || { echo "install-test-deps: etcd still missing" >&2; exit 1; }
have_zookeeper || { echo "install-test-deps: zookeeper still missing" >&2; exit 1; }
have_strace || { echo "install-test-deps: strace still missing" >&2; exit 1; }
have_command chromium || { echo "install-test-deps: chromium still missing" >&2; exit 1; }
have_command chromedriver || { echo "install-test-deps: chromedriver still missing" >&2; exit 1; }
have_command tmux || { echo "install-test-deps: tmux still missing" >&2; exit 1; }
have_command promtool || { echo "install-test-deps: promtool (prometheus) still missing" >&2; exit 1; }
have_command man || { echo "install-test-deps: man (man-db) still missing" >&2; exit 1; }
have_command systemd-analyze || { echo "install-test-deps: systemd-analyze (systemd) still missing" >&2; exit 1; }
echo "install-test-deps: installed: ${missing[*]}"

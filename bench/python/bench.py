"""Python lock libraries against the fencelock Python package, on one machine, in one run.

Each engine is used through the recipe its users run:

- fencelock  ``fencelock.connect(url).lock(name, ttl=, wait=)`` on a fencelock node
             (``target/release/fencelock serve``, a Raft group of one, fsynced log);
- redis-py   ``redis.Redis(...).lock(name, timeout=, blocking_timeout=)`` on Debian's
             redis-server, run plain as its users run it (no AOF, default RDB snapshots);
- kazoo      ``kazoo.recipe.lock.Lock`` (``client.Lock(path)``) on Debian's ZooKeeper,
             standalone, tickTime=2000, forceSync=yes (the defaults);
- etcd3      python-etcd3's ``etcd3.client().lock(name, ttl=)`` on Debian's etcd
             (single member, etcd's default timers), if the library imports.

Workloads (one OS process per client, like real workers; spawned, not forked):

- W1: 16 processes, each on its own lock, loop acquire -> release: cycles/s (sum) and
  acquire latency p50/p99.
- W2: 16 processes on ONE lock, hold 0, loop blocking acquire -> release: cycles/s,
  handoff latency (a release's start -> the next holder's acquire return, both from
  CLOCK_MONOTONIC, which all processes share), fairness (max/min grants per process,
  starved processes) and FIFO violations (a grant that went straight back to the
  releaser while another process was already waiting in acquire).

Each cell runs after a warm-up (1 s) for a measured time; every run rotates the engine
order; the report gives the median run by throughput and the low-high range.
Servers listen on 127.0.0.1 on free ports with temp data dirs and are stopped at exit.

Run (it re-executes itself in the venv, creating it with --setup):

    python3 bench/python/bench.py --setup          # venv at target/bench-python-venv
    python3 bench/python/bench.py --seconds 5 --runs 3
    python3 bench/python/bench.py --quick          # 1 s, 1 run: does it work?
"""

import argparse, atexit, datetime, json, os, platform, resource, shutil, signal, socket, subprocess, sys
import tempfile, threading, time, urllib.request
from bisect import bisect_right

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.join(ROOT, "target", "bench-python-venv")
FENCELOCK_BIN = os.path.join(ROOT, "target", "release", "fencelock")
ZK_JAR = "/usr/share/java/zookeeper.jar"
# python-etcd3 0.12 (2020) needs protobuf<4 for its stubs and tenacity<7 for its blocking acquire.
PEER_PACKAGES = ["redis", "kazoo", "etcd3", "protobuf<4", "tenacity<7"]
TTL, WAIT = 10, 60  # lease/timeout seconds; blocking waits are generous
ENGINES = ["fencelock", "redis-py", "kazoo", "etcd3"]

# ---------------------------------------------------------------- engines (client side)
# connect(url) -> conn; acquire(conn, name) -> a held lock; release(conn, held): the recipe.


def release(conn, held):  # every library's held lock (fencelock's Guard too) has .release()
    held.release()


def fencelock_connect(url):
    import fencelock
    return fencelock.connect(url)


def fencelock_acquire(client, name):
    return client.lock(name, ttl=TTL, wait=WAIT)


def redis_connect(url):
    import redis
    host, port = url.rsplit(":", 1)
    return redis.Redis(host=host, port=int(port))


def redis_acquire(r, name):
    lock = r.lock(name, timeout=TTL, blocking_timeout=WAIT)  # polls every 0.1 s (its default)
    if not lock.acquire():
        raise TimeoutError(name)
    return lock


def kazoo_connect(url):
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=url, timeout=10.0)
    zk.start(timeout=30)
    return zk


def kazoo_acquire(zk, name):
    lock = zk.Lock("/" + name, str(os.getpid()))  # kazoo.recipe.lock.Lock
    if not lock.acquire(timeout=WAIT):
        raise TimeoutError(name)
    return lock


def etcd3_connect(url):
    import etcd3
    host, port = url.rsplit(":", 1)
    return etcd3.client(host=host, port=int(port))


def etcd3_acquire(client, name):
    lock = client.lock(name, ttl=TTL)
    if not lock.acquire(timeout=WAIT):
        raise TimeoutError(name)
    return lock


CLIENT = {"fencelock": (fencelock_connect, fencelock_acquire), "redis-py": (redis_connect, redis_acquire),
          "kazoo": (kazoo_connect, kazoo_acquire), "etcd3": (etcd3_connect, etcd3_acquire)}

GUARANTEES = {
    "fencelock": "fencing token on every grant (global, monotonic); FIFO queue on the server, "
                 "the next waiter is pushed its grant; durable (Raft log fsynced before a grant "
                 "is acknowledged); lease renewed by the client's own threads",
    "redis-py": "no fencing token (a random value only guards release); no queue: a waiter "
                "polls SET NX every 0.1 s (redis-py's default sleep), so no FIFO; not durable "
                "(no AOF: a restart or fail-over forgets held locks)",
    "kazoo": "no fencing token exposed (the znode's sequence number is not handed out as one); "
             "FIFO (ephemeral sequential znodes, each waiter watches its predecessor); durable "
             "(ZooKeeper fsyncs its transaction log, forceSync=yes)",
    "etcd3": "no fencing token exposed by python-etcd3's Lock (the key's revision is not "
             "returned); not FIFO: every waiter watches the one key and races to create it "
             "on delete; durable (etcd fsyncs its WAL); a new lease per attempt. Its watch starts "
             "after the failed create, not from its revision: a release in between is missed and "
             "the waiter sleeps until the key's next change or its timeout",
}

# ---------------------------------------------------------------- servers


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, proc, check, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not become ready in {timeout} s")


def http_ok(url, needle=b""):
    with urllib.request.urlopen(url, timeout=1) as r:
        return r.status == 200 and needle in r.read()


def four_letter(port, word):
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.settimeout(1)
        s.sendall(word)
        return b"".join(iter(lambda: s.recv(4096), b"")).decode()


class Server:
    def __init__(self, name, argv, cwd, ready, url, settings, version):
        self.name, self.url, self.settings, self.version, self.dir = name, url, settings, version, cwd
        self.log = open(os.path.join(cwd, "server.log"), "ab")
        self.proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.argv = argv
        wait_until(name, self.proc, ready)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def proc_cpu(pid):  # CPU seconds (user + system) of a live process
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy():  # CPU seconds all cores spent busy since boot (not idle, not iowait)
    f = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu(servers):  # this bench's CPU seconds: itself, its reaped workers, its servers
    ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(r.ru_utime + r.ru_stime for r in ru) + sum(proc_cpu(s.proc.pid) for s in servers)


def out(argv):
    return subprocess.run(argv, capture_output=True, text=True).stdout.strip()


def start_fencelock(d):
    p, h = free_port(), free_port()
    argv = [FENCELOCK_BIN, "serve", "--data-dir", os.path.join(d, "data"),
            "--listen", f"127.0.0.1:{p}", "--http", f"127.0.0.1:{h}", "--log-level", "warn"]
    version = ", ".join(out([FENCELOCK_BIN, "--version"]).splitlines()[:2])  # with its commit
    return Server("fencelock", argv, d, lambda: http_ok(f"http://127.0.0.1:{h}/healthz"),
                  f"fencelock://127.0.0.1:{p}", "a group of one; Raft log fsynced per batch "
                  "(segment log); defaults otherwise; log level warn", version)


def start_redis(d):
    p = free_port()
    argv = ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--dir", d,
            "--appendonly", "no", "--daemonize", "no"]
    return Server("redis-server", argv, d, lambda: "PONG" in four_letter(p, b"PING\r\nQUIT\r\n"),
                  f"127.0.0.1:{p}", "plain: no AOF (appendonly no), default RDB snapshot rules, "
                  "no replica", out(["redis-server", "--version"]))


def start_zookeeper(d):
    p = free_port()
    os.makedirs(os.path.join(d, "data"))
    cfg = os.path.join(d, "zoo.cfg")
    lines = [f"dataDir={d}/data", f"dataLogDir={d}/txlog", f"clientPort={p}",
             "clientPortAddress=127.0.0.1", "admin.enableServer=false",
             "4lw.commands.whitelist=srvr,ruok", "tickTime=2000", "maxClientCnxns=0",
             "forceSync=yes"]
    with open(cfg, "w") as f:
        f.write("\n".join(lines) + "\n")
    argv = ["java", "-Xmx1g", "-XX:+UseG1GC", "-cp", f"/etc/zookeeper/conf:{ZK_JAR}",
            f"-Dzookeeper.log.dir={d}", "org.apache.zookeeper.server.ZooKeeperServerMain", cfg]
    version = "ZooKeeper " + out(["dpkg-query", "-W", "-f", "${Version}", "zookeeper"]) + " (Debian)"
    return Server("zookeeper", argv, d, lambda: "Mode:" in four_letter(p, b"srvr"), f"127.0.0.1:{p}",
                  "standalone; " + ", ".join(lines[6:]) + "; java -Xmx1g -XX:+UseG1GC; "
                  "transaction log in its own dir", version)


def start_etcd(d):
    c, p = free_port(), free_port()
    client, peer = f"http://127.0.0.1:{c}", f"http://127.0.0.1:{p}"
    argv = ["etcd", "--name", "b", "--data-dir", os.path.join(d, "data"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"b={peer}", "--initial-cluster-state", "new",
            "--heartbeat-interval", "100", "--election-timeout", "1000", "--logger", "zap"]
    return Server("etcd", argv, d, lambda: http_ok(client + "/health", b'"true"'),
                  f"127.0.0.1:{c}", "single member; heartbeat 100 ms, election 1000 ms (the "
                  "defaults); WAL fsynced per commit", out(["etcd", "--version"]).splitlines()[0])


STARTERS = {"fencelock": start_fencelock, "redis-py": start_redis,
            "kazoo": start_zookeeper, "etcd3": start_etcd}

# ---------------------------------------------------------------- workers


def worker(engine, url, workload, idx, lock_name, t0, warm_ns, measure_ns, ready, go, results):
    """One client process: connect, wait for the start, loop until the end, send records."""
    connect, acquire = CLIENT[engine]
    try:
        conn = connect(url)
        release(conn, acquire(conn, f"{lock_name}/warm/{idx}"))  # first round trip off the clock
    except BaseException as e:
        ready.put((idx, repr(e)))
        return
    ready.put((idx, None))
    go.wait()
    start = t0.value
    w_start, end = start + warm_ns, start + warm_ns + measure_ns
    name = lock_name if workload == "W2" else f"{lock_name}/{idx}"
    lat, cycles, grants = [], 0, []  # W2 grants: (call start, acquired, release start)
    now = time.monotonic_ns
    try:
        while True:
            t1 = now()
            if t1 >= end:
                break
            handle = acquire(conn, name)
            t2 = now()
            release(conn, handle)
            t3 = now()
            if workload == "W1":
                if t1 >= w_start and t3 <= end:
                    lat.append(t2 - t1)
                if w_start <= t3 < end:
                    cycles += 1
            else:
                grants.append((t1, t2, t2))  # hold 0: the release starts as acquire returns
        results.put((idx, None, lat, cycles, grants))
    except BaseException as e:
        results.put((idx, repr(e), lat, cycles, grants))
    finally:
        threading.excepthook = lambda _: None  # etcd3's watch thread complains of the closed channel
        try:
            conn.close() if engine != "kazoo" else (conn.stop(), conn.close())
        except Exception:
            pass


def run_cell(ctx, engine, server, workload, procs, warm, seconds, tag):
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    t0 = ctx.Value("q", 0)
    lock_name = f"bench/{tag}/{engine}/{workload}".replace("-", "")
    ps = [ctx.Process(target=worker, args=(engine, server.url, workload, i, lock_name, t0,
                                           int(warm * 1e9), int(seconds * 1e9), ready, go, results))
          for i in range(procs)]
    try:
        for p in ps:
            p.start()
        errors = [e for _, e in (ready.get(timeout=120) for _ in ps) if e]
        t0.value = time.monotonic_ns() + 20_000_000
        go.set()
        cpu = []  # the server's and the machine's CPU seconds at the window's start and end
        for at in (warm, warm + seconds):
            time.sleep(max(0.0, (t0.value + int(at * 1e9) - time.monotonic_ns()) / 1e9))
            cpu.append((proc_cpu(server.proc.pid), machine_busy()))
        got = [results.get(timeout=warm + seconds + WAIT + 60) for _ in ps] if not errors else []
    finally:
        go.set()
        for p in ps:
            p.join(30 if p.is_alive() else 0)
            if p.is_alive():
                p.kill()
                p.join()
    errors += [r[1] for r in got if r[1]]
    if errors:
        raise RuntimeError(f"{engine} {workload}: {errors[0]}")
    w_start = t0.value + int(warm * 1e9)
    end = w_start + int(seconds * 1e9)
    load = {"server_cores": (cpu[1][0] - cpu[0][0]) / seconds, "busy_cores": (cpu[1][1] - cpu[0][1]) / seconds}
    if workload == "W1":
        lat = sorted(x for r in got for x in r[2])
        return {"cycles_per_s": sum(r[3] for r in got) / seconds, "acquire_p50_ms": pct(lat, 50),
                "acquire_p99_ms": pct(lat, 99), "samples": len(lat), **load}
    return {**w2_stats({r[0]: r[4] for r in got}, w_start, end, seconds), **load}


def pct(sorted_ns, p):  # ms
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * p / 100))] / 1e6 if sorted_ns else None


def w2_stats(per_proc, w_start, end, seconds):
    """Handoffs, fairness and FIFO violations from every process's grants on the one lock."""
    calls = {i: ([g[0] for g in gs], [g[1] for g in gs]) for i, gs in per_proc.items()}

    def waiting(j, t):  # was process j inside an acquire call at time t?
        starts, returns = calls[j]
        k = bisect_right(starts, t) - 1
        return k >= 0 and returns[k] > t

    seq = sorted((g[1], i, g[2]) for i, gs in per_proc.items() for g in gs)
    handoffs, other, violations, eligible = [], [], 0, 0
    for (_, i, rel), (acq, j, _) in zip(seq, seq[1:]):
        if not w_start <= acq < end:
            continue
        handoffs.append(acq - rel)
        if j != i:
            other.append(acq - rel)
        if any(waiting(k, rel) for k in per_proc if k != i):
            eligible += 1
            violations += j == i
    counts = [sum(1 for g in gs if w_start <= g[1] < end) for gs in per_proc.values()]
    waits = sorted(g[1] - g[0] for gs in per_proc.values() for g in gs if w_start <= g[1] < end)
    handoffs.sort()
    other.sort()
    return {"cycles_per_s": sum(counts) / seconds, "handoff_p50_ms": pct(handoffs, 50),
            "handoff_p99_ms": pct(handoffs, 99), "handoff_other_p50_ms": pct(other, 50),
            "handoff_other_p99_ms": pct(other, 99), "handoffs_to_other": len(other),
            "wait_p50_ms": pct(waits, 50), "wait_p99_ms": pct(waits, 99), "wait_max_ms": pct(waits, 100),
            "grants_max": max(counts),
            "grants_min": min(counts), "starved": sum(1 for c in counts if c == 0),
            "fifo_violations": violations, "handoffs_with_waiter": eligible}

# ---------------------------------------------------------------- report


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next(l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal"))
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gib": round(int(mem) / 2**20, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "temp_dir_fs": out(["findmnt", "-n", "-o", "FSTYPE", "-T", tempfile.gettempdir()])}


def lib_versions():
    from importlib.metadata import version, PackageNotFoundError
    v = {}
    for pkg in ["fencelock", "redis", "kazoo", "etcd3", "protobuf", "grpcio", "tenacity"]:
        try:
            v[pkg] = version(pkg)
        except PackageNotFoundError:
            v[pkg] = None
    return v


def fmt(x, nd=2):
    return "–" if x is None else (f"{x:,.0f}" if nd == 0 else f"{x:.{nd}f}")


def summarize(raw):
    """Per engine and workload: the median run by throughput, and the low-high range."""
    out_ = {}
    for key, runs in raw.items():
        ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["cycles_per_s"])
        if not ok:
            out_[key] = {"error": runs[0]["error"]}
            continue
        med = dict(ok[(len(ok) - 1) // 2])
        med["low"], med["high"] = ok[0]["cycles_per_s"], ok[-1]["cycles_per_s"]
        med["runs_ok"] = len(ok)
        out_[key] = med
    return out_


def report(meta, summary, engines):
    m = meta["machine"]
    L = [f"# Python lock libraries vs the fencelock Python package ({meta['date']})", "",
         f"Machine: {m['cores']} cores, {m['cpu']}, {m['memory_gib']} GiB, Linux {m['kernel']}, "
         f"CPython {m['python']}; temp data dirs on {m['temp_dir_fs']}. Clients and servers share "
         f"the machine: {meta['procs']} client processes plus a server on {m['cores']} cores, so client CPU (the Python "
         "library's own cost) is part of every figure.", "",
         f"Command: `{meta['command']}` ({meta['wall_seconds']} s; CPU of other processes on the "
         f"machine meanwhile: {meta['foreign_cpu_s']} s, {meta['foreign_cores']} cores on average)  ", f"Runs per cell: {meta['runs']}, {meta['warmup']} s "
         f"warm-up + {meta['seconds']} s measured, {meta['procs']} processes, engine order "
         "rotated every run; the median run by throughput, and the low–high range of cycles/s.", "",
         "## Libraries and servers", "", "| engine | library | server | settings |", "|---|---|---|---|"]
    libv = meta["libraries"]
    lib_of = {"fencelock": "fencelock " + str(libv.get("fencelock")), "redis-py": "redis " + str(libv.get("redis")),
              "kazoo": "kazoo " + str(libv.get("kazoo")),
              "etcd3": f"etcd3 {libv.get('etcd3')} (protobuf {libv.get('protobuf')}, grpcio {libv.get('grpcio')})"}
    for e in engines:
        s = meta["servers"].get(e, {})
        L.append(f"| {e} | {lib_of[e]} | {s.get('version', '–')} | {s.get('settings', s.get('error', '–'))} |")
    if meta.get("notes"):
        L += [""] + [f"- {n}" for n in meta["notes"]]
    L += ["", f"## W1: {meta['procs']} processes, each on its own lock, acquire → release", "",
          "| engine | cycles/s | range | acquire p50 ms | acquire p99 ms | server CPU (cores) | "
          "machine busy (cores) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for e in engines:
        r = summary.get(f"{e}/W1", {"error": "not run"})
        if "error" in r:
            L.append(f"| {e} | error: {r['error'][:80]} | | | | | |")
        else:
            L.append(f"| {e} | {fmt(r['cycles_per_s'], 0)} | {fmt(r['low'], 0)}–{fmt(r['high'], 0)} | "
                     f"{fmt(r['acquire_p50_ms'])} | {fmt(r['acquire_p99_ms'])} | {fmt(r['server_cores'])} | "
                     f"{fmt(r['busy_cores'])} |")
    L += ["", f"## W2: {meta['procs']} processes on one lock, hold 0, blocking acquire → release", "",
          "| engine | cycles/s | range | handoff p50 / p99 ms | to another process p50 / p99 ms | "
          "acquire wait p50 / p99 / max ms | grants max/min | starved | FIFO violations | server CPU "
          "(cores) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in engines:
        r = summary.get(f"{e}/W2", {"error": "not run"})
        if "error" in r:
            L.append(f"| {e} | error: {r['error'][:80]} | | | | | | | | |")
        else:
            L.append(f"| {e} | {fmt(r['cycles_per_s'], 0)} | {fmt(r['low'], 0)}–{fmt(r['high'], 0)} | "
                     f"{fmt(r['handoff_p50_ms'])} / {fmt(r['handoff_p99_ms'])} | "
                     f"{fmt(r['handoff_other_p50_ms'])} / {fmt(r['handoff_other_p99_ms'])} | "
                     f"{fmt(r['wait_p50_ms'])} / {fmt(r['wait_p99_ms'])} / {fmt(r['wait_max_ms'], 0)} | "
                     f"{r['grants_max']}/{r['grants_min']} | {r['starved']} | {r['fifo_violations']} of "
                     f"{r['handoffs_with_waiter']} | {fmt(r['server_cores'])} |")
    L += ["", "Server CPU and machine busy: CPU seconds per second of the measured window (2 = both "
          "cores busy), the server process alone and the whole machine.", "",
          "Handoff: a release's start → the next grant's acquire return (any process; then only "
          "grants to another process than the releaser). Acquire wait: an acquire call's start → "
          "its return. FIFO violations: handoffs where the lock went straight back to the process that "
          "released it while another process was already inside its acquire call (of all handoffs "
          "that had such a waiter).", "", "## Ratios (fencelock ÷ peer, cycles/s of the median runs)", ""]
    for e in [e for e in engines if e != "fencelock"]:
        parts = []
        for w in ("W1", "W2"):
            a, b = summary.get(f"fencelock/{w}", {}), summary.get(f"{e}/{w}", {})
            if a.get("cycles_per_s") and b.get("cycles_per_s"):
                parts.append(f"{w} {a['cycles_per_s'] / b['cycles_per_s']:.2f}×")
            else:
                parts.append(f"{w} –")
        L.append(f"- fencelock ÷ {e}: " + ", ".join(parts))
    L += ["", "## What each engine guarantees", ""] + [f"- **{e}**: {GUARANTEES[e]}" for e in engines]
    return "\n".join(L) + "\n"

# ---------------------------------------------------------------- main


def setup():
    if not os.path.exists(os.path.join(VENV, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    pip = [os.path.join(VENV, "bin", "pip"), "install"]
    subprocess.run(pip + PEER_PACKAGES, check=True)
    env = dict(os.environ, MATURIN_PEP517_ARGS=os.environ.get("MATURIN_PEP517_ARGS", "--profile release"))
    subprocess.run(pip + [os.path.join(ROOT, "python")], check=True, env=env)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per cell")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--quick", action="store_true", help="1 s, 1 run: check that it works")
    ap.add_argument("--setup", action="store_true", help="create the venv and install into it")
    ap.add_argument("--out", default=None, help="results dir (default bench/results/DATE-python)")
    args = ap.parse_args()
    if args.setup:
        return setup()
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        py = os.path.join(VENV, "bin", "python")
        if not os.path.exists(py):
            sys.exit(f"no venv at {VENV}: run with --setup first")
        os.execv(py, [py] + sys.argv)
    if args.quick:
        args.seconds, args.runs = 1.0, 1
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    engines = [e for e in args.engines.split(",") if e]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    meta = {"date": date, "machine": machine(), "libraries": lib_versions(), "servers": {}, "notes": [],
            "command": "python3 bench/python/bench.py " + " ".join(sys.argv[1:]), "runs": args.runs,
            "seconds": args.seconds, "warmup": args.warmup, "procs": args.procs, "quick": args.quick}
    meta["notes"].append("fencelock's extension is the one `--setup` builds: `pip install ./python` with "
                         "MATURIN_PEP517_ARGS='--profile release' (unless that variable was set otherwise)")
    if args.quick:
        meta["notes"].append("QUICK MODE (1 s, 1 run): a check that it works, not a measurement")
    servers = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    atexit.register(lambda: [s.stop() for s in servers.values()])
    try:
        import etcd3  # noqa: F401
    except Exception as e:
        if "etcd3" in engines:
            engines.remove("etcd3")
            meta["notes"].append(f"python-etcd3 does not import here ({e!r:.200}): etcd3 left out")
    if "etcd3" in engines:
        v = meta["libraries"]
        meta["notes"].append(
            "python-etcd3 0.12.0 (its last release, 2020): `pip install etcd3` installs, but with today's "
            "dependencies it does not work: with protobuf 4+ `import etcd3` fails (its generated stubs are "
            "refused), and with tenacity 7+ a contended `acquire()` raises TypeError (its wait callback has "
            f"the old signature). Pinned here: protobuf<4 ({v['protobuf']}: pure-Python protobuf, slower on "
            f"the client's CPU) and tenacity<7 ({v['tenacity']}); with both it works")
    for e in engines:
        try:
            servers[e] = STARTERS[e](tempfile.mkdtemp(prefix=f"bench-py-{e}-"))
            s = servers[e]
            meta["servers"][e] = {"version": s.version, "settings": s.settings, "argv": s.argv}
        except Exception as ex:
            meta["servers"][e] = {"error": repr(ex)}
    engines = [e for e in engines if e in servers]
    raw = {f"{e}/{w}": [] for e in engines for w in ("W1", "W2")}
    started, busy0, own0 = time.time(), machine_busy(), own_cpu(servers.values())
    for run in range(args.runs):
        order = engines[run % len(engines):] + engines[:run % len(engines)]
        for w in ("W1", "W2"):
            for e in order:
                try:
                    r = run_cell(ctx, e, servers[e], w, args.procs, args.warmup, args.seconds, f"r{run}")
                except Exception as ex:
                    r = {"error": str(ex)}
                r["run"] = run
                raw[f"{e}/{w}"].append(r)
                print(f"run {run} {w} {e}: " + (r.get("error") or f"{r['cycles_per_s']:.0f} cycles/s"),
                      file=sys.stderr, flush=True)
    meta["wall_seconds"] = round(time.time() - started, 1)
    foreign = (machine_busy() - busy0) - (own_cpu(servers.values()) - own0)
    meta["foreign_cpu_s"], meta["foreign_cores"] = round(foreign, 1), round(foreign / meta["wall_seconds"], 3)
    summary = summarize(raw)
    text = report(meta, summary, engines)
    print(text)
    outdir = args.out or os.path.join(ROOT, "bench", "results", f"{date}-python")
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump({"meta": meta, "summary": summary, "runs": raw, "guarantees": GUARANTEES}, f, indent=1)


if __name__ == "__main__":
    main()

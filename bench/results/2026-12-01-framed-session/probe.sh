#!/bin/bash
# probe.sh BIN ENGINE CLIENTS WORKLOAD [framed]: one 5 s run; prints the cell
BIN=$1; ENG=$2; C=$3; W=$4; FR=$5
OUT=$(mktemp -d)
$BIN --engines $ENG --workloads $W --clients $C --client-mode per-process --runs 1 --seconds 5 --out $OUT > $OUT/log 2>&1
python3 - "$OUT" "${FR:-grpc}" <<'PY'
import json,sys
d=sys.argv[1]
try: r=json.load(open(d+'/results.json'))
except Exception as e:
    print('no results', e, open(d+'/log').read()[-1500:]); sys.exit()
for c in r['cells']:
    m=c['median']
    h=m.get('handoff_ms') or {}
    a=m.get('acquire_ms') or {}
    print(f"{sys.argv[2]:6} {c['workload']} {c['engine']} c={c['clients']} cyc/s={m['cycles_per_sec']:.0f} srv={m['cpu_us_per_cycle'] or 0:.1f} cli={m['client_cpu_us_per_cycle'] or 0:.1f} acq50={a.get('p50',0):.3f} ho50={h.get('p50',0):.3f} ho99={h.get('p99',0):.3f} err={m['errors']}")
PY
rm -rf $OUT

#!/usr/bin/env bash
# ncu of the two K-cache T = 64 rows (N = 8192 and N = 1024, K = 8192): the details page, the
# top SASS lines by warp-stall samples, and the whole SASS listing with each line's samples and
# its three largest stall reasons (where the consumers wait: session 9 found the decode
# consumers' scale-register copies waiting on their loads this way).
#   ../shared/gpu/bundle-bin -I . -I tests/mojo benchmarks/mojo/k_cache_one.mojo
#   run carry=[".gpu-bin", "scripts"]: bash scripts/ncu-kcache-t64.sh
# (the CPU machine has no ncu: everything is printed on the device into $OUT)
cd .gpu-bin && export LD_LIBRARY_PATH=$PWD/lib
NCU=/usr/local/cuda/bin/ncu
for N in 8192 1024; do
  timeout 100 $NCU --clock-control none --set full --import-source yes -k regex:k_cache_matmul --launch-skip 3 --launch-count 1 -o $OUT/n$N ./k_cache_one $N > $OUT/ncu_n$N.log 2>&1
  $NCU --import $OUT/n$N.ncu-rep --page details > $OUT/det_n$N.txt 2>&1
  $NCU --import $OUT/n$N.ncu-rep --page source --csv --print-source sass > /tmp/src_n$N.csv 2>/dev/null
  python3 - /tmp/src_n$N.csv $OUT/top_n$N.txt $OUT/sass_n$N.txt <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hi = next(i for i, r in enumerate(rows) if any('Warp Stall Sampling (All Samples)' in c for c in r))
h = [c.strip() for c in rows[hi]]
ci = h.index('Warp Stall Sampling (All Samples)')
si = h.index('Source')
stalls = [i for i, c in enumerate(h) if c.startswith('stall_') and '(Not Issued)' not in c]
num = lambda x: float(x) if x.replace('.', '', 1).isdigit() else 0.0
data = [r for r in rows[hi + 1:] if len(r) > max(ci, si)]
tot = sum(num(r[ci]) for r in data) or 1.0
with open(sys.argv[2], 'w') as top:
    print('total samples', tot, file=top)
    for r in sorted(data, key=lambda r: -num(r[ci]))[:60]:
        print(round(100 * num(r[ci]) / tot, 2), r[0], r[si][:100], file=top)
with open(sys.argv[3], 'w') as sass:
    for r in data:
        worst = sorted(((num(r[i]), h[i][6:]) for i in stalls), reverse=True)[:3]
        print(f"{num(r[ci]):6.0f} {r[si][:70]:70s} " + " ".join(f"{n}={int(x)}" for x, n in worst if x > 0), file=sass)
PY
done
grep -E "Duration|SM Active|Elapsed Cycles|DRAM Throughput|L2 Cache Throughput|Issue Slots|Eligible Warps|Warp Cycles Per Issued|Registers Per|Grid Size" $OUT/det_n*.txt
head -3 $OUT/top_n*.txt

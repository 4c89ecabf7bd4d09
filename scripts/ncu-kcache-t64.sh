#!/usr/bin/env bash
# ncu of the two K-cache T = 64 rows that miss their bars (N = 8192 and N = 1024, K = 8192): details
# and the top SASS lines by warp-stall samples. Prepared in session 8, not yet run (no device time left).
#   ../shared/gpu/bundle-bin -I . -I tests/mojo benchmarks/mojo/k_cache_one.mojo
#   run carry=[".gpu-bin", "scripts"]: bash scripts/ncu-kcache-t64.sh
# (the CPU machine has no ncu: everything is printed on the device into $OUT)
cd .gpu-bin && export LD_LIBRARY_PATH=$PWD/lib
NCU=/usr/local/cuda/bin/ncu
for N in 8192 1024; do
  timeout 100 $NCU --clock-control none --set full --import-source yes -k regex:k_cache_matmul --launch-skip 3 --launch-count 1 -o $OUT/n$N ./k_cache_one $N > $OUT/ncu_n$N.log 2>&1
  $NCU --import $OUT/n$N.ncu-rep --page details > $OUT/det_n$N.txt 2>&1
  $NCU --import $OUT/n$N.ncu-rep --page source --csv --print-source sass > /tmp/src_n$N.csv 2>/dev/null
  python3 - /tmp/src_n$N.csv > $OUT/top_n$N.txt <<'PY'
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
hi=next(i for i,r in enumerate(rows) if any('Warp Stall Sampling (All Samples)' in c for c in r))
h=rows[hi]
ci=next(i for i,c in enumerate(h) if c.strip()=='Warp Stall Sampling (All Samples)')
si=next(i for i,c in enumerate(h) if c.strip()=='Source')
data=[r for r in rows[hi+1:] if len(r)>max(ci,si) and r[ci].replace('.','',1).isdigit()]
tot=sum(float(r[ci]) for r in data)
print('total samples',tot)
print('columns', [c for c in h if 'stall' in c.lower()][:40])
for r in sorted(data,key=lambda r:-float(r[ci]))[:60]:
    print(round(100*float(r[ci])/tot,2), r[0], r[si][:100])
PY
done
grep -E "Duration|SM Active|Elapsed Cycles|DRAM Throughput|L2 Cache Throughput|Issue Slots|Eligible Warps|Warp Cycles Per Issued|Registers Per|Grid Size" $OUT/det_n*.txt
head -3 $OUT/top_n*.txt

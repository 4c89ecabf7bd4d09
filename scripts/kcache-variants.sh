#!/usr/bin/env bash
# Builds the K-cache decode benchmark of several commits side by side (one bundle-bin call),
# plus the GPU harness of one commit (HARNESS=<commit>, default the last one: it checks that
# commit's kernels with its own cases), and writes .gpu-bin/script.sh, which runs the harness,
# then every variant twice in turn, printing one line per shape (device-event us).
#   scripts/kcache-variants.sh main s10-experiments~1 s10-experiments
#   run carry=[".gpu-bin"]: bash .gpu-bin/script.sh
# Variant trees go to /tmp/kcv_<short hash>; binaries to .gpu-bin/kcd_<short hash>.
set -euo pipefail
top=$(git rev-parse --show-toplevel)
cd "$top"
rm -rf .gpu-bin
names=()
for c in "$@"; do
  short=$(git rev-parse --short "$c")
  d=/tmp/kcv_$short
  rm -rf "$d" && mkdir -p "$d"
  git archive "$c" | tar -x -C "$d"
  cp "$d/benchmarks/mojo/k_cache_decode_bench.mojo" "$d/benchmarks/mojo/kcd_$short.mojo"
  ../shared/gpu/bundle-bin -I "$d" -I "$d/tests/mojo" "$d/benchmarks/mojo/kcd_$short.mojo"
  names+=("$short")
done
# HARNESS may name several commits (space separated): each harness binary is kept under its
# own name (kch_<short hash>) and run in turn.
hnames=()
for hc in ${HARNESS:-${!#}}; do
  hshort=$(git rev-parse --short "$hc")
  h=/tmp/kcv_$hshort
  if [ ! -d "$h" ]; then mkdir -p "$h" && git archive "$hshort" | tar -x -C "$h"; fi
  cp "$h/tests/mojo/k_cache_gpu_harness.mojo" "$h/tests/mojo/kch_$hshort.mojo"
  ../shared/gpu/bundle-bin -I "$h" -I "$h/tests/mojo" "$h/tests/mojo/kch_$hshort.mojo"
  hnames+=("$hshort")
done
cat > .gpu-bin/script.sh <<SH
#!/usr/bin/env bash
cd "\$(dirname "\$0")" && export LD_LIBRARY_PATH=\$PWD/lib
for hv in ${hnames[*]}; do
  timeout 240 ./kch_\$hv > \$OUT/harness_\$hv.log 2>&1
  echo "harness (\$hv) rc=\$? PASS=\$(grep -c PASS \$OUT/harness_\$hv.log) FAIL=\$(grep -c FAIL \$OUT/harness_\$hv.log)"
done
for round in 1 2; do
  for v in ${names[*]}; do
    echo "## \$v (\$round)"
    timeout 100 ./kcd_\$v > \$OUT/kcd_\${v}_\$round.log 2>&1 || echo "rc=\$?"
    python3 - \$OUT/kcd_\${v}_\$round.log <<'PY'
import re, sys
name = plan = None
for line in open(sys.argv[1]):
    if line.startswith('=='):
        name = line.split(':')[0][3:].strip()
    elif 'plan:' in line:
        plan = line.split('plan:')[1].strip()
    elif 'device events' in line:
        us = float(re.search(r'([\d.]+) us \(device events', line).group(1))
        print(f"{name:24s} {us:8.2f}  {plan}")
PY
  done
done
SH
echo "wrote .gpu-bin/script.sh for: ${names[*]}"

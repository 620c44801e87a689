#!/usr/bin/env bash
# Device run 135: the reduce-scatter's proxy at M = 256 (the four projections' per-rank shapes at
# K / P) on 8995433's build, its config against the tiles of before in the same process
# (--compare: 64 x 256 at P = 8 with block_n=256, 128 x 192 at P = 4 and 2 with block_n=192),
# interleaved, two passes, N x K (K x N at P = 8), checked.
set -u
B=${TMPDIR:-/tmp}/run135; rm -rf $B; mkdir -p $B; tar -C $B -xzf "${BINARIES:?a tarball of the build}"
O=$OUT/run135; mkdir -p $O
T=$B/build/bench/tpfuse_bench
shapes() {  # P
  local p=$1
  echo "256,8192,$((8192 / p));256,8192,$((28672 / p));256,6144,$((6144 / p));256,6144,$((16384 / p))"
}
run() {  # name -- arguments
  local name=$1; shift
  timeout 120 $T "$@" --check --json $O/$name.json > $O/$name.txt 2>&1
  echo "$name rc=$?: $(grep -h '^# proxy:' $O/$name.txt | cut -c1-160)"
}
for pass in 1 2; do
  run p8_nk_$pass --mode proxy --tp 8 --layout nk --shapes "$(shapes 8)" --compare block_n=256
  run p4_nk_$pass --mode proxy --tp 4 --layout nk --shapes "$(shapes 4)" --compare block_n=192
  run p2_nk_$pass --mode proxy --tp 2 --layout nk --shapes "$(shapes 2)" --compare block_n=192
done
run p8_kn_1 --mode proxy --tp 8 --layout kn --shapes "$(shapes 8)" --compare block_n=256
cd $OUT && tar -czf run135.tgz run135

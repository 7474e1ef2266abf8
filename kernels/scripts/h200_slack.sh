#!/usr/bin/env bash
# Side-stream delays with slack (issue: what-if): the small workload's kda_conv_silu_kernel runs
# on the aux stream with ~17 us of slack per call; delayed by less than that it should move
# nothing, by more only the excess. One call through the device tool, carrying .nsys.
set -u
N=/tmp/nx/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys
[ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
export PYTHONPATH=$PWD TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
mkdir -p /tmp/rec && rm -f /tmp/rec/*
rec() {  # name, args...
  local name=$1; shift
  timeout 200 $N profile -t cuda,nvtx --cuda-graph-trace=node --sample=none --cpuctxsw=none \
     --capture-range=cudaProfilerApi --capture-range-end=stop -f true -o /tmp/rec/$name \
     python3 -m kernels.record_loop --workload small --timings-json /tmp/rec/$name.json "$@" > /tmp/rec/$name.log 2>&1
  echo "$name rc=$? $(tail -1 /tmp/rec/$name.log | cut -c1-200)"
}
rec small_delay_conv_8us --steps 60 --capture inside --delay-kernel kda_conv_silu_kernel --delay-ns 8000
rec small_delay_conv_25us --steps 60 --capture inside --delay-kernel kda_conv_silu_kernel --delay-ns 25000
rec small_inside_d --steps 60 --capture inside
(cd /tmp/rec && tar cf - *.json *.log *.qdstrm) | xz -T0 -6 > $OUT/slack.tar.xz
ls -la $OUT

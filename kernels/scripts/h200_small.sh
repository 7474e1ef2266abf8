#!/usr/bin/env bash
# Records the small workload's fixture traces on the H200 (run through the device tool with
# `.nsys` carried; see ../shared/gpu/README.md). Leaves compressed .qdstrm files in $OUT.
set -u
[ -x /tmp/nx/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
N=/tmp/nx/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys
export PYTHONPATH=$PWD TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
mkdir -p /tmp/rec
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/env.txt
loop="python3 -m kernels.record_loop --workload small"
# Without nsys: step time as the workload runs unprofiled (the cost-of-recording baseline).
$loop --steps 200 --time-steps 500 --timings-json /tmp/rec/unprofiled.json 2>&1 | tail -3
rec() {  # name, args...
  local name=$1; shift
  $N profile -t cuda,nvtx --cuda-graph-trace=node --sample=none --cpuctxsw=none \
     --capture-range=cudaProfilerApi --capture-range-end=stop -f true -o /tmp/rec/$name \
     $loop --timings-json /tmp/rec/$name.json "$@" > /tmp/rec/$name.log 2>&1
  echo "$name rc=$? $(tail -1 /tmp/rec/$name.log)"
}
rec small_inside_a --steps 60 --capture inside
rec small_inside_b --steps 60 --capture inside
rec small_inside_c --steps 60 --capture inside
rec small_before --steps 60 --capture before
rec small_delay_kda_step --steps 60 --capture inside --variant delay_kda_step --delay-kernel kda_step_kernel --delay-ns 4000
rec small_delay_gate --steps 60 --capture inside --variant delay_gate --delay-kernel kda_gate_kernel --delay-ns 3000
rec small_nofork --steps 60 --capture inside --variant nofork --no-fork
rec small_long --steps 2900 --capture before --variant long
ls -la /tmp/rec
cd /tmp/rec && tar cf - *.json *.log $(ls *.qdstrm | grep -v small_long) | xz -T0 -6 > $OUT/small_traces.tar.xz
xz -T0 -6 -c small_long.qdstrm | split -b 15000000 -d - $OUT/small_long.qdstrm.xz.part
ls -la $OUT

#!/usr/bin/env bash
# Third-party decode recordings on the H200 (kernels/hf_llama.py: transformers' Llama, one module
# changed per variant), through the device tool. Two calls while the machine stays warm, each
# carrying .nsys (../shared/gpu/README.md):
#   bash kernels/scripts/h200_hf.sh a;  ... b;  ... before;  ... repeats;  ... labels;  ... long;  ... side_work
# Leaves the standalone micro-benchmark, logs, compressed .qdstrm files and one Kineto trace in $OUT.
set -u
phase=${1:?phase a, b, before, repeats, labels, long or side_work}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
N=/tmp/nx/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys
[ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
mkdir -p /tmp/rec && rm -f /tmp/rec/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"

rec() {  # name, args... : one nsys recording of the HF decode loop
  local name=$1; shift
  timeout 240 $N profile -t cuda,nvtx --cuda-graph-trace=node --sample=none --cpuctxsw=none \
     --capture-range=cudaProfilerApi --capture-range-end=stop -f true -o /tmp/rec/$name \
     python3 -m kernels.hf_llama --timings-json /tmp/rec/$name.json "$@" > /tmp/rec/$name.log 2>&1
  echo "$name rc=$? $(tail -1 /tmp/rec/$name.log | cut -c1-300)"
}

if [ $phase = a ]; then
python3 -m kernels.hf_llama --microbench --timings-json /tmp/rec/hf_microbench.json 2>&1 | tail -1
rec hf_base_a
rec hf_base_b
rec hf_norm_fused_a --variant norm_fused
rec hf_mlp_spin --variant mlp_spin
rec hf_mlp_side_stream_a --variant mlp_side_stream
rec hf_side_spin --variant side_spin
elif [ $phase = repeats ]; then  # interleaved, so drift over time falls on both builds alike
for i in 1 2; do
  rec hf_rep_base_$i
  rec hf_rep_norm_fused_$i --variant norm_fused
done
rec hf_rep_spin_1 --variant mlp_spin
elif [ $phase = labels ]; then  # engine-style layer NVTX (issue: labels on engine traces)
rec hf_vllm_inside --nvtx-style vllm
rec hf_vllm_before_eager --nvtx-style vllm --capture before --eager-steps 2
rec hf_vllm_eager_donor --nvtx-style vllm --capture before --no-graph --steps 20
rec hf_sglang_before --nvtx-style sglang --capture before
rec hf_trtllm_inside --nvtx-style trtllm
rec hf_nonvtx_before --nvtx-style none --capture before
for r in a b; do
  timeout 240 python3 -m kernels.hf_llama --steps 20 --kineto /tmp/rec/hf_kineto_labels_$r.pt.trace.json.gz \
    --timings-json /tmp/rec/hf_kineto_labels_$r.json > /tmp/rec/hf_kineto_labels_$r.log 2>&1; echo "kineto $r rc=$?"
done
timeout 300 python3 -m kernels.record_loop --workload k3-decode --layers 8 --steps 40 \
  --kineto /tmp/rec/k3_bs1_kineto.pt.trace.json.gz > /tmp/rec/k3_bs1_kineto.log 2>&1; echo "k3 kineto rc=$?"
cp /tmp/rec/*.gz $OUT/ 2>/dev/null
elif [ $phase = before ]; then  # graphs captured before the window, as engines do
B="--capture before"
rec hf_before_base_b $B
rec hf_before_base_c $B
rec hf_before_norm_fused_a $B --variant norm_fused
rec hf_before_norm_fused_b $B --variant norm_fused
rec hf_before_mlp_spin $B --variant mlp_spin
rec hf_before_mlp_side_stream_a $B --variant mlp_side_stream
rec hf_before_mlp_side_stream_b $B --variant mlp_side_stream
rec hf_before_side_spin $B --variant side_spin
elif [ $phase = side_work ]; then  # a side leg beside the whole MLP, joined at its output, at four lengths:
  # its end before, then across, main-stream kernels that never wait on it (k3trace diff's `joined`)
for c in 1000 8000 20000 40000; do rec hf_side_work_$c --variant side_work --side-cycles $c --steps 40; done
elif [ $phase = long ]; then  # long decodes: k3trace's speed (issue 13) on code nobody here wrote
rec hf_long_base --layers 24 --steps 600
rec hf_long_norm_fused --layers 24 --steps 600 --variant norm_fused
else
rec hf_base_c
rec hf_norm_fused_b --variant norm_fused
rec hf_mlp_side_stream_b --variant mlp_side_stream
rec hf_before_base_a --capture before
timeout 240 python3 -m kernels.hf_llama --steps 20 --kineto /tmp/rec/hf_base_kineto.pt.trace.json \
  --timings-json /tmp/rec/hf_base_kineto.json > /tmp/rec/hf_base_kineto.log 2>&1; echo "kineto rc=$?"
fi
(cd /tmp/rec && tar cf - *.json *.log *.qdstrm 2>/dev/null) | xz -T0 -6 | split -b 15000000 -d - "$OUT/hf_$phase.tar.xz.part"
ls -la $OUT /tmp/rec

#!/usr/bin/env bash
# The K3 runs on the H200, through the device tool (../shared/gpu/README.md). Phases, each one
# call while the machine stays warm:
#   stage1   (carry .gpu1)  keep the first half of the CuTe DSL wheel
#   stage2   (carry .nsys)  unpack the Nsight Systems profiler
#   test     (carry .gpu2)  install CuTe DSL + nvtx; GPU tests; step-time bench; cost of recording
#   record   (carry .gpu2)  record the fixtures: baseline and every variant at bs1, a bs8 pair
#   long     (carry .gpu2)  full-depth bs1 baseline and MLA-split, ~175 steps each (~400k kernels)
#   pair     (carry .nsys)  full-depth bs1 baseline and router multipass (the diff's speed and a
#                           full-depth split edit), ~175 steps each; needs neither CuTe DSL nor nvtx
#   engine   (carry .nsys)  the 8-layer bs1 baseline with vLLM-style layerwise module NVTX (graph
#                           captured inside the window, and before it with one eager step); unpacks
#                           nsys itself; needs neither CuTe DSL nor nvtx
#   campaign_test  (carry .nsys)  the bs1 campaign (kernels/README.md): its GPU tests, the
#                  standalone cases and GEMM sweeps (bench/bench_k3_ops.py, B = 1 and 8), the
#                  step against the HBM floor for each cumulative build (B = 1, 8, 64)
#   campaign_rec   (carry .nsys)  full-depth bs1 recordings of each cumulative build, two runs
#                  each (noise bands from repeats), 60 steps; the 8-layer fixtures of each build
#   record_build cNN (carry .nsys)  one build of the campaign recorded (2 full-depth runs, its
#                  8-layer fixture and c20's), e.g. `record_build c29` after campaign20
# Leaves logs and compressed .qdstrm files in $OUT.
set -u
phase=${1:?phase}
export PYTHONPATH=$PWD TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
N=/tmp/nx/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys
install_dsl() { [ -f .gpu2/install.sh ] && source .gpu2/install.sh; }

rec() {  # name, args... : one nsys recording of the decode loop
  local name=$1; shift
  timeout 300 $N profile -t cuda,nvtx --cuda-graph-trace=node --sample=none --cpuctxsw=none ${NSYS_EXTRA:-} \
     --capture-range=cudaProfilerApi --capture-range-end=stop -f true -o /tmp/rec/$name \
     python3 -m kernels.record_loop --workload k3-decode --timings-json /tmp/rec/$name.json "$@" \
     > /tmp/rec/$name.log 2>&1
  echo "$name rc=$? $(tail -1 /tmp/rec/$name.log | cut -c1-300)"
}

test_time_record() {  # op tests (-k), tag, name, build: a fifth-round change on C20, A/B'd and recorded
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_k3_model.py \
    -k "$1 or matches_reference or kernel_nodes" 2>&1 | tee $OUT/gpu$2.log | tail -1
  timeout 100 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C20 $4 $C20 $4 \
    --json $OUT/step$2.json 2>&1 | grep "B="
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_$3_$r --steps 40 --variant $4; done
  pack k3_$3
}

pack() {  # archive name: every .qdstrm + json + log under /tmp/rec, xz-compressed, split to 15 MB
  (cd /tmp/rec && tar cf - *.json *.log *.qdstrm 2>/dev/null) | xz -T0 -6 | split -b 15000000 -d - "$OUT/$1.tar.xz.part"
  ls -la "$OUT"
}

# The campaign's cumulative builds, in the order the changes were made.
# situ_fused and attn_res_fused were slower (2026-12-01, campaign_test): they are recorded
# as single changes on C3 (campaign_neg), not kept in the chain.
C1=router_fork
C2=$C1+mla_combine_wide
C3=$C2+triton_linear
C4=$C3+fmha_short_splits
# Second round (campaign_more), on C3: the router leg shortened, then add3 folded.
C5=$C3+router_align_fused
C6=$C5+mlp_residual_folded
C7=$C6+pdl_early_trigger
# Third round (campaign3_test / campaign3_rec): the attention residual's aggregation, then
# L2 prefetches of the next weight from the latency-bound kernels before it.
C8=$C7+attn_res_dot
C9=$C8+attn_res_early_rows
C10=$C9+prefetch:${PF_MB:-24}
# attn_res_early_rows and prefetch were slower (campaign3_test): the chain goes on from C8.
C11=$C8+moe_tail_fused
# moe_tail_fused was slower (campaign4): the norm alone, folded, on C8.
C12=$C8+latent_norm_folded
C13=$C8+linear_early_weights
# Fourth round (campaign7_test / campaign7_rec), on C8: the KDA conv inside kda_step, and
# the MLA's three x projections as one GEMM (no g_proj leg beside the FMHA).
C14=$C8+kda_conv_fused
C15=$C8+mla_proj_merged
C16=$C14+mla_proj_merged
# mla_proj_merged was slower (campaign7_test): the chain goes on from C14.
C17=$C14+moe_sum_norm_fused
C18=$C14+linear_split_k
C19=$C14+prefetch_leg:${PL_MB:-8}
C20=$C14+triton_o_proj
C21=$C20+triton_mla_proj
# triton_mla_proj was even (campaign12): the chain goes on from C20. Fifth round: the router
# leg taken into the front GEMM's launch.
C22=$C20+router_in_front
# router_in_front was even (campaign13): the chain goes on from C20; the pre-MLP score in the o_proj.
C23=$C20+attn_res_in_o_proj
# Sixth round: the skinny GEMMs' weight tiles by TMA descriptor.
C24=$C20+linear_tma
# k3trace whatif on c20: with the MoE GEMMs faster the router leg beside the front becomes the
# path; side_priority gives the legs SMs first (C25 on C20, C26 on C24).
C25=$C20+side_priority
C26=$C24+side_priority
# linear_split_k (round four) starved the router leg beside the split front: with the legs first?
C27=$C20+linear_split_k+side_priority
# linear_tma was even and side_priority slower (campaign18). attn_res_early_rows again, on C20:
# its combine with attn_res_dot no longer spills on Triton 3.6 (the partials summed in index order).
C28=$C20+attn_res_early_rows
# attn_res_early_rows was slower again (campaign19). The routed down GEMM forms the weighted
# sum itself (moe_down_mixed, C29), and with the routed SiTU in its load too (C30).
C29=$C20+moe_down_mixed
C30=$C29+situ_fused
# linear_tma (C24) ran 0.12 ms faster than C20 at B = 1 once the first position of each process
# (about 0.17 ms fast for whatever build runs there) is left out: B = 8 and 64 still to check.
C31=$C24+moe_down_mixed
# The attention residuals hold 44% of c20's time above the floor: score + combine as one launch
# whose programs each form the whole Gram matrix (attn_res_one_pass, C32).
C32=$C20+attn_res_one_pass
# Both were slower (campaign20, campaign21); linear_tma even at B = 8 and 64: the chain goes on
# from C24. HBM idles while the latency-bound kernels before each skinny GEMM run: the GEMM asks
# L2 for its first weight rows before its PDL wait (linear_prefetch:<MB>), and with
# pdl_trigger_first the kernels before it trigger first, so that it launches while they run.
C33=$C24+pdl_trigger_first
C34=$C24+linear_prefetch:16
C35=$C24+linear_prefetch:8+pdl_trigger_first
C36=$C24+linear_prefetch:16+pdl_trigger_first
C37=$C24+linear_prefetch:32+pdl_trigger_first
# C34-C37 ran slower the more they prefetched (campaign22, commit 5500536): the GEMM asked L2 for
# its weight by bulk prefetches, which queue ahead of its own TMA loads. Now each program asks
# for its own lines by prefetch.global.L2 on the load/store path.
C38=$C24+linear_prefetch:8
C39=$C24+linear_prefetch:16
C40=$C24+linear_prefetch:8+pdl_trigger_first
C41=$C24+linear_prefetch:16+pdl_trigger_first
# Neither prefetch helped in the step (campaign23). k3trace diff of C20 / C24 recorded in one call
# (record_ab): TMA sped up the MoE GEMMs and qkvg, and slowed the KDA o_proj with the score after
# it (+35 us together). TMA on the GEMMs that read x only (C42); the front at the TMA sweep's
# best config (C43); both (C44).
C42=$C24+linear_tma_x
C43=$C24+linear_tma_tuned
C44=$C24+linear_tma_x+linear_tma_tuned
# C44 ran 0.04 ms faster than C24 unprofiled and -53 us (band 6) in k3trace diff of the pair
# recorded in one call; B = 8 and 64 even (campaign24_big): the campaign build is C44.
# Ninth round, on C44. The MoE tail: the up GEMM takes the 16 expert rows as its MMA's rows and
# sums them once on the accumulator (moe_tail_mma; the old moe_tail_fused mixed them into the
# operand every K block and ran 44 us against 18.7). The weighted sum's and the norm's launches go.
C45=$C44+moe_tail_fused+moe_tail_mma
# The MoE front's rest split over K at other program counts, swept in the step (BUILD@split=):
# the front ran at 2.8 TB/s on 80 SMs beside the router leg; 240 programs starved that leg (c18).
C46=$C24+linear_tma_x+linear_split_k
# Both slower (campaign25): the fused tail ran 29.9 us alone (Gram) against the three kernels'
# 17.8, and no split beat the 80-program front in the step. The o_proj and the front's rest as a
# Gluon kernel whose first weight copies go out before its PDL wait (linear_gluon; campaign26:
# alone the o_proj one call 18.6 -> 13.8 us, the front 27.1 -> 26.5).
C47=$C44+linear_gluon
# In the step only the o_proj gained (campaign27, campaign28: -0.06 ms with all 8 slots copied
# before the wait). plan.GLUON_SUBOPS is now the o_proj alone: C47 and C48 are the same build.
C48=$C44+linear_gluon
# The KDA o_proj alone ran faster still (campaign29: -0.09 ms against C48's -0.07; the MLA
# o_proj follows the short gate_mul, so its copies have less to hide under). GLUON_SUBOPS is now
# the KDA o_proj: C47 to C49 are one build since.
C49=$C44+linear_gluon
# Tenth round, on C49. The Gluon GEMM warp-specialized (linear_ws): a loader warp streams every
# slot from the CTA's start, never waiting for the PDL producer; the consumers multiply by
# mma.sync as Triton's skinny kernel does (the FMA form was slower than Triton's once its wait
# returned, round 9), with no TMA issue or CTA barrier of their own in the loop.
C50=$C49+linear_ws
# Slower in every form (campaign30: the KDA o_proj +0.24 ms, its FMA form +0.10; alone the
# mma.sync consumer ran the up GEMM 22.5 us back to back against Triton's 13.9). The MoE tail
# instead: the routed down GEMM adds each expert row times its weight into an fp32 latent by
# atomic adds on its own grid, the latent norm reads and clears it (moe_down_atomic): the
# weighted sum's launch and hop go (moe_down_mixed lost by its 112-program grid).
C51=$C49+moe_down_atomic
# -0.05 ms unprofiled, -34 us in k3trace diff (band 6; campaign31). The routed SiTU next: the
# gate|up GEMM takes each gate row with its up row in one tile and stores SiTU of them
# (situ_in_gate_up, bit for bit situ_mul's h): situ_mul's launch and hop go (situ_fused, the
# other side of the same hop, lost by its per-K-block SiTU in the down GEMM's operand).
C52=$C51+situ_in_gate_up
# +0.24 ms unprofiled, +354 us in k3trace diff (campaign32): the shared experts' cuBLAS down GEMM on
# S1, which had run beside the routed down GEMM, now starts only once that GEMM has drained (its
# CTAs, launched at the gate|up GEMM's trigger, hold the SMs) and lands beside the up GEMM (+4 us).
# The campaign build is C51.
# Then the shared experts' down GEMM itself (cuBLAS, 4 CTAs, 11 MB on S1; it ran beside the routed
# down GEMM): stacked under the up GEMM's weights along K, the up GEMM reading [normed latent |
# shared h] (shared_in_up): one launch and one rounding fewer, S1 joined before the up GEMM. With
# it situ_in_gate_up has no side GEMM left to starve (C54).
C53=$C51+shared_in_up
C54=$C53+situ_in_gate_up
# C53 +0.08 ms, C54 +0.02 against C51 (campaign33; C54 -0.06 against C53: with no side GEMM left
# to starve, situ_in_gate_up gains). The 11 MB moved onto the up GEMM's stream, on the path; beside
# the routed down GEMM they had cost it 0.6 us. Neither kept.
# Eleventh round, on C51: the MLA segment. In the c51 recording an MLA layer runs ~15 us longer than
# a KDA layer, its attention ~45 us against a ~20 us floor: FMHA + combine 17.4 us beside g_proj
# (65 splits of 128 tokens, four 32-token tiles each, on half the SMs), the cuBLAS absorb and V-up
# BMMs 3.2 and 3.8 us for 1.5 MB each, launched only after their producers complete, and gate_mul's hop.
C55=$C51+fmha_one_tile            # 129 splits of one 64-token tile, the page look-ups before the wait
C56=$C55+fmha_early_kv            # and the tile's cache rows before the wait
C57=$C51+mla_head_bmm             # absorb and V-up as head_bmm_kernel, in the PDL chain
C58=$C57+mla_gate_in_v            # V-up applies the output gate (no gate_mul launch)
C59=$C56+mla_head_bmm+mla_gate_in_v
# campaign34: C55 -0.03, C56 -0.05, C57 -0.07, C58 -0.06 (one outlier of 13.3 ms), C59 -0.04 ms against
# C51's 11.970-11.980. The absorb alone 2.86 -> 2.05 us back to back; the FMHA + combine beside g_proj
# 28.2 -> 23.6 us one call at a time but 17.0 -> 18.1 back to back (a 64-token tile in registers takes
# 8 warps and 131-149 KB of shared memory, one CTA per SM beside g_proj's).
C60=$C57+fmha_one_tile+fmha_early_kv
# campaign35: C57 -0.07 ms again (11.901-11.910 against C51's 11.961-11.972), B = 8 even; C60 +0.03
# and C56 -0.04 against C51; C57+fmha_short_splits +0.12, C57+mla_gate_in_v even (campaign36's list).
# k3trace diff c57 -> c60: the one-tile FMHA + combine ran 10.2 us on the path against 15.8, but its
# 129 CTAs of 149 KB shared memory kept g_proj (forked at q_concat) off the SMs until they drained:
# g_proj then ran after the FMHA and V-up waited behind it (+192 us). So g_proj forks with the KV leg,
# beside the Q chain, where q_a and kv_a leave HBM half idle (g_proj_early).
C61=$C57+g_proj_early
C62=$C60+g_proj_early
C63=$C62+mla_gate_in_v
# campaign36: C61 +0.13 (q_a, kv_a and g_proj at once stretch the first phase 12.5 -> 18.8 us), C62 +0.04,
# C63 +0.04 against C57. campaign37/38 (another H200: C51 11.90-11.93, C57 11.85-11.86): triton_mla_proj on
# C57 even; its GEMMs one by one: q_b -0.04, q_a -0.06, q_a + q_b -0.08, with kv_a -0.02, with g_proj -0.01.
# Round five's verdict on them (c20: +0.14) predates the absorb's PDL launch, which now lets q_b's
# successor launch early. The two GEMMs on main, split-K skinny (mla_q_skinny):
C64=$C57+mla_q_skinny
# -0.07 ms against C57, -0.13 against C51 (campaign39); kept. Last, the one-tile FMHA with the side
# streams at high priority, so that the g_proj leg's CTAs are placed before the FMHA's (C65, C66):
C65=$C64+fmha_one_tile+fmha_early_kv
C66=$C65+side_priority
# +0.12 / +0.11 ms against C64 (campaign40): not kept. What PDL itself is worth: every Triton launch a
# plain one (no_pdl), the control for k3trace whatif --no-pdl.
C67=$C64+no_pdl
# Round twelve: the routed grouped GEMMs' blocks were picked back to back at every batch; on c64's path
# the gate|up GEMM runs ~25 us for 88 MB (floor 20.7) and the down GEMM ~12.6 for 44 MB (10.3). Their
# blocks swept in the routed chain one call at a time, the best in the step (moe_grouped_tuned):
C68=$C64+moe_grouped_tuned
# The down GEMM at (64, 64, 4, 4): -0.08 ms at B = 1, -0.12 at B = 8, -4.1 at B = 64 (campaign41-49);
# no gate|up config gained. Kept: the campaign build is C68. Then the attention residuals' pair in
# 1024-column chunks (campaign50, and an inline list with 2048 and 8 warps): -0.15 ms. Its GPU tests and
# recording did not fit that session's device time; campaign51 (the next session) passed them: kept,
# -0.12 to -0.14 ms, k3trace diff -143 us. The campaign build is C69:
C69=$C68+attn_res_wide
# Fifteenth round, prepared without a device: two copies leave the MLA path. The absorb writes the query
# rows (mla_absorb_concat: k3trace whatif --remove on c69 predicts -33 us), the KV norm writes the cache
# row (mla_kv_norm_insert: predicted 0, the KV leg ends 0.35 us before q_concat starts; the control, and
# for when the Q chain is shorter). Both are copies: the same bits (GPU test test_gpu_mla_hops_bitwise).
C70=$C69+mla_absorb_concat
C71=$C69+mla_kv_norm_insert
C72=$C69+mla_absorb_concat+mla_kv_norm_insert
# And gate_mul's product in the skinny o_proj's operand load, the g_proj join kept before the o_proj
# (mla_gate_in_o_proj: whatif -18 us on c69; mla_gate_in_v, which moved that join up to V-up, was even).
C73=$C72+mla_gate_in_o_proj
# round 18 (on C72): the latency windows filled with the next GEMM's first weight bytes, asked of L2 per line
# by the score kernels (prefetch_lines) or by the skinny GEMM before the window (gemm_prefetch)
C74=$C72+prefetch:8+prefetch_lines
C75=$C72+prefetch:16+prefetch_lines
C76=$C72+gemm_prefetch:8
C77=$C72+gemm_prefetch:16
# round 19 (on C72): nsys's GPU metrics show HBM idling 3-5 us at every GEMM -> short kernel -> GEMM
# transition. The grouped GEMMs load their first weight blocks (the down GEMM all of K) before their
# wait, and the short kernels before them (the routed situ_mul, the latent norm) trigger first, so that
# the next GEMM launches, and streams, during them; C79 with the up GEMM as the Gluon GEMM that copies
# its first slots before its wait.
C78=$C72+moe_weights_ahead
C79=$C78@glsub=kda.o_proj,moe.up
# C80: every transition ahead: the attention residuals' pair triggers first too (pdl_trigger_first) and
# qkvg joins the Gluon GEMMs with all 8 slots copied before its wait.
C80=$C78+pdl_trigger_first@glsub=kda.o_proj,moe.up,kda.qkvg@glcfg=7168x6144:64,128,4,8,8
# C81: and the MLA o_proj too, launched during the FMHA's combine (V-up and gate_mul trigger first), as the
# Gluon GEMM with 8 of its 12 slots copied before its wait (GL_CONFIGS' o_proj shape).
C81=$C78+pdl_trigger_first+mla_o_proj_ahead@glsub=kda.o_proj,moe.up,kda.qkvg,mla.o_proj@glcfg=7168x6144:64,128,4,8,8
# C82: and the MoE front's rest too (the pre-MLP pair -> front hand-over, part of the KDA segment's
# 11-us dip), at 4 warps (round nine's 8-warp Gluon front slowed the router GEMV beside it on S2).
C82=$C78+pdl_trigger_first+mla_o_proj_ahead@glsub=kda.o_proj,moe.up,kda.qkvg,mla.o_proj,moe.front@glcfg=7168x6144:64,128,4,8,8/7168x5120:64,128,4,8,8
# round 20 (on C72): kda_step is 11 us of every KDA layer's path, its one program per head 255 registers at
# 8 warps; the V-split step ran 3.33 us against the fused 5.97 in the bundled recordings. kda_split_v: four
# programs per head, a barrier of the four for the norm's sum of squares (C83); with round 19's C81 (C84).
C83=$C72+kda_split_v
C84=$C78+pdl_trigger_first+mla_o_proj_ahead+kda_split_v@glsub=kda.o_proj,moe.up,kda.qkvg,mla.o_proj@glcfg=7168x6144:64,128,4,8,8

# round 21 (on C72): the MoE front streams 22 MB of shared-expert columns on main before the routed chain can
# start, while the GPU metrics show HBM below its rate in the routed chain's hand-overs. shared_front_leg: those
# columns as their own GEMM at the head of the S1 leg (C85); with S1 and S2 above main's priority (C86).
C85=$C72+shared_front_leg
C86=$C85+side_priority
# the S1 GEMM at a small config split over K (20 KB of shared memory, 96 programs), to fit beside main's grouped
# GEMMs: c72's trace has S1's cuBLAS down GEMM waiting 17 us for an SM, and whatif gives S1 about 3 us of slack
C87=$C85@leg=64,128,4,2/4
# Round twenty-three: c72 with the router's top-k four a selection round (the same routing, bit for bit).
C88=$C72+router_top4
C89=$C72+router_bitonic
# Round twenty-seven: c72 with the routed grouped GEMMs' weight tiles by TMA (bit for bit).
C90=$C72+moe_grouped_tma

case $phase in
campaign_test)
  set -o pipefail
  timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_gemv.py tests/kernels/test_k3_ops.py \
    -k "skinny or gemv or mla_decode or attn_res or moe_chain" 2>&1 | tee $OUT/gpu_ops.log | tail -5
  timeout 240 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "kernel_nodes or matches_reference or variant_pairs" 2>&1 | tee $OUT/gpu_model.log | tail -5
  timeout 200 python3 bench/bench_k3_ops.py --batch 1 ${SWEEP:---sweep} --json $OUT/ops_b1.json 2>&1 | tee $OUT/ops_b1.log
  timeout 100 python3 bench/bench_k3_ops.py --batch 8 --json $OUT/ops_b8.json 2>&1 | tee $OUT/ops_b8.log
  timeout 300 python3 bench/bench_k3_step.py --batches 1 --variants baseline ${VARIANTS:-$C1 $C2 $C3 $C4 $C3+situ_fused $C3+attn_res_fused} \
    --json $OUT/step_b1.json 2>&1 | tee $OUT/step_b1.log ;;
campaign_probe)  # 8-layer bs1 recordings of the builds named in $PROBE (name=variant ...)
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for nv in $PROBE; do rec k3_probe_${nv%%=*} --layers 8 --steps ${STEPS:-40} --variant ${nv#*=}; done
  pack k3_probe ;;
campaign_final)  # after the last code change: the model's GPU tests, the B = 1 chain unprofiled
  set -o pipefail
  timeout 240 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py tests/kernels/test_gemv.py \
    2>&1 | tee $OUT/gpu_model.log | tail -5
  timeout 300 python3 bench/bench_k3_step.py --batches 1 --variants baseline $C1 $C2 $C3 $C4 \
    --json $OUT/step_b1.json 2>&1 | grep -v "attention weights" ;;
campaign_more)  # GPU tests of the second round; C3 C5 C6 interleaved unprofiled; recordings
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  set -o pipefail
  timeout 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "variant_pairs or kernel_nodes" 2>&1 | tee $OUT/gpu_model.log | tail -3
  timeout 60 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py -k "router or add3 or attn_res_k3" 2>&1 | tail -2
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C3 $C5 $C6 $C3 $C5 $C6 \
    --json $OUT/step_more.json 2>&1 | grep -v "attention weights"
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for nv in c3=$C3 c5=$C5 c6=$C6; do
    for r in a b; do rec k3_full_${nv%%=*}_$r --steps 40 --variant ${nv#*=}; done
  done
  rec k3_bs1_c5 --layers 8 --steps 40 --variant $C5
  rec k3_bs1_c6 --layers 8 --steps 40 --variant $C6
  pack k3_more ;;
campaign_pdl)  # the early trigger: GPU variant pairs, C6/C7 interleaved, C7 recorded, B = 8, 64
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  timeout 100 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k "variant_pairs" 2>&1 | tail -2
  timeout 120 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C6 $C7 $C6 $C7 \
    --json $OUT/step_pdl.json 2>&1 | grep "B="
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_c7_$r --steps 40 --variant $C7; done
  rec k3_bs1_c7 --layers 8 --steps 40 --variant $C7
  pack k3_pdl
  timeout 150 python3 bench/bench_k3_step.py --batches 8 64 --variants baseline $C7 \
    --json $OUT/step_pdl_b8_64.json 2>&1 | grep "B=" ;;
campaign3_test)  # the third round's GPU tests, standalone cases, C7..C10 interleaved, prefetch sizes
  set -o pipefail
  timeout 120 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py \
    -k "attn_res or prefetch" 2>&1 | tee $OUT/gpu_ops.log | tail -2
  timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "variant_pairs or kernel_nodes" 2>&1 | tee $OUT/gpu_model.log | tail -2
  timeout 100 python3 bench/bench_k3_ops.py --batch 1 --json $OUT/ops_b1.json 2>&1 | grep -A4 "^attn_res_fused (B"
  timeout 330 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C7 $C8 $C9 $C10 $C7 $C8 $C9 $C10 $C9+prefetch:12 $C9+prefetch:40 \
    --json $OUT/step3.json 2>&1 | grep "B=" ;;
campaign3_rec)  # C7/C8/C8+prefetch interleaved; C8 recorded (2 runs + 8 layers); probes; B = 8, 64
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C7 $C8 $C8+prefetch:8 $C8+prefetch:24 $C7 $C8 --json $OUT/step3b.json 2>&1 | grep "B="
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_c8_$r --steps 40 --variant $C8; done
  rec k3_bs1_c8 --layers 8 --steps 40 --variant $C8
  rec k3_probe_early --layers 8 --steps 40 --variant $C9
  rec k3_probe_pf24 --layers 8 --steps 40 --variant $C8+prefetch:24
  pack k3_c8
  timeout 150 python3 bench/bench_k3_step.py --batches 8 64 --variants baseline $C8 \
    --json $OUT/step3_b8_64.json 2>&1 | grep "B=" ;;
campaign4)  # moe_tail_fused: GPU tests, standalone cases, C8/C11 interleaved, C11 recorded
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  set -o pipefail
  timeout 60 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_gemv.py 2>&1 | tail -1
  timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "variant_pairs or kernel_nodes" 2>&1 | tee $OUT/gpu_model.log | tail -1
  timeout 150 python3 bench/bench_k3_ops.py --batch 1 --json $OUT/ops4_b1.json 2>&1 | \
    grep -A3 "^moe_tail_fused (B\|standalone saving\|attn_res_dot\|moe_tail"
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C8 $C11 $C8 $C11 \
    --json $OUT/step4.json 2>&1 | grep "B="
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_c11_$r --steps 40 --variant $C11; done
  rec k3_bs1_c11 --layers 8 --steps 40 --variant $C11
  pack k3_c11 ;;
campaign5)  # latent_norm_folded: GPU tests, the MoE tail case, C8/C12 at B = 1 and 8, C12 recorded
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  set -o pipefail
  timeout 60 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_gemv.py 2>&1 | tail -1
  timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "variant_pairs or kernel_nodes" 2>&1 | tee $OUT/gpu_model.log | tail -1
  timeout 150 python3 bench/bench_k3_ops.py --batch 1 --json $OUT/ops5_b1.json 2>&1 | grep -A4 "^moe_tail_fused (B"
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C8 $C12 $C8 $C12 \
    --json $OUT/step5.json 2>&1 | grep "B="
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_c12_$r --steps 40 --variant $C12; done
  rec k3_bs1_c12 --layers 8 --steps 40 --variant $C12
  pack k3_c12
  timeout 100 python3 bench/bench_k3_step.py --batches 8 --variants $C8 $C12 $C8 $C12 \
    --json $OUT/step5_b8.json 2>&1 | grep "B=" ;;
campaign6)  # linear_early_weights: the GEMV tests, C8/C13 interleaved, C13 recorded
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  set -o pipefail
  timeout 60 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_gemv.py 2>&1 | tail -1
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C8 $C13 $C8 $C13 \
    --json $OUT/step6.json 2>&1 | grep "B="
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_c13_$r --steps 40 --variant $C13; done
  pack k3_c13 ;;
campaign7_test)  # the fourth round's GPU tests, standalone cases and sweep, C8/C14/C15/C16 interleaved
  set -o pipefail
  timeout 90 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py \
    -k "kda or compile" 2>&1 | tee $OUT/gpu_ops.log | tail -1
  timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "variant_pairs or kernel_nodes" 2>&1 | tee $OUT/gpu_model.log | tail -1
  timeout 120 python3 bench/bench_k3_ops.py --batch 1 --cases kda_conv_fused mla_proj_merged \
    --sweep-shapes mla_proj_merged "q_a /" --json $OUT/ops7_b1.json 2>&1 | grep -v "^ *$" | tail -12
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C8 $C14 $C15 $C16 $C8 $C14 $C15 $C16 --json $OUT/step7.json 2>&1 | grep "B=" ;;
campaign8)  # moe_sum_norm_fused: GPU tests, the MoE tail case, C14/C17 at B = 1 and 8, C17 recorded
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  set -o pipefail
  timeout 90 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py \
    -k "weighted_sum or moe or kda" 2>&1 | tee $OUT/gpu_ops.log | tail -1
  timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "variant_pairs or kernel_nodes or reference" 2>&1 | tee $OUT/gpu_model.log | tail -1
  timeout 100 python3 bench/bench_k3_ops.py --batch 1 --cases moe_tail_fused --json $OUT/ops8_b1.json 2>&1 | \
    grep -A5 "^moe_tail_fused (B"
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C14 $C17 $C14 $C17 $C14 $C17 \
    --json $OUT/step8.json 2>&1 | grep "B="
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_c17_$r --steps 40 --variant $C17; done
  rec k3_bs1_c17 --layers 8 --steps 40 --variant $C17
  pack k3_c17
  timeout 120 python3 bench/bench_k3_step.py --batches 8 64 --variants baseline $C17 \
    --json $OUT/step8_b8_64.json 2>&1 | grep "B=" ;;
campaign9_test)  # linear_split_k: the GEMV GPU tests, the split sweep, C14 against C14 + split (its table from the sweep)
  set -o pipefail
  timeout 120 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_gemv.py 2>&1 | tail -1
  timeout 240 python3 bench/bench_k3_ops.py --batch 1 --cases --split-sweep "front (rest" qkvg "moe up" \
    mla_proj_merged "q_a /" --json $OUT/ops9_b1.json 2>&1 | grep "^split"
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 --split-table $OUT/ops9_b1.json \
    --variants $C14 $C14+linear_split_k $C14 $C14+linear_split_k $C14+linear_split_k+mla_proj_merged \
    --json $OUT/step9.json 2>&1 | grep "B=\|split table" ;;
campaign9_rec)  # linear_split_k (C18, the sweep's table committed): GPU model tests, C14/C18, C18 recorded
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  set -o pipefail
  timeout 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "split_k" 2>&1 | tail -1
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_c18_$r --steps 40 --variant $C18; done
  pack k3_c18
  timeout 120 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C14 $C18 $C14 $C18 \
    --json $OUT/step9b.json 2>&1 | grep "B=" ;;
campaign10)  # prefetch_leg:<MB>: C14 against C14 + a prefetch leg of 4, 8, 16 MB interleaved; C19 recorded
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  timeout 260 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C14 $C14+prefetch_leg:8 $C14+prefetch_leg:16 $C14+prefetch_leg:4 \
    $C14 $C14+prefetch_leg:8 $C14+prefetch_leg:16 $C14+prefetch_leg:4 --json $OUT/step10.json 2>&1 | grep "B="
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_c19_$r --steps 40 --variant $C19; done
  pack k3_c19 ;;
campaign11)  # triton_o_proj: the o_proj sweep, C14 / C20 interleaved, C20 recorded
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  timeout 100 python3 bench/bench_k3_ops.py --batch 1 --cases --sweep-shapes "o_proj" --json $OUT/ops11_b1.json 2>&1 | grep "^linear"
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C14 $C20 $C14 $C20 \
    --json $OUT/step11.json 2>&1 | grep "B="
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_c20_$r --steps 40 --variant $C20; done
  pack k3_c20 ;;
campaign11_final)  # after the fourth round's last change: the model's GPU tests; B = 8, 64 baseline vs C20
  set -o pipefail
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py tests/kernels/test_gemv.py \
    2>&1 | tee $OUT/gpu_model.log | tail -2
  timeout 200 python3 bench/bench_k3_step.py --batches 8 64 --variants baseline $C20 \
    --json $OUT/step11_b8_64.json 2>&1 | grep "B=" ;;
campaign12)  # triton_mla_proj: C20 / C21 interleaved, C21 recorded
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C20 $C21 $C20 $C21 \
    --json $OUT/step12.json 2>&1 | grep "B="
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_c21_$r --steps 40 --variant $C21; done
  pack k3_c21 ;;
campaign13_test)  # router_in_front: its GPU tests, the head case and its sweep, C20 / C22 interleaved
  set -o pipefail
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_k3_model.py \
    -k "front_router or matches_reference or kernel_nodes" 2>&1 | tee $OUT/gpu13.log | tail -2
  timeout 120 python3 bench/bench_k3_ops.py --batch 1 --cases router_in_front --json $OUT/ops13_b1.json 2>&1 \
    | grep -v "^standalone"
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C20 $C22 $C20 $C22 \
    --json $OUT/step13.json 2>&1 | grep "B=" ;;
campaign13_step)  # router_in_front at the sweep's best configs in the step, C20 interleaved
  F4=@front=64,128,4,4/8,2; F8=@front=64,128,8,4/8,2  # (campaign13_test: the sweep)
  timeout 300 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C20 $C22$F4 $C22$F8 $C20 $C22$F4 $C22$F8 --json $OUT/step13b.json 2>&1 | grep "B=" ;;
campaign15)  # router_in_front (argmax rounds again; the ranked top-k of c3603d5, campaign14, was slower):
  # the router columns split 16 ways against 8, C20 interleaved
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C20 $C22 $C22@front=64,128,4,4/16,2 \
    $C20 $C22 $C22@front=64,128,4,4/16,2 --json $OUT/step15.json 2>&1 | grep "B=" ;;
campaign15_final)  # after the fifth round's last kernel change: the probe, the o_proj case, every GPU test but CuTe DSL's
  set -o pipefail
  timeout 60 python3 bench/bench_k3_ops.py --batch 1 --cases attn_res_in_o_proj --json $OUT/ops17_b1.json 2>&1 \
    | grep -v "^standalone"
  timeout 60 python3 bench/probe_front_router.py 2>&1 | tee $OUT/probe15.log
  timeout 480 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_gemv.py \
    tests/kernels/test_k3_model.py 2>&1 | tee $OUT/gpu15_all.log | tail -4 ;;
campaign16)  # the skinny GEMM's configs re-picked one call at a time (not back to back); C20 against C20 with them
  timeout 300 python3 bench/bench_k3_ops.py --batch 1 --cases --latency --sweep-shapes rest qkvg "moe up" o_proj \
    --json $OUT/ops16_b1.json 2>&1 | grep "^linear"
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --skinny-table $OUT/ops16_b1.json \
    --variants $C20 $C20@skinny $C20 $C20@skinny --json $OUT/step16.json 2>&1 | grep "B=" ;;
campaign18)  # linear_tma, side_priority: the step A/B first (C20 / C24; C25, C26, C27), then the skinny GPU tests
  timeout 100 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C20 $C24 $C20 $C24 \
    --json $OUT/step18.json 2>&1 | grep "B="
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C20 $C25 $C24 $C26 $C27 $C20 $C25 $C27 \
    --json $OUT/step18p.json 2>&1 | grep "B="
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv.py -k skinny 2>&1 \
    | tee $OUT/gpu18.log | tail -1 ;;
campaign18_ops)  # the TMA case and its sweep (bench_k3_ops), and the offline sm_90 compile on this Triton
  timeout 240 python3 bench/bench_k3_ops.py --batch 1 --cases linear_tma --json $OUT/ops18_b1.json 2>&1 \
    | tee $OUT/ops18_b1.log
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_k3_ops.py -k sm90_compile 2>&1 | tail -1 ;;
campaign19)  # attn_res_early_rows on C20: its GPU tests, the standalone case, C20 / C28 at B = 1, 8, 64
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_k3_model.py \
    -k "attn_res_dot_k3 or matches_reference or kernel_nodes" 2>&1 | tee $OUT/gpu19.log | tail -1
  timeout 100 python3 bench/bench_k3_ops.py --batch 1 --cases "attn_res_fused" "attn_res_fused, 2 rows" \
    --json $OUT/ops19_b1.json 2>&1 | grep -i "early\|dot\|score"
  timeout 130 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C20 $C28 $C20 $C28 $C20 $C28 \
    --json $OUT/step19.json 2>&1 | grep "B="
  timeout 150 python3 bench/bench_k3_step.py --batches 8 64 --variants $C20 $C28 \
    --json $OUT/step19_b8_64.json 2>&1 | grep "B=" ;;
campaign20)  # moe_down_mixed: its GPU tests, the case and sweep; C20 / C24 / C29 / C30 / C31 (+ the sweep's best) at B = 1
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_k3_ops.py -k down_mix 2>&1 \
    | tee $OUT/gpu20.log | tail -1
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k moe_down_mixed 2>&1 \
    | tee -a $OUT/gpu20.log | tail -1
  timeout 150 python3 bench/bench_k3_ops.py --batch 1 --cases moe_down_mixed --json $OUT/ops20_b1.json 2>&1 \
    | tee $OUT/ops20_b1.log
  # The sweep's fastest config (one call at a time) timed in the step beside the default.
  BEST=$(python3 -c "import json, re; c = json.load(open('$OUT/ops20_b1.json'))['cases']['moe_down_mixed']
k = min((k for k in c if 'one call' in k and 'situ' not in k and 'grouped' not in k), key=c.get)
print(','.join(re.findall(r'\d+', k.split('(')[1])))")
  echo "moe_down_mix: fastest one call at $BEST"
  # bench_k3_step.py times one untimed warm-up build per batch first (the first one runs fast).
  timeout 220 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C20 $C24 $C29 $C30 $C31 \
    $C29@downmix=$BEST $C20 $C24 $C29 $C30 $C31 $C29@downmix=$BEST --json $OUT/step20.json 2>&1 | grep "B=" ;;
campaign21)  # attn_res_one_pass (C32): its op and model GPU tests, the standalone case, C20 / C32 at B = 1
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_k3_ops.py -k one_pass 2>&1 \
    | tee $OUT/gpu21.log | tail -1
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k one_pass 2>&1 \
    | tee -a $OUT/gpu21.log | tail -1
  timeout 100 python3 bench/bench_k3_ops.py --batch 1 --cases "attn_res_fused" "attn_res_fused, 2 rows" \
    --json $OUT/ops21_b1.json 2>&1 | grep -i "dot\|one_pass\|score"
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C20 $C32 $C20 $C32 $C20 $C32 \
    --json $OUT/step21.json 2>&1 | grep "B=" ;;
campaign22)  # linear_prefetch, pdl_trigger_first: GPU tests, the two chains standalone, C24 / C33..C37 at B = 1
  timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv.py -k skinny 2>&1 \
    | tee $OUT/gpu22.log | tail -1
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k trigger_first 2>&1 \
    | tee -a $OUT/gpu22.log | tail -1
  timeout 150 python3 bench/bench_k3_ops.py --batch 1 --cases linear_prefetch --json $OUT/ops22_b1.json 2>&1 \
    | tee $OUT/ops22_b1.log
  timeout 250 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C24 $C33 $C34 $C35 $C36 $C37 \
    $C24 $C33 $C34 $C35 $C36 $C37 --json $OUT/step22.json 2>&1 | grep "B=" ;;
campaign23)  # linear_prefetch by line prefetches: the skinny GPU tests, the chains, C24 / C38..C41 at B = 1
  timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv.py -k skinny 2>&1 \
    | tee $OUT/gpu23.log | tail -1
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k trigger_first 2>&1 \
    | tee -a $OUT/gpu23.log | tail -1
  timeout 150 python3 bench/bench_k3_ops.py --batch 1 --cases linear_prefetch --json $OUT/ops23_b1.json 2>&1 \
    | tee $OUT/ops23_b1.log | grep -v "one call"
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C24 $C38 $C39 $C40 $C41 \
    $C24 $C38 $C39 $C40 $C41 --json $OUT/step23.json 2>&1 | grep "B=" ;;
campaign24)  # linear_tma_x, linear_tma_tuned: the GPU tests, C24 / C42 / C43 / C44 at B = 1 (3 rounds)
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k "c24 or matches_reference" \
    2>&1 | tee $OUT/gpu24.log | tail -1
  timeout 250 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C24 $C42 $C43 $C44 \
    $C24 $C42 $C43 $C44 $C24 $C42 $C43 $C44 --json $OUT/step24.json 2>&1 | grep "B=" ;;
campaign25)  # moe_tail_mma and the front's split sweep in the step at B = 1 (2 rounds); the tail case; the GPU tests
  S="$C46@split=128,128,8,4/3 $C46@split=128,256,8,3/3 $C46@split=256,128,8,3/5 $C46@split=256,64,8,4/6"
  S="$S $C46@split=64,256,4,4/2 $C46@split=64,128,4,4/3 $C46@split=128,128,4,4/3"
  timeout 300 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C44 $C45 $C45@tailmma=2 $S \
    $C44 $C45 $C45@tailmma=2 $S --json $OUT/step25.json 2>&1 | grep "B="
  timeout 80 python3 bench/bench_k3_ops.py --batch 1 --cases moe_tail_fused --json $OUT/ops25_b1.json 2>&1 \
    | tee $OUT/ops25_b1.log | tail -6
  timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv.py tests/kernels/test_k3_model.py \
    -k "mixnorm or moe_tail or (matches_reference and not 64)" 2>&1 | tee $OUT/gpu25.log | tail -1 ;;
campaign26)  # linear_gluon: its GPU tests, the standalone case (each shape, the combine -> front chain)
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv_gluon.py 2>&1 \
    | tee $OUT/gpu26.log | tail -3
  timeout 300 python3 bench/bench_k3_ops.py --batch 1 --cases linear_gluon --json $OUT/ops26_b1.json 2>&1 \
    | tee $OUT/ops26_b1.log | tail -90 ;;
campaign27)  # linear_gluon in the step at B = 1: C44 / C47 / its o_proj alone / its front alone / o_proj's copies after the wait (3 rounds); GPU tests; record_ab c44 c47
  G="$C47 $C47@glsub=o_proj $C47@glsub=front $C47@glcfg=1536x7168:64,128,4,8,0"
  timeout 300 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C44 $G $C44 $G $C44 $G \
    --json $OUT/step27.json 2>&1 | grep "B="
  timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv_gluon.py tests/kernels/test_k3_model.py \
    -k "gluon or GLUON" 2>&1 | tee $OUT/gpu27.log | tail -3
  bash $0 record_ab c44 c47 ;;  # carry .nsys: the pair for k3trace diff, in the same call
campaign28)  # linear_gluon on the o_proj alone, more of its weight copied before the wait (up to all of it); with qkvg (3 rounds)
  O="$C47@glsub=o_proj"
  G="$O $O@glcfg=1536x7168:64,128,4,8,8 $O@glcfg=1536x7168:64,128,4,12,12 $O@glcfg=1536x7168:64,128,8,12,12"
  G="$G $O@glcfg=1536x7168:32,128,4,12,12 $C47@glsub=o_proj,qkvg@glcfg=7168x6144:64,256,8,4,4"
  timeout 330 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C44 $G $C44 $G $C44 $G \
    --json $OUT/step28.json 2>&1 | grep "B=" ;;
campaign28_final)  # C44 / C48 recorded in one call; B = 8 even by construction, timed once; every GPU test but CuTe DSL's
  bash $0 record_ab c44 c48
  timeout 60 python3 bench/bench_k3_step.py --batches 8 --variants $C44 $C48 --json $OUT/step28_b8.json 2>&1 | grep "B="
  set -o pipefail
  timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_gemv.py \
    tests/kernels/test_gemv_gluon.py tests/kernels/test_k3_model.py -k "not (variant_pairs and 64)" 2>&1 \
    | tee $OUT/gpu28_all.log | tail -4 ;;
campaign29)  # linear_gluon on the KDA o_proj only (the MLA o_proj's swap read +15 us in k3trace diff): C44 / C48 / it (3 rounds)
  G="$C48 $C48@glsub=kda.o_proj"
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C44 $G $C44 $G $C44 $G \
    --json $OUT/step29.json 2>&1 | grep "B=" ;;
campaign29_rec)  # C44 / C49 recorded in one call; the Gluon GPU tests (plan and graph nodes, reference, near c44)
  timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv_gluon.py tests/kernels/test_k3_model.py \
    -k "gluon or GLUON" 2>&1 | tee $OUT/gpu29.log | tail -2
  bash $0 record_ab c44 c49 ;;
campaign30)  # linear_ws: its GPU tests, the standalone case; in the step on the KDA o_proj, its FMA form, and with up / qkvg / the MLA o_proj / the front (3 rounds)
  timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv_gluon.py -k ws 2>&1 \
    | tee $OUT/gpu30.log | tail -3
  timeout 170 python3 bench/bench_k3_ops.py --batch 1 --cases linear_ws --json $OUT/ops30_b1.json 2>&1 \
    | tee $OUT/ops30_b1.log | tail -60
  G="$C50 $C50@wscfg=1536x7168:64,128,4,8,0,128 $C50@glsub=kda.o_proj,up $C50@glsub=kda.o_proj,qkvg"
  G="$G $C50@glsub=o_proj $C50@glsub=kda.o_proj,front"
  timeout 230 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C49 $G $C49 $G $C49 $G \
    --json $OUT/step30.json 2>&1 | grep "B=" ;;
campaign31)  # moe_down_atomic: its op and model GPU tests; C49 / C51 in the step (3 rounds); record_ab c49 c51 (carry .nsys)
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_k3_ops.py -k "moe_down_atomic or moe_chain" 2>&1 \
    | tee $OUT/gpu31_ops.log | tail -2
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k "atomic and not 64" 2>&1 \
    | tee $OUT/gpu31.log | tail -2
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C49 $C51 $C49 $C51 $C49 $C51 \
    --json $OUT/step31.json 2>&1 | grep "B="
  bash $0 record_ab c49 c51 ;;
campaign32)  # situ_in_gate_up: op, bitwise and model GPU tests; the standalone chain; C49 / C51 / C52 (3 rounds); record_ab c51 c52 (carry .nsys)
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_k3_ops.py -k "situ_in_gate_up or moe_down_atomic" 2>&1 \
    | tee $OUT/gpu32_ops.log | tail -2
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k "gate_up and not 64" 2>&1 \
    | tee $OUT/gpu32.log | tail -2
  timeout 150 python3 bench/bench_k3_ops.py --batch 1 --cases moe_hops --json $OUT/ops32_b1.json 2>&1 \
    | tee $OUT/ops32_b1.log | tail -12
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C49 $C51 $C52 $C49 $C51 $C52 $C49 $C51 $C52 \
    --json $OUT/step32.json 2>&1 | grep "B="
  bash $0 record_ab c51 c52 ;;
campaign32_final)  # after the tenth round's last kernel change: every GPU test but CuTe DSL's; C51 / C52 with side_priority; B = 8 C49 / C51
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C51 $C52+side_priority $C51+side_priority $C51 $C52+side_priority $C51+side_priority \
    --json $OUT/step32f.json 2>&1 | grep "B="
  timeout 60 python3 bench/bench_k3_step.py --batches 8 --variants $C49 $C51 --json $OUT/step32_b8.json 2>&1 | grep "B="
  set -o pipefail
  timeout 360 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_gemv.py \
    tests/kernels/test_gemv_gluon.py tests/kernels/test_k3_model.py -k "not (variant_pairs and 64)" 2>&1 \
    | tee $OUT/gpu32_all.log | tail -4 ;;
campaign34)  # round 11 (MLA): the new ops' and model GPU tests, the mla_round case, C51 / C55..C59 (3 rounds)
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py -k "one_tile or head_bmm or mla_decode" 2>&1 \
    | tee $OUT/gpu34_ops.log | tail -2
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "(matches_reference or kernel_nodes) and fmha_one_tile and not 64 or early_kv_bitwise" 2>&1 | tee $OUT/gpu34.log | tail -2
  timeout 120 python3 bench/bench_k3_ops.py --batch 1 --cases mla_round --json $OUT/ops34_b1.json 2>&1 \
    | tee $OUT/ops34_b1.log | tail -30
  timeout 260 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C51 $C55 $C56 $C57 $C58 $C59 $C51 $C55 $C56 $C57 $C58 $C59 --json $OUT/step34.json 2>&1 | grep "B=" ;;
campaign34_rec)  # record_ab c51 cNN (carry .nsys) for the round's best build; B = 8 C51 / cNN
  v=C${2#c}
  timeout 90 python3 bench/bench_k3_step.py --batches 8 --variants $C51 ${!v} $C51 ${!v} --json $OUT/step34_b8.json 2>&1 | grep "B="
  bash $0 record_ab c51 $2 ;;
campaign35)  # round 11: C51 / C57 / C60 / C56 (3 rounds); the one-tile op test at B = 8; B = 8 C51 / C57; c51, c57, c60 recorded (carry .nsys)
  timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py -k "one_tile" 2>&1 \
    | tee $OUT/gpu35_ops.log | tail -2
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C51 $C57 $C60 $C56 $C51 $C57 $C60 $C56 $C51 $C57 $C60 $C56 --json $OUT/step35.json 2>&1 | grep "B="
  timeout 90 python3 bench/bench_k3_step.py --batches 8 --variants $C51 $C57 $C51 $C57 --json $OUT/step35_b8.json 2>&1 | grep "B="
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do for b in c51 c57 c60; do v=C${b#c}; rec k3_full_${b}_$r --steps 40 --variant ${!v}; done; done
  pack k3_c51_c57_c60 ;;
campaign36)  # round 11: g_proj_early's model GPU tests; C57 / C61 / C62 / C63 / C51 (3 rounds); c57, c61, c62 recorded (carry .nsys)
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "(matches_reference or kernel_nodes) and g_proj_early and not 64" 2>&1 | tee $OUT/gpu36.log | tail -2
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C57 $C61 $C62 $C63 $C51 $C57 $C61 $C62 $C63 $C51 $C57 $C61 $C62 $C63 $C51 --json $OUT/step36.json 2>&1 | grep "B="
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do for b in c57 c61 c62; do v=C${b#c}; rec k3_full_${b}_$r --steps 40 --variant ${!v}; done; done
  pack k3_c57_c61_c62 ;;
campaign37)  # round 11: triton_mla_proj on C57 (the q chain now PDL from the absorb on), its GEMMs one by one (2 rounds)
  M=$C57+triton_mla_proj
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C57 $M $M@mlasub=q_b $M@mlasub=q_b,kv_a $M@mlasub=q_a,q_b $C51 $C57 $M $M@mlasub=q_b $M@mlasub=q_b,kv_a \
    $M@mlasub=q_a,q_b $C51 --json $OUT/step37.json 2>&1 | grep "B=" ;;
campaign39)  # round 11: mla_q_skinny: the model's GPU tests; C57 / C64 / C51 (3 rounds); B = 8 C57 / C64; record_ab c57 c64 (carry .nsys)
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "(matches_reference or kernel_nodes) and mla_q_skinny and not 64" 2>&1 | tee $OUT/gpu39.log | tail -2
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C57 $C64 $C51 $C57 $C64 $C51 $C57 $C64 $C51 --json $OUT/step39.json 2>&1 | grep "B="
  timeout 90 python3 bench/bench_k3_step.py --batches 8 --variants $C57 $C64 $C57 $C64 --json $OUT/step39_b8.json 2>&1 | grep "B="
  bash $0 record_ab c57 c64 ;;
campaign39_final)  # after round 11's last kernel change: mla_q_skinny's standalone case; every GPU test but CuTe DSL's
  timeout 100 python3 bench/bench_k3_ops.py --batch 1 --cases mla_q_skinny --json $OUT/ops39_b1.json 2>&1 | tail -8
  set -o pipefail
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_gemv.py \
    tests/kernels/test_gemv_gluon.py tests/kernels/test_k3_model.py -k "not (variant_pairs and 64)" 2>&1 \
    | tee $OUT/gpu39_all.log | tail -4 ;;
campaign40)  # round 11, last: C64 / C64 + side_priority / C65 / C66 (2 rounds, 8 builds: no 11th position)
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C64 $C64+side_priority $C65 $C66 $C64 $C64+side_priority $C65 $C66 --json $OUT/step40.json 2>&1 | grep "B=" ;;
campaign41)  # round 12: moe_grouped_tuned's sweep (the routed chain, one call at a time); the no_pdl probe's
  # modes (kda_conv_fused, with and without forks). Then campaign41_step with the sweep's picks.
  timeout 330 python3 bench/bench_k3_ops.py --batch 1 --grouped-chain --json $OUT/ops41_b1.json 2>&1 | grep "grouped chain"
  timeout 200 python3 bench/probe_no_pdl.py --modes kda_conv_fused no_attn_forks+kda_conv_fused 2>&1 | tee $OUT/probe41.log ;;
campaign41_step)  # C64 against C68 at the sweep's picks (GU1 GU2 DN1 DN2: gate|up and down blocks), 2 rounds of 5;
  # then kda_step's conv barrier: the no_pdl probe's modes again, the plain-launch and KDA GPU tests, C64's model tests
  t="$C68@grouped="; g=768x3584; d=3584x384
  one="$t$g:$GU1 $t$d:$DN1 $t$g:$GU1/$d:$DN1 $t$g:$GU2/$d:$DN2"
  timeout 240 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C64 $one $C64 $one \
    --json $OUT/step41.json 2>&1 | grep "B="
  timeout 120 python3 bench/probe_no_pdl.py --modes kda_conv_fused 2>&1 | tee $OUT/probe41b.log
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py tests/kernels/test_k3_ops.py \
    -k "no_pdl_bitwise or kda or ((matches_reference or kernel_nodes) and c64-1)" 2>&1 \
    | tee $OUT/gpu41.log | tail -3 ;;
campaign42)  # round 12: the down GEMM's blocks near campaign41's winner (64, 64, 4, 4) in the step, 2 rounds of 5
  t="$C68@grouped=3584x384:"
  one="${t}64,64,4,4 ${t}32,64,4,4 ${t}64,64,4,3 ${t}128,64,4,4"
  timeout 240 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C64 $one $C64 $one \
    --json $OUT/step42.json 2>&1 | grep "B=" | sed 's/.*mla_q_skinny//' ;;
campaign43)  # round 12: the gate|up GEMM's blocks on C68 (the down GEMM at 64, 64, 4, 4 committed), 2 rounds of 5
  t="$C68@grouped=768x3584:"
  one="${t}64,64,4,4 ${t}64,64,4,6 ${t}32,128,4,4 ${t}64,256,4,3"
  timeout 240 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C68 $one $C68 $one \
    --json $OUT/step43.json 2>&1 | grep "B=" | sed 's/.*mla_q_skinny//' ;;
campaign44)  # round 12: C68's model GPU tests (kernel nodes, reference; B = 1), record_ab c64 c68 (carry .nsys)
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "(matches_reference or kernel_nodes) and c68" 2>&1 | tee $OUT/gpu44.log | tail -2
  bash $0 record_ab c64 c68 ;;
campaign45)  # round 12: moe_grouped_tuned's standalone case; the gate|up GEMM's blocks near the defaults on C68
  timeout 150 python3 bench/bench_k3_ops.py --batch 1 --cases moe_grouped_tuned --json $OUT/ops45_b1.json 2>&1 | grep "  "
  t="$C68@grouped=768x3584:"
  one="${t}64,128,4,5 ${t}64,128,8,4 ${t}64,128,8,6 ${t}128,64,4,6"
  timeout 240 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C68 $one $C68 $one \
    --json $OUT/step45.json 2>&1 | grep "B=" | sed 's/.*mla_q_skinny//' ;;
campaign46)  # round 12: the skinny GEMMs' configs tried in the step on C68 (each list 2 rounds of 5): the MoE
  # front's rest (TMA), the MoE up GEMM, the KDA qkvg; their tables were picked one call at a time or back to back
  for spec in "tmacfg=7168x5120:32,256,4,4 32,256,8,4 64,256,4,6 64,128,4,6" \
              "skcfg=3584x7168:32,128,4,6 64,256,4,4 64,128,8,6 128,128,8,4" \
              "skcfg=7168x6144:32,256,4,4 64,256,4,4 64,128,4,6 128,256,8,3"; do
    head=${spec%%:*}; one=""
    for c in ${spec#*:}; do one="$one $C68@$head:$c"; done
    timeout 180 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C68 $one $C68 $one \
      --json $OUT/step46_${head%%=*}_${head#*=}.json 2>&1 | grep "B=" | sed 's/.*mla_q_skinny//'
  done ;;
campaign48)  # round 12: C68's model GPU tests at B = 8 and 64 now that it applies there; then campaign47
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "(matches_reference or kernel_nodes) and (c68-8 or c68-64)" 2>&1 | tee $OUT/gpu48.log | tail -2
  bash $0 campaign47 ;;
campaign48_final)  # after round 12's kernel changes (kda_step's barrier, the down GEMM's blocks): every GPU test but CuTe DSL's
  set -o pipefail
  timeout 480 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_gemv.py \
    tests/kernels/test_gemv_gluon.py tests/kernels/test_k3_model.py -k "not (variant_pairs and 64)" 2>&1 \
    | tee $OUT/gpu48_all.log | tail -4 ;;
campaign49)  # round 12: the down GEMM's blocks around (64, 64, 4, 4) on C68 at B = 1 (2 rounds of 5) and B = 64 (2 of 4)
  t="$C68@grouped=3584x384:"
  one="${t}64,32,4,4 ${t}64,32,4,6 ${t}64,64,4,6 ${t}64,64,8,4"
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C68 $one $C68 $one \
    --json $OUT/step49.json 2>&1 | grep "B=" | sed 's/.*mla_q_skinny//'
  one="${t}64,32,4,4 ${t}128,64,4,4 ${t}64,64,4,6"
  timeout 300 python3 bench/bench_k3_step.py --batches 64 --replays 20 --variants $C68 $one $C68 $one \
    --json $OUT/step49_b64.json 2>&1 | grep "B=" | sed 's/.*mla_q_skinny//' ;;
campaign50)  # round 12: the attention residuals' column chunk and warps in the step on C68 (2 lists, 2 rounds of 5)
  t="$C68@attnres="
  for one in "${t}256,4,4 ${t}1024,4,4 ${t}512,2,2 ${t}512,8,8" "${t}1024,4,4 ${t}2048,4,4 ${t}1024,8,8 ${t}2048,8,8"; do
    timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C68 $one $C68 $one \
      --json $OUT/step50_$(echo $one | md5sum | cut -c1-6).json 2>&1 | grep "B=" | sed 's/.*moe_grouped_tuned//'
  done ;;
campaign51)  # round 12, to finish: attn_res_wide's GPU tests (its op at the K3 shapes, C69's kernel nodes and
  # reference at B = 1); C68 / C69 (3 rounds); record_ab c68 c69 (carry .nsys)
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_k3_model.py \
    -k "attn_res or ((matches_reference or kernel_nodes) and c69)" 2>&1 | tee $OUT/gpu51.log | tail -2
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C68 $C69 $C68 $C69 $C68 $C69 \
    --json $OUT/step51b.json 2>&1 | grep "B=" | sed 's/.*mla_q_skinny//'
  bash $0 record_ab c68 c69 ;;
campaign55)  # round 15, prepared: the MLA hop removals' GPU tests (ops; C69 bitwise at B = 1 and 8), the hop
  # floor, their standalone case (mla_hops). Then campaign55_step and campaign55_rec
  timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_k3_model.py \
    tests/kernels/test_gemv.py tests/kernels/test_hop_floor.py \
    -k "kv_norm_insert or query_rows or head_bmm or mla_hops or skinny_mm_k3 or hop or rmsnorm" 2>&1 | tee $OUT/gpu55.log | tail -2
  timeout 100 python3 bench/hop_floor.py --json $OUT/hops55.json 2>&1 | grep "per hop"
  timeout 200 python3 bench/bench_k3_ops.py --batch 1 --cases mla_hops --json $OUT/ops55_b1.json 2>&1 | grep "  " ;;
campaign55_step)  # round 17 ran it as two lists of two rounds: C69 / C70 / C71 / C72 / C73 unprofiled
  timeout 550 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C69 $C70 $C71 $C72 $C73 $C69 $C70 \
    $C71 $C72 $C73 $C69 $C70 $C71 $C72 $C73 --json $OUT/step55.json 2>&1 | grep "B=" | sed 's/.*attn_res_wide//' ;;
campaign55_rec)  # round 17 (ran): c69 and c72 at full depth for k3trace diff, 2 runs each, interleaved, then
  # c70 alone, 2 runs (carry .nsys; c73 was slower unprofiled, so c72 was recorded in its place)
  bash $0 record_ab c69 c72
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_c70_$r --steps 40 --variant $C70; done
  pack k3_c70 ;;
campaign56)  # round 17 (ran on C72, the kept build): C72 at B = 8 and 64 against C69 (the absorb's copy
  # applies up to B = 16, the KV norm's insert at every batch)
  timeout 200 python3 bench/bench_k3_step.py --batches 8 --replays 60 --variants $C69 $C72 $C69 $C72 $C69 $C72 \
    --json $OUT/step56_b8.json 2>&1 | grep "B=" | sed 's/.*attn_res_wide//'
  timeout 200 python3 bench/bench_k3_step.py --batches 64 --replays 20 --variants $C69 $C72 $C69 $C72 \
    --json $OUT/step56_b64.json 2>&1 | grep "B=" | sed 's/.*attn_res_wide//' ;;
campaign57)  # round 15, prepared, after campaign55: on C72, kv_a as the split-K skinny GEMM too (its cuBLAS
  # reduce kernel leaves the KV leg, for when that leg binds); V-up with the gate (mla_gate_in_v, even on
  # c57) against the o_proj with it (C73), 3 rounds
  one="$C72+triton_mla_proj@mlasub=kv_a $C72+mla_gate_in_v $C73"
  timeout 250 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $one $C72 $one $C72 $one \
    --json $OUT/step57.json 2>&1 | grep "B=" | sed 's/.*attn_res_wide//' ;;
campaign58)  # round 18: the chained kernel's and the fused pair's GPU tests (grid_barrier moved to common), the hop
  # floor with the chained forms (one launch, a grid barrier per stage), then on C72 the MoE up GEMM as the Gluon
  # GEMM that copies its first weight slots before the wait (linear_gluon's o_proj form), 2 rounds
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_hop_floor.py 2>&1 | tee $OUT/gpu58.log | tail -1
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py -k "attn_res_fused" 2>&1 \
    | tee -a $OUT/gpu58.log | tail -1
  timeout 120 python3 bench/hop_floor.py --json $OUT/hops58.json 2>&1 | grep "per hop"
  one="$C72@glsub=kda.o_proj,moe.up $C72@glsub=kda.o_proj,moe.up@glcfg=3584x7168:64,128,4,8,8"
  timeout 300 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $one $C72 $one $C72 \
    --json $OUT/step58.json 2>&1 | grep "B=" | sed 's/.*mla_kv_norm_insert//' ;;
campaign59)  # round 18: prefetch_lines' and gemm_prefetch's GPU tests (bit for bit at B = 1, 8, 64), the
  # latency window's case (o_proj -> score -> combine -> front, the front's first MB asked of L2 by the score or
  # the o_proj, bulk or per line), then on C72 the score's line form and the GEMMs' at 8 and 16 MB, 2 rounds
  timeout 150 python3 bench/bench_k3_ops.py --batch 1 --cases window_prefetch --json $OUT/ops59_b1.json 2>&1 | grep "  "
  one="$C74 $C75 $C76 $C77"
  timeout 300 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $one $C72 $one $C72 \
    --json $OUT/step59.json 2>&1 | grep "B=" | sed 's/.*mla_kv_norm_insert//'
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k "variant_pairs" 2>&1 \
    | tee $OUT/gpu59.log | tail -1 ;;
campaign60)  # round 18: on C72, the routed SiTU in the gate|up GEMM's epilogue (round ten, on c51: +0.24, the shared
  # down GEMM starved; with shared_in_up -0.06 against c53), alone, with side_priority, with shared_in_up; 2 rounds
  one="$C72+situ_in_gate_up $C72+situ_in_gate_up+side_priority $C72+situ_in_gate_up+shared_in_up"
  timeout 300 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $one $C72 $one $C72 \
    --json $OUT/step60.json 2>&1 | grep "B=" | sed 's/.*mla_kv_norm_insert//'
  # the line form's prefetch arguments now one specialisation (PF_CHUNKS -1): its variant pairs again (B = 1)
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k "variant_pairs and 1" 2>&1 \
    | tee $OUT/gpu60.log | tail -1 ;;
campaign61)  # round 19: moe_weights_ahead (the grouped GEMMs' weights before their wait, the short kernels before
  # them triggering first): its op and model GPU tests; on C72 the step alone, with the Gluon up GEMM, every
  # transition ahead (C80), and pdl_trigger_first alone for comparison, 2 rounds
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_k3_ops.py \
    -k "weights_ahead or grouped_gemm or moe_down_atomic" 2>&1 | tee $OUT/gpu61.log | tail -1
  timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k "c72_ahead" 2>&1 \
    | tee -a $OUT/gpu61.log | tail -1
  timeout 150 python3 bench/bench_k3_ops.py --batch 1 --cases moe_weights_ahead --json $OUT/ops61_b1.json 2>&1 | grep "  "
  one="$C78 $C79 $C80 $C81 $C82 $C72+pdl_trigger_first"
  timeout 300 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $one $C72 $one $C72 \
    --json $OUT/step61.json 2>&1 | grep "B=" | sed 's/.*mla_kv_norm_insert//' ;;
campaign62)  # round 20: kda_split_v (kda_step over V quarters, the norm across the head's barrier): its op and
  # model GPU tests, the standalone case (c72's step against the split one, one call and back to back), then
  # C72 / C83 (and C84, on round 19's C81) unprofiled, 2 rounds
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_k3_ops.py \
    -k "split_v or kda_step or kda_conv or sm90_compile" 2>&1 | tee $OUT/gpu62.log | tail -1
  timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k "c72_split" 2>&1 \
    | tee -a $OUT/gpu62.log | tail -1
  timeout 120 python3 bench/bench_k3_ops.py --batch 1 --cases kda_split --json $OUT/ops62_b1.json 2>&1 | grep "  "
  timeout 300 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $C83 $C84 $C72 $C83 $C84 $C72 \
    --json $OUT/step62.json 2>&1 | grep "B=" | sed 's/.*mla_kv_norm_insert//' ;;
campaign63)  # rounds 19 and 20 in one call, for a session whose device time allows one: the step first
  # (C72 / C78 / C81 / C82 / C83 / C84, 2 rounds; JSON after every build), then both rounds' model GPU
  # tests (reference and kernel nodes) for the builds that will be kept or not
  timeout 380 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants $C72 $C78 $C81 $C82 $C83 $C84 $C72 $C78 $C81 $C82 $C83 $C84 $C72 \
    --json $OUT/step63.json 2>&1 | grep "B=\|FAILED" | sed 's/.*mla_kv_norm_insert//'
  timeout 190 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "c72_ahead or c72_split" 2>&1 | tee $OUT/gpu63.log | tail -3 ;;
campaign64)  # round 21 in one call, most needed first (a cut-short call keeps what it reached): the step (C72 / C85
  # / C86, C72 first and set aside), the model GPU tests, shared_front_leg's case, then c85 and c72 at 8 layers
  # (the bundled pair; carry .nsys), each packed as soon as it is recorded. LEAN=1: C86 goes; LEAN=2: all after the tests
  if [ -n "${LEAN:-}" ]; then builds="$C72 $C85 $C87 $C72 $C85 $C87"; else builds="$C72 $C85 $C87 $C86 $C72 $C85 $C87 $C72"; fi
  timeout ${STEP_S:-240} python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $builds \
    --json $OUT/step64.json 2>&1 | grep "B=\|FAILED" | sed 's/.*mla_kv_norm_insert//'
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "c72_leg-1 or shared_front_leg" 2>&1 | tee $OUT/gpu64.log | tail -3  # with the small split form
  [ "${LEAN:-}" = 2 ] && exit 0  # LEAN=2: the step and the tests only
  timeout 60 python3 bench/bench_k3_ops.py --batch 1 --cases shared_front_leg --json $OUT/ops64_b1.json 2>&1 | grep "  "
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  for nv in c85=$C85 c72=$C72; do
    mkdir -p /tmp/rec && rm -f /tmp/rec/*
    rec k3_probe_${nv%%=*} --layers 8 --steps 30 --variant ${nv#*=}
    pack k3_probe_${nv%%=*}
  done
  # round 19's c72_ahead reference failure, one switch at a time (moe_weights_ahead, mla_o_proj_ahead)
  timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py \
    -k "c72_ahead_moe-1 or c72_ahead_mla-1" 2>&1 | tee $OUT/gpu64_ahead.log | tail -3 ;;
campaign65)  # round 22, the H200: the loaded-hop probe (the latency-bound chain alone and beside a streaming read);
  # C72 at B = 1 against its floor (4 builds, the first set aside), baseline / C72 at B = 8 and 64
  timeout 150 python3 bench/loaded_hop.py --json $OUT/loaded65.json 2>&1 | grep "per hop\|TB/s"
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $C72 $C72 $C72 \
    --json $OUT/step65.json 2>&1 | grep "B=\|FAILED" | sed 's/.*mla_kv_norm_insert//'
  timeout 120 python3 bench/bench_k3_step.py --batches 8 --replays 60 --variants baseline $C72 baseline $C72 \
    --json $OUT/step65_b8.json 2>&1 | grep "B=" | sed 's/.*mla_kv_norm_insert//'
  timeout 150 python3 bench/bench_k3_step.py --batches 64 --replays 20 --variants baseline $C72 \
    --json $OUT/step65_b64.json 2>&1 | grep "B=" | sed 's/.*mla_kv_norm_insert//' ;;
campaign66)  # round 23: the loaded-hop probe with the router chains (one and four a round); C72 / C88 at B = 1
  # (interleaved, 4 each), at B = 8; the router tests on the GPU
  timeout 150 python3 bench/loaded_hop.py --json $OUT/loaded66.json 2>&1 | grep "per hop\|TB/s\|router\|four"
  timeout 240 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $C88 $C72 $C88 $C72 $C88 \
    $C72 $C88 --json $OUT/step66.json 2>&1 | grep "B=\|FAILED" | sed 's/.*mla_kv_norm_insert//' ;;
campaign66_b8)  # round 23: C72 / C88 at B = 8; the router tests on the GPU
  timeout 120 python3 bench/bench_k3_step.py --batches 8 --replays 60 --variants $C72 $C88 $C72 $C88 \
    --json $OUT/step66_b8.json 2>&1 | grep "B=" | sed 's/.*mla_kv_norm_insert//'
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_k3_ops.py -k "router" \
    tests/kernels/test_k3_model.py::test_gpu_router_top4_bitwise 2>&1 | tail -2 ;;
campaign67)  # round 23: where the router's time goes (top-1/4/16, the align, four a round, 1-8 warps), alone
  timeout 200 python3 bench/router_parts.py --json $OUT/router67.json 2>&1 | grep "a call\|Error" ;;
campaign68)  # round 24: the router by part with the bitonic network; C72 / C88 / C89 at B = 1 (interleaved)
  timeout 200 python3 bench/router_parts.py --json $OUT/router68.json 2>&1 | grep "a call\|Error"
  timeout 360 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $C88 $C89 $C72 $C88 $C89 \
    $C72 $C88 $C89 --json $OUT/step68.json 2>&1 | grep "B=\|FAILED\|ratio\|TB/s" | sed 's/.*mla_kv_norm_insert//' ;;
campaign68_step)  # round 25: C72 / C88 / C89 at B = 1 only, two rounds (a short lease)
  timeout 300 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $C88 $C89 $C72 $C88 $C89 \
    --json $OUT/step68s.json 2>&1 | grep "B=\|FAILED\|ratio\|TB/s" | sed 's/.*mla_kv_norm_insert//' ;;
campaign69)  # round 27: C72 / C90 (moe_grouped_tma) at B = 1 x4, the routed chain's case, its GPU tests, B = 8 and 64
  set -o pipefail
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $C90 $C72 $C90 $C72 $C90 $C72 $C90 \
    --json $OUT/step69.json 2>&1 | grep "B=\|FAILED\|ratio\|TB/s" | sed 's/.*mla_kv_norm_insert//'
  timeout 90 python3 bench/bench_k3_ops.py --batch 1 --cases moe_grouped_tma --json $OUT/ops69.json 2>&1 | tail -9
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_k3_ops.py -k "grouped_gemm_tma" \
    tests/kernels/test_k3_model.py::test_gpu_moe_grouped_tma_bitwise 2>&1 | tail -2
  timeout 100 python3 bench/bench_k3_step.py --batches 8 --replays 60 --variants $C72 $C90 $C72 $C90 \
    --json $OUT/step69_b8.json 2>&1 | grep "B=\|ratio" | sed 's/.*mla_kv_norm_insert//'
  timeout 120 python3 bench/bench_k3_step.py --batches 64 --replays 20 --variants $C72 $C90 \
    --json $OUT/step69_b64.json 2>&1 | grep "B=\|ratio" | sed 's/.*mla_kv_norm_insert//' ;;
campaign69_step)  # round 27: C72 / C90 at B = 1 only, three rounds (a short lease; the H100 said +0.034 ms)
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C72 $C90 $C72 $C90 $C72 $C90 \
    --json $OUT/step69s.json 2>&1 | grep "B=\|FAILED\|ratio\|TB/s" | sed 's/.*mla_kv_norm_insert//' ;;
campaign69_rec)  # round 27: C72 and C88 at full depth, 20 steps, two runs each interleaved (carry .nsys): why C88 loses on the H200
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in ${RUNS:-a b}; do  # each pair packed as soon as it is recorded (a short lease keeps the first)
    rm -f /tmp/rec/*
    rec k3_fd_c72_$r --steps 20 --variant $C72; rec k3_fd_c88_$r --steps 20 --variant $C88
    pack fd69_$r
  done ;;
campaign68_b8)  # round 24: C72 / C89 at B = 8 and 64; the router tests on the GPU
  timeout 120 python3 bench/bench_k3_step.py --batches 8 --replays 60 --variants $C72 $C89 $C72 $C89 \
    --json $OUT/step68_b8.json 2>&1 | grep "B=\|ratio" | sed 's/.*mla_kv_norm_insert//'
  timeout 150 python3 bench/bench_k3_step.py --batches 64 --replays 20 --variants $C72 $C89 \
    --json $OUT/step68_b64.json 2>&1 | grep "B=\|ratio" | sed 's/.*mla_kv_norm_insert//'
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_k3_ops.py -k "router" \
    tests/kernels/test_k3_model.py::test_gpu_router_top4_bitwise tests/kernels/test_k3_model.py::test_gpu_router_bitonic_bitwise \
    2>&1 | tail -2 ;;
campaign68_rec)  # round 24: C72 and C89 at 8 layers, 40 steps, two runs each interleaved (carry .nsys): the diff
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in ${RUNS:-a b}; do  # each pair packed as soon as it is recorded (a short lease keeps the first)
    rm -f /tmp/rec/*
    rec k3_bs1_c72_$r --layers 8 --steps 40 --variant $C72; rec k3_bs1_c89_$r --layers 8 --steps 40 --variant $C89
    pack k3_c72_c89_$r
  done ;;
campaign65_gpu)  # round 22, the H200: every GPU test but CuTe DSL's (the last run of them all there was round 18)
  set -o pipefail
  timeout 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_hop_floor.py tests/kernels/test_loaded_hop.py \
    2>&1 | tee $OUT/gpu65_probes.log | tail -1  # not gpu-marked: on the GPU when there is one
  timeout 540 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_gemv.py \
    tests/kernels/test_gemv_gluon.py tests/kernels/test_k3_model.py -k "not (variant_pairs and 64)" 2>&1 \
    | tee $OUT/gpu65_all.log | tail -6 ;;
campaign61_rec)  # round 19: C72 and C78 at full depth with GPU metrics (200 kHz), 20 steps each, 2 runs (carry .nsys)
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  GM="--gpu-metrics-device=0 --gpu-metrics-frequency=200000"
  nb=${2:-c78}; nv=C${nb#c}
  for r in a b; do NSYS_EXTRA="$GM" rec k3_gm_c72_$r --steps 20 --variant $C72
                   NSYS_EXTRA="$GM" rec k3_gm_${nb}_$r --steps 20 --variant ${!nv}; done
  pack gm61 ;;
dram_metrics)  # round 19: nsys's GPU metrics (DRAM read/write throughput, 200 kHz) beside the kernels: the known
  # traffic of bench/dram_probe.py, C72 at full depth and at 8 layers, the HF Llama (carry .nsys)
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  $N profile --gpu-metrics-device=help 2>&1 | tail -4
  GM="--gpu-metrics-device=0 --gpu-metrics-frequency=${GM_HZ:-200000}"
  timeout 120 $N profile -t cuda,nvtx --sample=none --cpuctxsw=none $GM --capture-range=cudaProfilerApi \
    --capture-range-end=stop -f true -o /tmp/rec/dram_probe python3 bench/dram_probe.py --json /tmp/rec/dram_probe.json \
    > /tmp/rec/dram_probe.log 2>&1; echo "dram_probe rc=$? $(tail -1 /tmp/rec/dram_probe.log | cut -c1-200)"
  NSYS_EXTRA="$GM" rec k3_gm_c72 --steps ${GM_STEPS:-20} --variant $C72
  NSYS_EXTRA="$GM" rec k3_gm8_c72 --steps 30 --layers 8 --variant $C72
  timeout 200 $N profile -t cuda,nvtx --cuda-graph-trace=node --sample=none --cpuctxsw=none $GM \
    --capture-range=cudaProfilerApi --capture-range-end=stop -f true -o /tmp/rec/hf_gm_base \
    python3 -m kernels.hf_llama --steps 30 --hidden 4096 --timings-json /tmp/rec/hf_gm_base.json > /tmp/rec/hf_gm_base.log 2>&1
  echo "hf_gm_base rc=$? $(tail -1 /tmp/rec/hf_gm_base.log | cut -c1-200)"
  ls -la /tmp/rec
  pack dram_gm ;;
campaign52)  # prepared in round 12, not run: the latency-bound kernels' warps in the step on C68 (@launch=;
  # the defaults: kda_step 8, rmsnorm 8 at 4096 columns, situ_mul 4, moe_router 4, gate_mul 4), 2 rounds of 5 each
  for one in "kda_step_kernel:4 kda_step_kernel:16 rmsnorm_kernel:4 rmsnorm_kernel:16" \
             "situ_mul_kernel:8 situ_mul_kernel:2 moe_router_kernel:8 gate_mul_kernel:8"; do
    list=""
    for c in $one; do list="$list $C68@launch=$c"; done
    timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C68 $list $C68 $list \
      --json $OUT/step52_${one%%:*}.json 2>&1 | grep "B=" | sed 's/.*moe_grouped_tuned//'
  done ;;
campaign53)  # round 13: attn_res_wide's standalone case; the pair's warps at 1024 columns and qkvg at 4 warps on
  # C69 (2 rounds of 5); c68 and c69 recorded at 8 layers (the bundled pair; carry .nsys)
  timeout 150 python3 bench/bench_k3_ops.py --batch 1 --cases attn_res_wide --json $OUT/ops53_b1.json 2>&1 | grep "  "
  one="$C69@attnres=1024,2,4 $C69@attnres=1024,4,2 $C69@attnres=1024,2,2 $C69@skcfg=7168x6144:64,256,4,4"
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C69 $one $C69 $one \
    --json $OUT/step53.json 2>&1 | grep "B=" | sed 's/.*moe_grouped_tuned//'
  PROBE="c68=$C68 c69=$C69" bash $0 campaign_probe ;;
campaign54)  # round 13: attn_res_wide's case with the GEMM it releases; the wide chunk at B = 8 and 64 (@attnres
  # sets the default chunk there; attn_res_wide applies at B = 1 only), against C69; c57, c64 at 8 layers
  timeout 200 python3 bench/bench_k3_ops.py --batch 1 --cases attn_res_wide --json $OUT/ops54_b1.json 2>&1 | grep "  "
  w="$C69@attnres=1024,4,4"
  timeout 200 python3 bench/bench_k3_step.py --batches 8 --replays 60 --variants $C69 $w $C69 $w $C69 $w \
    --json $OUT/step54_b8.json 2>&1 | grep "B=" | sed 's/.*moe_grouped_tuned//'
  timeout 200 python3 bench/bench_k3_step.py --batches 64 --replays 20 --variants $C69 $w $C69 $w \
    --json $OUT/step54_b64.json 2>&1 | grep "B=" | sed 's/.*moe_grouped_tuned//'
  # mla_q_skinny at 8 layers: the combine before the skinny q_a, an edge turned programmatic (carry .nsys)
  PROBE="c57=$C57 c64=$C64" bash $0 campaign_probe ;;
campaign47)  # round 12: moe_grouped_tuned at B = 8 and 64 (measured while it applied at B = 1 only, with a
  # bench override since removed that extended it; now it applies at every batch), against C64 there
  timeout 200 python3 bench/bench_k3_step.py --batches 8 --replays 60 --variants $C64 $C68 $C64 \
    $C68 $C64 $C68 --json $OUT/step47_b8.json 2>&1 | grep "B=" | sed 's/.*mla_q_skinny//'
  timeout 200 python3 bench/bench_k3_step.py --batches 64 --replays 30 --variants $C64 $C68 $C64 \
    $C68 --json $OUT/step47_b64.json 2>&1 | grep "B=" | sed 's/.*mla_q_skinny//' ;;
pdl_probe)  # no_pdl: its GPU test; baseline / +no_pdl / C64 / C67 unprofiled (2 rounds); c64 and c67 recorded at full depth (carry .nsys)
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k "no_pdl" 2>&1 \
    | tee $OUT/gpu_pdl.log | tail -2
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 \
    --variants baseline baseline+no_pdl $C64 $C67 baseline baseline+no_pdl $C64 $C67 --json $OUT/step_pdl.json 2>&1 | grep "B="
  bash $0 record_ab c64 c67 ;;
campaign33)  # shared_in_up: the model's GPU tests; C51 / C53 / C54 (3 rounds); record_ab c51 c53 (carry .nsys)
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k "shared_in_up and not 64" 2>&1 \
    | tee $OUT/gpu33.log | tail -2
  timeout 150 python3 bench/bench_k3_step.py --batches 1 --replays 100 --variants $C51 $C53 $C54 $C51 $C53 $C54 $C51 $C53 $C54 \
    --json $OUT/step33.json 2>&1 | grep "B="
  bash $0 record_ab c51 c53 ;;
campaign33_ops)  # shared_in_up's standalone case (the up and shared down GEMMs alone, in turn, stacked)
  timeout 100 python3 bench/bench_k3_ops.py --batch 1 --cases shared_up --json $OUT/ops33_b1.json 2>&1 | tail -10 ;;
campaign24_big)  # C44 at B = 8 and 64 against C24 (B = 64: no skinny GEMM, a control); the kernel-node tests
  timeout 200 python3 bench/bench_k3_step.py --batches 8 64 --variants $C24 $C44 $C24 $C44 \
    --json $OUT/step24_b8_64.json 2>&1 | grep "B=" 
  timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_model.py -k "kernel_nodes or replay" \
    2>&1 | tee $OUT/gpu24b.log | tail -1 ;;
campaign24_final)  # after the eighth round's last kernel change: every GPU test but CuTe DSL's (variant pairs at B = 1, 8)
  set -o pipefail
  timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_gemv.py \
    tests/kernels/test_k3_model.py -k "not (variant_pairs and 64)" 2>&1 | tee $OUT/gpu24_all.log | tail -4 ;;
campaign20_big)  # C24 (linear_tma) at B = 8 and 64 against C20 (B = 64: no skinny GEMM, a control)
  timeout 300 python3 bench/bench_k3_step.py --batches 8 64 --variants $C20 $C24 $C20 $C24 \
    --json $OUT/step20_b8_64.json 2>&1 | grep "B=" ;;
record_build)  # record_build cNN: build CNN recorded at full depth (2 runs), its 8-layer fixture and c20's
  v=C${2#c}; [ -n "${!v:-}" ] || { echo "no build $v in this script"; exit 2; }
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_$2_$r --steps 40 --variant ${!v}; done
  rec k3_bs1_$2 --layers 8 --steps 40 --variant ${!v}
  rec k3_bs1_c20 --layers 8 --steps 40 --variant $C20
  pack k3_$2 ;;
record_ab)  # record_ab cOLD cNEW: the two builds recorded at full depth in one call, interleaved (2 runs each)
  o=C${2#c}; n=C${3#c}; [ -n "${!o:-}" ] && [ -n "${!n:-}" ] || { echo "no build $o or $n in this script"; exit 2; }
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for r in a b; do rec k3_full_$2_$r --steps 40 --variant ${!o}; rec k3_full_$3_$r --steps 40 --variant ${!n}; done
  pack k3_$2_$3 ;;
campaign17)  # attn_res_in_o_proj: its op and model GPU tests, C20 / C23 interleaved, C23 recorded (2 runs)
  test_time_record "o_proj_epilogue or attn_res" 17 c23 $C23 ;;
campaign13_rec)  # C22 (the sweep's config now the default): its op and model GPU tests, C20 / C22, recorded (2 runs)
  test_time_record "front_router" 13c c22 $C22 ;;
campaign7_rec)  # the kept builds recorded at full depth (2 runs each); B = 8, 64 against baseline
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for nv in c14=$C14 c15=$C15; do
    for r in a b; do rec k3_full_${nv%%=*}_$r --steps 40 --variant ${nv#*=}; done
  done
  pack k3_c14
  timeout 150 python3 bench/bench_k3_step.py --batches 8 64 --variants baseline $C14 \
    --json $OUT/step7_b8_64.json 2>&1 | grep "B=" ;;
campaign3_final)  # after the third round's last kernel change: every GPU test but CuTe DSL's
  set -o pipefail
  timeout 560 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_k3_ops.py tests/kernels/test_gemv.py \
    tests/kernels/test_k3_model.py 2>&1 | tee $OUT/gpu_all.log | tail -4 ;;
campaign_big)
  timeout 300 python3 bench/bench_k3_step.py --batches 8 64 --variants baseline ${VARIANTS:-$C4} \
    --json $OUT/step_b8_64.json 2>&1 | tee $OUT/step_b8_64.log ;;
campaign_rec)
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  i=0
  for v in baseline $C1 $C2 $C3 $C4; do
    for r in a b; do rec k3_full_c${i}_$r --steps 40 --variant $v; done
    rec k3_bs1_c$i --layers 8 --steps 40 --variant $v
    i=$((i + 1))
  done
  pack k3_campaign ;;
campaign_neg)  # the two slower changes, each alone on C3; then B = 8 and 64, baseline vs C4
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  for nv in situ=$C3+situ_fused attnres=$C3+attn_res_fused; do
    for r in a b; do rec k3_full_${nv%%=*}_$r --steps 40 --variant ${nv#*=}; done
  done
  pack k3_neg
  timeout 300 python3 bench/bench_k3_step.py --batches 8 64 --variants baseline $C4 \
    --json $OUT/step_b8_64.json 2>&1 | grep -v "attention weights" ;;
engine)
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  rec k3_vllm_inside --layers 8 --steps 40 --nvtx-style vllm
  [ "${2:-}" = both ] && rec k3_vllm_before --layers 8 --steps 40 --nvtx-style vllm --capture before
  (cd /tmp/rec && gzip -k *.qdstrm && cp *.qdstrm.gz *.json *.log "$OUT"/) ; ls -la "$OUT" ;;
stage1)
  mkdir -p /root/gpu && cp .gpu1/* /root/gpu/ && ls -la /root/gpu ;;
stage2)
  dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx && $N --version ;;
test)
  install_dsl
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
  python3 -c "import cutlass; print('cutlass dsl', cutlass.__version__)" 2>&1 | tail -1
  set -o pipefail
  timeout 420 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels --timeout 400 -rs 2>&1 \
    | tee $OUT/gpu_tests.log | tail -40
  ;;
bench)
  install_dsl
  timeout 400 python3 bench/bench_k3_step.py --json $OUT/bench_k3_step.json 2>&1 | tee $OUT/bench_k3_step.log
  # Cost of recording: the same full-depth bs1 loop with and without node-level tracing.
  mkdir -p /tmp/rec
  python3 -m kernels.record_loop --workload k3-decode --steps 100 --timings-json $OUT/unprofiled.json > /tmp/rec/u.log 2>&1
  timeout 300 $N profile -t cuda,nvtx --cuda-graph-trace=node --sample=none --cpuctxsw=none \
     --capture-range=cudaProfilerApi --capture-range-end=stop -f true -o /tmp/rec/cost \
     python3 -m kernels.record_loop --workload k3-decode --steps 100 --timings-json $OUT/profiled.json > /tmp/rec/p.log 2>&1
  cat $OUT/unprofiled.json $OUT/profiled.json ;;
record)
  install_dsl
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  L="--layers 8 --steps 40"
  rec k3_bs1_base_a $L
  rec k3_bs1_base_b $L
  rec k3_bs1_base_before $L --capture before
  rec k3_bs1_mla_split $L --variant mla_epilogue_split
  rec k3_bs1_no_attn_forks $L --variant no_attn_forks
  rec k3_bs1_router_multipass $L --variant router_multipass
  rec k3_bs1_kda_norm_separate $L --variant kda_norm_separate
  rec k3_bs1_residual_separate $L --variant residual_separate
  rec k3_bs1_delay_kda_step $L --variant delay:kda_step_kernel:3000
  rec k3_bs1_kda_cute $L --variant kda_cute
  rec k3_bs8_base $L --batch 8
  rec k3_bs8_mla_split $L --batch 8 --variant mla_epilogue_split
  pack k3_fixtures ;;
pair)
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  rec k3_full_bs1_base --steps 175
  rec k3_full_bs1_router_multipass --steps 175 --variant router_multipass
  pack k3_full_pair ;;
long)
  install_dsl
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  rec k3_full_bs1_base --steps 175
  rec k3_full_bs1_mla_split --steps 175 --variant mla_epilogue_split
  rec k3_full_bs1_no_attn_forks --steps 60 --variant no_attn_forks
  pack k3_full ;;
esac
# Stand-in ranks (issue: several ranks, on a one-GPU machine): the same K3 decode loop
# run once per rank in distinct processes with their own weights, one report each.
if [ "$phase" = ranks ]; then
  [ -x $N ] || dpkg -x .nsys/nsight-systems-target_*.deb /tmp/nx
  mkdir -p /tmp/rec && rm -f /tmp/rec/*
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv.py 2>&1 | tail -3
  timeout 200 python3 bench/bench_k3_step.py --batches 1 --json $OUT/bench_bs1.json 2>&1 | tail -3
  for r in 0 1; do rec k3_rank$r --layers 8 --steps 30 --seed $r; done
  pack k3_ranks
fi

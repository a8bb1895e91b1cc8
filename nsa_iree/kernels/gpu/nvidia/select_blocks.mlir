// NSA's top-n block selection on NVIDIA GPUs (docs/semantics.md, 'The compression branch and block selection'),
// fused with its scores: no [M, C] tensor in memory. Here T is S, the output slots (at most 32: one per lane), and
// BS the compression's block size, also the tile of compressed keys staged at a time.
//
// Row m at p = pos(m) = m + N - M owns block own = p // BS. Its ranking: the forced blocks own, own - 1 (when
// >= 0), 0 (each once), then the scored blocks c = 1 .. own - 2 by descending score, equal scores to the lower id,
// NaN last; it keeps the first count = clamp(counts[b, m, g], 0, S) of them (none when p < 0), -1 in the other
// slots. The score of c is the sum over the group's heads of exp(scale q . k_cmp[c] - lse) (the mean without
// its division by HPG, which cannot change the ranking; as the CPU kernel, kernels/cpu/select_blocks.mlir).
//
// One workgroup per (DENSE_SUBGROUPS rows, g, b); subgroup w takes row m = DENSE_SUBGROUPS x tile + w, its HPG = 16
// heads the 16 rows of the mma fragments. The compressed keys stream through workgroup memory in tiles of BS (the
// K/V pipeline with K alone, gpu/nvidia/kv_staging.mlir), up to the last scored key of the workgroup's last row.
// Per 16 keys: s = q k^T on the matrix units, p = 2^(s scale log2 e - lse log2 e) per (head, key), summed over the
// heads (the two rows of a lane, then across the 8 lanes of a column: a fixed order, so the same inputs give the
// same scores). The kept blocks are a list sorted by (score desc, id asc), lane l holding entry l: candidates come
// in increasing id, and one enters where fewer than `keep` kept ones score >= it (so an equal score stays behind
// the lower id), shifting the list down a lane; with the list full, a candidate not above its last score is
// dropped by one comparison. A NaN score is kept as -1, below every score (>= 0).
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/host.mlir" as host %>
<% import "common/rules.mlir" as rules %>
<% import "gpu/nvidia/kernel.mlir" as nv %>

// Push constants: B, M, N (i32), then the bits of scale (f32).
<% set kcmp = ("k", "memref<?x?x" ~ G ~ "x" ~ D ~ "x" ~ E ~ ">{%batch, %num_blocks}", "k_cmp [B, C, G, D]") %>
<% set inputs = ['q', kcmp, 'lse', ("counts", "memref<?x?x" ~ G ~ "xi32>{%batch, %m_rows}", "block_counts [B, M, G] i32")] %>
<% set outputs = ['block_indices'] %>
${ dispatch.layout("select_nvidia_layout", 4, inputs, outputs) }

${ nv.kv_types(G_D, G_DV, DQ_STAGES) }
!sel_smem = memref<${SELECT_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
// Per-lane fragments.
${ nv.fragment_types(D_STEPS) }
<% set dqk = dict(nv.types, kind=MMA_KIND) %>

<% call dispatch.executable("select_blocks_nvidia_exe", "select_blocks_nvidia_rows", "select_nvidia_layout", ['row_tiles', 'kv_heads', 'batch'], lanes=DENSE_LANES) %>
${ nv.func_open("select_blocks_nvidia_rows", DENSE_LANES, SUBGROUP_SIZE, 1) }
${ nv.constants(["c0", "c1", "c2", "c3", "c4", "c8", "c16", "c1_i32", "c2_i32", "c4_i32", "c8_i32", "c16_i32", "c32_i32", "zero", "log2e"]) }
      %nan_key = arith.constant -1.0 : f32         // a NaN score's place: below every score
      %empty_key = arith.constant -2.0 : f32       // an empty slot of the kept list: below every candidate
      %minus_one = arith.constant -1 : index
      %minus_one_i32 = arith.constant -1 : i32
      %zero_pair = arith.constant dense<0.0> : vector<2x${E}>
${ nv.constants([("heads_per_group", HPG), ("block_size", BS), ("subgroups", DENSE_SUBGROUPS), ("subtiles", DENSE_SUBTILES), ("slots_out", T)]) }
${ nv.copy_constants(DENSE_LANES, SUBGROUP_SIZE, D_CHUNKS, DV_CHUNKS, K_STAGE_ITEMS, V_STAGE_ITEMS, DENSE_K_STAGE_PER_LANE, DENSE_V_STAGE_PER_LANE) }
      %d_steps = arith.constant ${D_STEPS} : index
${ nv.stage_constants(none, DQ_STAGES, DQ_STAGES_MINUS_1, K_SWIZZLE_MASK, V_SWIZZLE_MASK, K_SWIZZLE_HIGH, V_SWIZZLE_HIGH) }

${ dispatch.ids(['row_tile', 'g', 'b']) }
${ dispatch.push_constants("select_nvidia_layout", ['batch', 'm_rows', 'n', 'scale']) }
      %scale_log2 = arith.mulf %scale, %log2e : f32
      %num_blocks = arith.ceildivui %n, %block_size : index
${ dispatch.bindings("select_nvidia_layout", inputs, outputs) }

      %smem = memref.alloc() : !sel_smem
      %k_rows = memref.view %smem[%c0][] : !sel_smem to !dqk_k_rows

${ nv.lane_ids() }
      %r8 = arith.addi %r, %c8 : index
      %h0 = arith.muli %g, %heads_per_group : index
      %head_0 = arith.addi %h0, %r : index
      %head_1 = arith.addi %h0, %r8 : index
      %tile_m0 = arith.muli %row_tile, %subgroups : index
      %m_in = arith.addi %tile_m0, %subgroup : index
      %row_valid = arith.cmpi ult, %m_in, %m_rows : index
      %last_m = arith.subi %m_rows, %c1 : index
      %m = arith.minui %m_in, %last_m : index          // (a row past M reads row M - 1 and writes nothing)
      // (q_fragments' row tests: every head of the group is real; a row past M loads row M - 1)
      %head_valid_0 = arith.constant true
      %head_valid_1 = arith.constant true

      // pos(m), own = pos // BS, count, the forced blocks and how many scored ones are kept (keep), the last
      // scored candidate own - 2 (-1: none scored).
      ${ rules.offset() }
      ${ rules.position("row_pos", "m") }
      ${ rules.last_block("own", "row_pos") }
      %count_i32 = memref.load %counts[%b, %m, %g] : memref<?x?x${G}xi32>
      %count_raw = arith.index_cast %count_i32 : i32 to index
      %count_low = arith.maxsi %count_raw, %c0 : index
      %count_s = arith.minsi %count_low, %slots_out : index
      %seen = arith.cmpi sge, %row_pos, %c0 : index
      %counted = arith.andi %seen, %row_valid : i1
      %row_count = arith.select %counted, %count_s, %c0 : index
      %own_next = arith.addi %own, %c1 : index
      %own_blocks = arith.maxsi %own_next, %c0 : index
      %forced_all = arith.minsi %own_blocks, %c3 : index
      %forced = arith.minsi %forced_all, %row_count : index
      %keep = arith.subi %row_count, %forced : index
      %some = arith.cmpi sgt, %keep, %c0 : index
      %own_before = arith.subi %own, %c2 : index
      %subgroup_pos = arith.select %some, %own_before, %minus_one : index
      // The workgroup's last scored key (its last row's own - 2; kv_staging's %pos), last tile and steps.
      %tile_m_end0 = arith.addi %tile_m0, %subgroups : index
      %tile_m_end1 = arith.subi %tile_m_end0, %c1 : index
      %tile_m_end = arith.minui %tile_m_end1, %last_m : index
      ${ rules.position("tile_pos", "tile_m_end") }
      ${ rules.last_block("tile_own", "tile_pos") }
      %pos = arith.subi %tile_own, %c2 : index
      ${ rules.last_block("last_visible_block") }
      %tiles_seen = arith.addi %last_visible_block, %c1 : index
      %slots = arith.maxsi %tiles_seen, %c0 : index
      %steps = arith.addi %slots, %lag : index

      // q of the row's 16 heads as lhs fragments over all of D, and each lane's two heads' lse (base 2).
      <% set q_rows = ("%m", "%m") %>
      <% include "gpu/nvidia/q_fragments.mlir" %>
      %lse_0 = memref.load %lse[%b, %head_0, %m] : memref<?x${H}x?xf32>
      %lse_1 = memref.load %lse[%b, %head_1, %m] : memref<?x${H}x?xf32>
      %lse2_0 = arith.mulf %lse_0, %log2e : f32
      %lse2_1 = arith.mulf %lse_1, %log2e : f32
      %neg_lse2_0 = arith.negf %lse2_0 : f32
      %neg_lse2_1 = arith.negf %lse2_1 : f32

${ nv.ldmatrix_lanes() }
      %score_lane_row = arith.addi %hi8, %matrix_row : index
      %lane_i32 = arith.index_cast %lane : index to i32
      %keep_i32 = arith.index_cast %keep : index to i32
      %last_kept = arith.subi %keep_i32, %c1_i32 : i32

      // The kept list: lane l holds entry l (score, id), empty slots %empty_key; %filled entries, %threshold the
      // score a candidate must pass once the list is full (else %empty_key: every candidate enters).
      %kept_init_id = arith.constant -1 : i32
      %kept_score, %kept_id, %filled, %threshold = scf.for %t = %c0 to %steps step %c1
          iter_args(%ks_tile = %empty_key, %ki_tile = %kept_init_id, %filled_tile = %c0, %th_tile = %empty_key)
          -> (f32, i32, index, f32) {
        <% set staged_block, staged_values = nv.next_tile, false %>
        <% include "gpu/nvidia/kv_staging.mlir" %>
${ nv.previous("%slot") }
        %key0 = arith.muli %slot, %block_size : index
        %sees = arith.cmpi sle, %key0, %subgroup_pos : index
        %compute = arith.andi %sees, %has_previous : i1
        %ks_next, %ki_next, %filled_next, %th_next = scf.if %compute -> (f32, i32, index, f32) {
          %to_pos = arith.subi %subgroup_pos, %key0 : index
          %keys = arith.addi %to_pos, %c1 : index
          %key_steps0 = arith.ceildivui %keys, %c16 : index
          %key_steps = arith.minui %key_steps0, %subtiles : index
          %ks_j, %ki_j, %filled_j, %th_j = scf.for %key_step = %c0 to %key_steps step %c1
              iter_args(%ks = %ks_tile, %ki = %ki_tile, %filled_in = %filled_tile, %th = %th_tile) -> (f32, i32, index, f32) {
            %key_base = arith.muli %key_step, %c16 : index
            %score_row = arith.addi %key_base, %score_lane_row : index
            %score_row_bits = arith.andi %score_row, %k_swizzle_mask : index
            %score_swizzle_k = arith.muli %score_row_bits, %c8 : index
            %scores_zero = arith.constant dense<0.0> : !dqk_scores
${ nv.score_steps("%s_acc", "%d_steps", "%scores_zero", "%q_frags", "!dqk_q_frags", "%k_rows", "!dqk_k_rows", "%buffer", "%score_row", "%k_swizzle_high", "%lo8", "%score_swizzle_k", dqk) }
            // The lane's 4 candidates key_base + 8 tile + 2 c + e: p of its two heads, then the sum over the 8
            // lanes of column c (xor over r: lanes 4 r + c); NaN to %nan_key.
<% for tile in ["0", "1"] %>
<% for e in ["0", "1"] %>
            %s0_${tile}${e} = vector.extract %s_acc[0, ${tile}, 0, ${e}] : f32 from !dqk_scores
            %s1_${tile}${e} = vector.extract %s_acc[0, ${tile}, 1, ${e}] : f32 from !dqk_scores
            %x0_${tile}${e} = math.fma %s0_${tile}${e}, %scale_log2, %neg_lse2_0 : f32
            %x1_${tile}${e} = math.fma %s1_${tile}${e}, %scale_log2, %neg_lse2_1 : f32
            %p0_${tile}${e} = ${EX2} %x0_${tile}${e} : (f32) -> f32
            %p1_${tile}${e} = ${EX2} %x1_${tile}${e} : (f32) -> f32
            %v_${tile}${e} = arith.addf %p0_${tile}${e}, %p1_${tile}${e} : f32
<% for shift, before in [("4", ""), ("8", "_s4"), ("16", "_s8")] %>
            %v_${tile}${e}_x${shift}, %v_${tile}${e}_ok${shift} = gpu.shuffle xor %v_${tile}${e}${before}, %c${shift}_i32, %c32_i32 : f32
            %v_${tile}${e}_s${shift} = arith.addf %v_${tile}${e}${before}, %v_${tile}${e}_x${shift} : f32
<% endfor %>
            %nan_${tile}${e} = arith.cmpf uno, %v_${tile}${e}_s16, %v_${tile}${e}_s16 : f32
            %score_${tile}${e} = arith.select %nan_${tile}${e}, %nan_key, %v_${tile}${e}_s16 : f32
<% endfor %>
<% endfor %>
            // The 16 candidates in increasing id: candidate 8 tile + 2 c + e from lane c (r = 0), scored iff
            // 1 <= id <= own - 2.
            %cand_base = arith.addi %key0, %key_base : index
<% set ns = namespace(ks="%ks", ki="%ki", filled="%filled_in", th="%th") %>
<% for kk in range(16) %>
<% set tile, c, e = kk // 8, (kk % 8) // 2, kk % 2 %>
            %cand_offset_${kk} = arith.constant ${kk} : index
            %cand_${kk} = arith.addi %cand_base, %cand_offset_${kk} : index
            %from_${kk} = arith.constant ${c} : i32
            %score_src_${kk}, %score_ok_${kk} = gpu.shuffle idx %score_${tile}${e}, %from_${kk}, %c32_i32 : f32
            %scored_lo_${kk} = arith.cmpi sge, %cand_${kk}, %c1 : index
            %scored_hi_${kk} = arith.cmpi sle, %cand_${kk}, %subgroup_pos : index
            %scored_${kk} = arith.andi %scored_lo_${kk}, %scored_hi_${kk} : i1
            %passes_${kk} = arith.cmpf ogt, %score_src_${kk}, ${ns.th} : f32
            %enters_${kk} = arith.andi %scored_${kk}, %passes_${kk} : i1
            %ks_${kk}, %ki_${kk}, %filled_${kk}, %th_${kk} = scf.if %enters_${kk} -> (f32, i32, index, f32) {
              // Its place: the kept entries scoring >= it stay ahead (they have lower ids), counted over the lanes.
              %ahead = arith.cmpf oge, ${ns.ks}, %score_src_${kk} : f32
              %ahead_i32 = arith.extui %ahead : i1 to i32
<% for shift, before in [("1", ""), ("2", "_1"), ("4", "_2"), ("8", "_4"), ("16", "_8")] %>
              %ahead_x${shift}, %ahead_ok${shift} = gpu.shuffle xor %ahead_i32${before}, %c${shift}_i32, %c32_i32 : i32
              %ahead_i32_${shift} = arith.addi %ahead_i32${before}, %ahead_x${shift} : i32
<% endfor %>
              %cand_i32 = arith.index_cast %cand_${kk} : index to i32
              %up_score, %up_ok = gpu.shuffle up ${ns.ks}, %c1_i32, %c32_i32 : f32
              %up_id, %up_ok2 = gpu.shuffle up ${ns.ki}, %c1_i32, %c32_i32 : i32
              %below = arith.cmpi sgt, %lane_i32, %ahead_i32_16 : i32
              %here = arith.cmpi eq, %lane_i32, %ahead_i32_16 : i32
              %in_list = arith.cmpi slt, %lane_i32, %keep_i32 : i32
              %moved_score = arith.select %below, %up_score, ${ns.ks} : f32
              %moved_id = arith.select %below, %up_id, ${ns.ki} : i32
              %new_score0 = arith.select %here, %score_src_${kk}, %moved_score : f32
              %new_id0 = arith.select %here, %cand_i32, %moved_id : i32
              %new_score = arith.select %in_list, %new_score0, %empty_key : f32
              %new_id = arith.select %in_list, %new_id0, %minus_one_i32 : i32
              %grown = arith.addi ${ns.filled}, %c1 : index
              %filled_new = arith.minui %grown, %keep : index
              // Full: the last kept score is the bar (lane keep - 1's), else every candidate enters.
              %full = arith.cmpi eq, %filled_new, %keep : index
              %last_score, %last_ok = gpu.shuffle idx %new_score, %last_kept, %c32_i32 : f32
              %th_new = arith.select %full, %last_score, %empty_key : f32
              scf.yield %new_score, %new_id, %filled_new, %th_new : f32, i32, index, f32
            } else {
              scf.yield ${ns.ks}, ${ns.ki}, ${ns.filled}, ${ns.th} : f32, i32, index, f32
            }
<% set ns.ks, ns.ki, ns.filled, ns.th = "%ks_" ~ kk, "%ki_" ~ kk, "%filled_" ~ kk, "%th_" ~ kk %>
<% endfor %>
            scf.yield ${ns.ks}, ${ns.ki}, ${ns.filled}, ${ns.th} : f32, i32, index, f32
          }
          scf.yield %ks_j, %ki_j, %filled_j, %th_j : f32, i32, index, f32
        } else {
          scf.yield %ks_tile, %ki_tile, %filled_tile, %th_tile : f32, i32, index, f32
        }
        // The next iteration stages into the buffer just read.
        gpu.barrier
        scf.yield %ks_next, %ki_next, %filled_next, %th_next : f32, i32, index, f32
      }

      // Slot t (lane t): the forced blocks (own, own - 1, 0), then kept entry t - forced, then -1.
      %own_i32 = arith.index_cast %own : index to i32
      %scored_slots = arith.addi %forced, %filled : index
      %forced_i32 = arith.index_cast %forced : index to i32
      %from_kept = arith.subi %lane_i32, %forced_i32 : i32
      %kept_here, %kept_ok = gpu.shuffle idx %kept_id, %from_kept, %c32_i32 : i32
      %t_out = arith.index_cast %lane_i32 : i32 to index
      %is_slot = arith.cmpi ult, %t_out, %slots_out : index
      %writes = arith.andi %is_slot, %row_valid : i1
      scf.if %writes {
        %is_forced = arith.cmpi slt, %t_out, %forced : index
        %is_kept = arith.cmpi slt, %t_out, %scored_slots : index
        %first_two = arith.cmpi slt, %t_out, %c2 : index
        %before = arith.subi %own_i32, %lane_i32 : i32
        %zero_i32 = arith.constant 0 : i32
        %forced_id = arith.select %first_two, %before, %zero_i32 : i32
        %other = arith.select %is_kept, %kept_here, %minus_one_i32 : i32
        %id = arith.select %is_forced, %forced_id, %other : i32
        memref.store %id, %block_indices[%b, %m, %g, %t_out] : memref<?x?x${G}x${T}xi32>
      }
      return
    }
<% endcall %>

// Host side: one dispatch per DENSE_SUBGROUPS query rows, block_indices written into the caller's tensor.
${ host.select_blocks("select_blocks_nvidia_exe", "select_blocks_nvidia_rows", DENSE_SUBGROUPS, inputs, outputs) }

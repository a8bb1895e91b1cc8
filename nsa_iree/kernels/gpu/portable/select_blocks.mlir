// NSA's top-n block selection as a portable matrix-unit kernel (docs/semantics.md, 'The compression branch and
// block selection'), fused with its scores: no [M, C] tensor in memory. One text for every intrinsic (MFMA on
// gfx950 and gfx942, mma.sync on NVIDIA); only the unit's fragment shapes and placement maps differ
// (nsa_iree/fragments.py: Unit, pinned by tests/test_fragments.py). Here T is S, the output slots (at most 32: one
// lane each), and BS the compression's block size.
//
// Takes q [B, M, H, D], k_cmp [B, C, G, D] (C = ceil(N / BS)), lse [B, H, M] f32 (compressed_attention's), counts
// [B, M, G] i32 and n = N; defines block_indices [B, M, G, S] i32. The ranking is the NVIDIA kernel's
// (gpu/nvidia/select_blocks.mlir): row m at p = pos(m) = m + N - M owns block own = p // BS; its forced blocks own,
// own - 1 (when >= 0), 0 (each once), then the scored blocks c = 1 .. own - 2 by descending score, equal scores to
// the lower id, NaN last; it keeps the first count = clamp(counts[b, m, g], 0, S) of them (none when p < 0), -1 in
// the other slots. The score of c is the sum over the group's heads of exp(scale q . k_cmp[c] - lse) (the mean
// without its division by HPG, which cannot change the ranking; as the CPU and NVIDIA kernels).
//
// One workgroup per (SELECT_SUBGROUPS query rows, g, b); subgroup w takes row m = SELECT_SUBGROUPS x tile + w, its
// HPG heads the rows of one unit (heads past HPG, up to 16, are zeros and score nothing). The compressed keys come in
// tiles of SELECT_TILE_KEYS, up to the last scored key of the workgroup's last row: iteration t loads tile t from
// global memory into registers (16-byte chunks, consecutive lanes along a key's D), scores tile t - 1 from workgroup
// memory, then stores tile t there as rows [key][d], D contiguous, so a lane reads an rhs fragment as RUNS vectors of
// RUN elements (MFMA 16x16x32: one 16-byte read). Per 16 keys of a tile, for each row whose scored keys reach them:
//   s = q k^T        [16 heads x 16 keys] over D / K units; q's lhs fragments in registers, loaded once
//   p = 2^(s scale log2 e - lse log2 e) per (head, key), 0 for padding heads
//   score = sum over the heads of p: a lane's elements of one column in index order, then over the lanes holding
//           that column (xor shuffles at fixed distances): a fixed order, so the same inputs give the same scores
// The kept blocks are a list sorted by (score desc, id asc), lane l holding entry l: candidates come in increasing
// id (candidate c of a unit from the lane and element holding its column, ACC_COL_LANE_MAP / ACC_COL_INDEX_MAP), and
// one enters where fewer than `keep` kept ones score >= it (so an equal score stays behind the lower id), shifting
// the list down a lane; with the list full, a candidate not above its last score is dropped by one comparison. A
// NaN score is kept as -1, below every score (>= 0). Lane t < S writes slot t.
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/host.mlir" as host %>
<% import "common/rules.mlir" as rules %>
<% import "gpu/portable/units.mlir" as units %>
<% set u = {'p': 'selp', 'kind': MMA_KIND, 'run': RUN, 'runs': RUNS, 'acc_n': ACC_N, 'lhs': LHS_UNIT, 'rhs': RHS_UNIT, 'acc': ACC_UNIT, 'maps': [RUN_MAJOR_MAP, RUN_K_MAP, ACC_ROW_MAP, ACC_COL_MAP]} %>

// Push constants: B, M, N (i32), then the bits of scale (f32).
<% set kcmp = ("k_cmp", "memref<?x?x" ~ G ~ "x" ~ D ~ "x" ~ E ~ ">{%batch, %num_blocks}", "k_cmp [B, C, G, D]") %>
<% set inputs = ['q', kcmp, 'lse', ("counts", "memref<?x?x" ~ G ~ "xi32>{%batch, %m_rows}", "block_counts [B, M, G] i32")] %>
<% set outputs = ['block_indices'] %>
${ dispatch.layout("select_portable_layout", 4, inputs, outputs) }

${ units.types(u) }
!selp_smem = memref<${SELECT_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
// The staged tile: ${SELECT_TILE_KEYS} compressed keys as rows [key][d], padded by ${PAD} elements.
!selp_k_rows = memref<${SELECT_TILE_KEYS}x${D_PADDED}x${E}, #gpu.address_space<workgroup>>
!selp_q_units = vector<${D_UNITS}x${RUNS}x${RUN}x${E}>
!selp_k_staged = vector<${SELECT_K_ITEMS_PER_LANE}x8x${E}>
!selp_acc_mask = vector<${ACC_N}xi1>
// Column c of a unit's accumulator, row 0: the lane holding it and the element there.
#selp_col_lane = ${ACC_COL_LANE_MAP}
#selp_col_index = ${ACC_COL_INDEX_MAP}

<# %key_row and %d0: the key (row of the tile) and first element of staged chunk %c (key c / (D / 8), elements
   8 (c mod (D / 8)) ..). #>
<% macro chunk_place() %>
%key_row = arith.divui %c, %d_chunks : index
%chunk = arith.remui %c, %d_chunks : index
%d0 = arith.muli %chunk, %c8 : index
<% endmacro %>

<# out (!selp_acc_flat): at element i holding (row 0, column c) of its lane (i = ACC_COL_INDEX_MAP(c)), the sum of
   `values` (!selp_acc_flat) over column c: this lane's elements of the column in index order, then over the lanes
   holding it (xor shuffles at distances COL_SHUFFLE_STRIDE, 2 COL_SHUFFLE_STRIDE, ..); zeros at the other elements.
   Every lane holding the column gets the same sum. #>
<% macro column_sums(out, values) %>
${out} = scf.for %i = %c0 to %acc_n step %c1 iter_args(%sums = %zeros) -> (!selp_acc_flat) {
  %col_i = affine.apply #selp_acc_col(%c0, %i)
  %first_i = affine.apply #selp_col_index(%col_i)
  %holds = arith.cmpi eq, %first_i, %i : index
  %with_i = scf.if %holds -> (!selp_acc_flat) {
    %in_lane = scf.for %i2 = %c0 to %acc_n step %c1 iter_args(%sum = %zero) -> (f32) {
      %col_i2 = affine.apply #selp_acc_col(%c0, %i2)
      %same = arith.cmpi eq, %col_i, %col_i2 : index
      %x = vector.extract ${values}[%i2] : f32 from !selp_acc_flat
      %plus = arith.addf %sum, %x : f32
      %next = arith.select %same, %plus, %sum : f32
      scf.yield %next : f32
    } {unroll_loop}
    %total = scf.for %sh = %c0 to %col_shuffles step %c1 iter_args(%s = %in_lane) -> (f32) {
      %sh_i32 = arith.index_cast %sh : index to i32
      %distance = arith.shli %col_stride, %sh_i32 : i32
      %theirs, %valid = gpu.shuffle xor %s, %distance, %width : f32
      %both = arith.addf %s, %theirs : f32
      scf.yield %both : f32
    } {unroll_loop}
    %next = vector.insert %total, %sums[%i] : f32 into !selp_acc_flat
    scf.yield %next : !selp_acc_flat
  } else {
    scf.yield %sums : !selp_acc_flat
  }
  scf.yield %with_i : !selp_acc_flat
} {unroll_loop}
<% endmacro %>

<# The kept list (%ks, %ki, %filled_in: lane l's entry l and the entries filled) with candidate %cand of score
   %score entered: yields the new entry of this lane, the entries filled and the bar (%empty_key until full). #>
<% macro enter() %>
// Its place: the kept entries scoring >= it stay ahead (they have lower ids), counted over the lanes.
%ahead = arith.cmpf oge, %ks, %score : f32
%ahead_i32 = arith.extui %ahead : i1 to i32
%ahead_count = scf.for %sh = %c0 to %lane_shuffles step %c1 iter_args(%count_in = %ahead_i32) -> (i32) {
  %sh_i32 = arith.index_cast %sh : index to i32
  %distance = arith.shli %c1_i32, %sh_i32 : i32
  %theirs, %valid = gpu.shuffle xor %count_in, %distance, %width : i32
  %count_out = arith.addi %count_in, %theirs : i32
  scf.yield %count_out : i32
} {unroll_loop}
%cand_i32 = arith.index_cast %cand : index to i32
%up_score, %up_score_ok = gpu.shuffle up %ks, %c1_i32, %width : f32
%up_id, %up_id_ok = gpu.shuffle up %ki, %c1_i32, %width : i32
%below = arith.cmpi sgt, %lane_i32, %ahead_count : i32
%here = arith.cmpi eq, %lane_i32, %ahead_count : i32
%in_list = arith.cmpi slt, %lane_i32, %keep_i32 : i32
%moved_score = arith.select %below, %up_score, %ks : f32
%moved_id = arith.select %below, %up_id, %ki : i32
%new_score0 = arith.select %here, %score, %moved_score : f32
%new_id0 = arith.select %here, %cand_i32, %moved_id : i32
%new_score = arith.select %in_list, %new_score0, %empty_key : f32
%new_id = arith.select %in_list, %new_id0, %minus_one_i32 : i32
%grown = arith.addi %filled_in, %c1 : index
%filled_new = arith.minui %grown, %keep : index
// Full: the last kept score is the bar (lane keep - 1's), else every candidate enters.
%full = arith.cmpi eq, %filled_new, %keep : index
%last_score, %last_ok = gpu.shuffle idx %new_score, %last_kept, %width : f32
%th_new = arith.select %full, %last_score, %empty_key : f32
scf.yield %new_score, %new_id, %filled_new, %th_new : f32, i32, index, f32
<% endmacro %>

<% call dispatch.executable("select_blocks_portable_exe", "select_blocks_portable_rows", "select_portable_layout", ['row_tiles', 'kv_heads', 'batch'], lanes=SELECT_LANES) %>
${ units.func_begin("select_blocks_portable_rows", SELECT_LANES, SUBGROUP_SIZE) }
      ${ units.index_constants({"c0": 0, "c1": 1, "c2": 2, "c3": 3, "c8": 8, "c16": 16}) }
      ${ units.index_constants({"heads_per_group": HPG, "block_size": BS, "slots_out": T, "subgroups": SELECT_SUBGROUPS,
          "lanes": SELECT_LANES, "subgroup_size": SUBGROUP_SIZE, "unit_k": UNIT_K, "runs": RUNS, "acc_n": ACC_N,
          "d_units": D_UNITS, "d_chunks": D_CHUNKS, "tile_keys": SELECT_TILE_KEYS, "key_steps": SELECT_KEY_STEPS,
          "k_chunks": SELECT_K_ITEMS, "k_per_lane": SELECT_K_ITEMS_PER_LANE, "col_shuffles": COL_SHUFFLES,
          "lane_shuffles": LANE_SHUFFLES}) }
      %c0_i32 = arith.constant 0 : i32
      %c1_i32 = arith.constant 1 : i32
      %minus_one = arith.constant -1 : index
      %minus_one_i32 = arith.constant -1 : i32
      %width = arith.constant ${SUBGROUP_SIZE} : i32
      %col_stride = arith.constant ${COL_SHUFFLE_STRIDE} : i32
      %zero = arith.constant 0.0 : f32
      %zeros = arith.constant dense<0.0> : !selp_acc_flat
      %log2e = arith.constant 1.44269504 : f32
      %nan_keys = arith.constant dense<-1.0> : !selp_acc_flat     // a NaN score's place: below every score
      %empty_key = arith.constant -2.0 : f32       // an empty entry of the kept list: below every candidate
      ${ units.zero_reads(u) }

${ dispatch.ids(['row_tile', 'g', 'b']) }
${ dispatch.push_constants("select_portable_layout", ['batch', 'm_rows', 'n', 'scale']) }
      %scale_log2 = arith.mulf %scale, %log2e : f32
      %scale_log2_e = vector.broadcast %scale_log2 : f32 to !selp_acc_flat
      %num_blocks = arith.ceildivui %n, %block_size : index
${ dispatch.bindings("select_portable_layout", inputs, outputs) }

      ${ units.views("!selp_smem", [("k_rows", 0, "!selp_k_rows")]) }

      %tid = gpu.thread_id x
      %subgroup = arith.divui %tid, %subgroup_size : index
      %lane = arith.remui %tid, %subgroup_size : index
      %lane_i32 = arith.index_cast %lane : index to i32
      %h0 = arith.muli %g, %heads_per_group : index
      %tile_m0 = arith.muli %row_tile, %subgroups : index
      %m_in = arith.addi %tile_m0, %subgroup : index
      %row_valid = arith.cmpi ult, %m_in, %m_rows : index
      %last_m = arith.subi %m_rows, %c1 : index
      %m = arith.minui %m_in, %last_m : index          // (a row past M reads row M - 1 and writes nothing)

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
      %last_scored = arith.select %some, %own_before, %minus_one : index
      %keep_i32 = arith.index_cast %keep : index to i32
      %last_kept = arith.subi %keep_i32, %c1_i32 : i32
      // The workgroup's last scored key (its last row's own - 2) and its tiles; one step more for the lag.
      %tile_m_end0 = arith.addi %tile_m0, %subgroups : index
      %tile_m_end1 = arith.subi %tile_m_end0, %c1 : index
      %tile_m_end = arith.minui %tile_m_end1, %last_m : index
      ${ rules.position("tile_pos", "tile_m_end") }
      ${ rules.last_block("tile_own", "tile_pos") }
      %tile_last_scored = arith.subi %tile_own, %c2 : index
      %scored_keys = arith.addi %tile_last_scored, %c1 : index
      %tiles_raw = arith.ceildivsi %scored_keys, %tile_keys : index
      %tiles = arith.maxsi %tiles_raw, %c0 : index
      %steps = arith.addi %tiles, %c1 : index

      // q of the row's heads as lhs fragments over all of D: read j of unit u is head run_major(l, j), columns
      // u K + run_k(l, j) ...; padding heads (>= HPG) are zeros.
${ units.head_units("%q_units", "%d_units", "!selp_q_units", "%q", "!selp_q", u) }
      // -lse log2 e of the head of each accumulator element (0 for padding heads, whose p is masked), and the mask.
      %lse_init = arith.constant dense<0.0> : !selp_acc_flat
      %mask_init = arith.constant dense<false> : !selp_acc_mask
      %neg_lse2_e, %head_real_e = scf.for %i = %c0 to %acc_n step %c1 iter_args(%l_acc = %lse_init, %r_acc = %mask_init)
          -> (!selp_acc_flat, !selp_acc_mask) {
        %h = affine.apply #selp_acc_row(%lane, %i)
        %real = arith.cmpi ult, %h, %heads_per_group : index
        %head = arith.addi %h0, %h : index
        %l = scf.if %real -> (f32) {
          %x = memref.load %lse[%b, %head, %m] : memref<?x${H}x?xf32>
          scf.yield %x : f32
        } else {
          scf.yield %zero : f32
        }
        %l2 = arith.mulf %l, %log2e : f32
        %neg_l2 = arith.negf %l2 : f32
        %l_next = vector.insert %neg_l2, %l_acc[%i] : f32 into !selp_acc_flat
        %r_next = vector.insert %real, %r_acc[%i] : i1 into !selp_acc_mask
        scf.yield %l_next, %r_next : !selp_acc_flat, !selp_acc_mask
      } {unroll_loop}

      // The kept list: lane l holds entry l (score, id), empty entries %empty_key; %filled entries, %threshold the
      // score a candidate must pass once the list is full (else %empty_key: every candidate enters).
      %k_none = arith.constant dense<0.0> : !selp_k_staged
      %kept_score, %kept_id, %filled, %threshold = scf.for %t = %c0 to %steps step %c1
          iter_args(%ks_tile = %empty_key, %ki_tile = %minus_one_i32, %filled_tile = %c0, %th_tile = %empty_key)
          -> (f32, i32, index, f32) {
        // Tile t's keys into registers, zeros past the workgroup's last scored key.
        %tile_key0 = arith.muli %t, %tile_keys : index
        %loads = arith.cmpi slt, %t, %tiles : index
        %k_staged = scf.if %loads -> (!selp_k_staged) {
<% call units.lane_chunks("%k_chunks_read", "%k_per_lane", "%k_none", "!selp_k_staged") %>
  ${ chunk_place() }
  %in_tile = arith.cmpi ult, %c, %k_chunks : index
  %key = arith.addi %tile_key0, %key_row : index
  %scored_key = arith.cmpi sle, %key, %tile_last_scored : index
  %read = arith.andi %in_tile, %scored_key : i1
<% call units.chunk_or_zero("%read", "%k_cmp", "%b, %key, %g, %d0", "!selp_k", "!selp_k_staged") %>
<% endcall %>
<% endcall %>
          scf.yield %k_chunks_read : !selp_k_staged
        } else {
          scf.yield %k_none : !selp_k_staged
        }

        // Tile t - 1 (in workgroup memory), for a row whose scored keys reach it: its first keys up to the row's
        // last scored one, 16 at a time.
        %prev_key0 = arith.subi %tile_key0, %tile_keys : index
        %has_previous = arith.cmpi sge, %t, %c1 : index
        %reaches = arith.cmpi sle, %prev_key0, %last_scored : index
        %compute = arith.andi %has_previous, %reaches : i1
        %ks_next, %ki_next, %filled_next, %th_next = scf.if %compute -> (f32, i32, index, f32) {
          %to_last = arith.subi %last_scored, %prev_key0 : index
          %keys = arith.addi %to_last, %c1 : index
          %unit_steps_all = arith.ceildivui %keys, %c16 : index
          %unit_steps = arith.minui %unit_steps_all, %key_steps : index
          %ks_j, %ki_j, %filled_j, %th_j = scf.for %key_step = %c0 to %unit_steps step %c1
              iter_args(%ks_in = %ks_tile, %ki_in = %ki_tile, %filled_step = %filled_tile, %th_in = %th_tile)
              -> (f32, i32, index, f32) {
            // s = q k^T over 16 keys: rhs read j of a unit is key unit_key0 + run_major(l, j), columns u K +
            // run_k(l, j) ...; element i of s is head acc_row(l, i), key unit_key0 + acc_col(l, i).
            %unit_key0 = arith.muli %key_step, %c16 : index
            %acc_zero = arith.constant dense<0.0> : !selp_acc
${ units.unit_products("%s_acc", "%d_units", "%q_units", "!selp_q_units", "%k_rows", "!selp_k_rows", "%unit_key0", u) }
            %s_flat = vector.shape_cast %s_acc : !selp_acc to !selp_acc_flat
            %x_flat = math.fma %s_flat, %scale_log2_e, %neg_lse2_e : !selp_acc_flat
            %p_all = math.exp2 %x_flat : !selp_acc_flat
            %p_flat = arith.select %head_real_e, %p_all, %zeros : !selp_acc_mask, !selp_acc_flat
            ${ column_sums("%col_sums", "%p_flat") }
            %nan = arith.cmpf uno, %col_sums, %col_sums : !selp_acc_flat
            %scores = arith.select %nan, %nan_keys, %col_sums : !selp_acc_mask, !selp_acc_flat
            // The 16 candidates in increasing id, candidate kk (key unit_key0 + kk of the tile) from the lane
            // holding column kk; scored iff 1 <= id <= own - 2.
            %cand_base = arith.addi %prev_key0, %unit_key0 : index
            %ks_u, %ki_u, %filled_u, %th_u = scf.for %kk = %c0 to %c16 step %c1
                iter_args(%ks = %ks_in, %ki = %ki_in, %filled_in = %filled_step, %th = %th_in) -> (f32, i32, index, f32) {
              %cand = arith.addi %cand_base, %kk : index
              %src_lane = affine.apply #selp_col_lane(%kk)
              %src_index = affine.apply #selp_col_index(%kk)
              %src_lane_i32 = arith.index_cast %src_lane : index to i32
              %src_score = vector.extract %scores[%src_index] : f32 from !selp_acc_flat
              %score, %score_ok = gpu.shuffle idx %src_score, %src_lane_i32, %width : f32
              %scored_lo = arith.cmpi sge, %cand, %c1 : index
              %scored_hi = arith.cmpi sle, %cand, %last_scored : index
              %scored = arith.andi %scored_lo, %scored_hi : i1
              %passes = arith.cmpf ogt, %score, %th : f32
              %enters = arith.andi %scored, %passes : i1
              %ks_k, %ki_k, %filled_k, %th_k = scf.if %enters -> (f32, i32, index, f32) {
                ${ enter() }
              } else {
                scf.yield %ks, %ki, %filled_in, %th : f32, i32, index, f32
              }
              scf.yield %ks_k, %ki_k, %filled_k, %th_k : f32, i32, index, f32
            } {unroll_loop}
            scf.yield %ks_u, %ki_u, %filled_u, %th_u : f32, i32, index, f32
          }
          scf.yield %ks_j, %ki_j, %filled_j, %th_j : f32, i32, index, f32
        } else {
          scf.yield %ks_tile, %ki_tile, %filled_tile, %th_tile : f32, i32, index, f32
        }

        // Tile t's rows into workgroup memory, once every subgroup is done with tile t - 1's.
        gpu.barrier
        scf.if %loads {
          scf.for %i = %c0 to %k_per_lane step %c1 {
            %i_lanes = arith.muli %i, %lanes : index
            %c = arith.addi %tid, %i_lanes : index
            %in_tile = arith.cmpi ult, %c, %k_chunks : index
            scf.if %in_tile {
              ${ chunk_place() }
              %chunk_x = vector.extract %k_staged[%i] : vector<8x${E}> from !selp_k_staged
              vector.store %chunk_x, %k_rows[%key_row, %d0] : !selp_k_rows, vector<8x${E}>
            }
          } {unroll_loop}
        }
        gpu.barrier
        scf.yield %ks_next, %ki_next, %filled_next, %th_next : f32, i32, index, f32
      }

      // Slot t (lane t): the forced blocks (own, own - 1, 0), then kept entry t - forced, then -1.
      %own_i32 = arith.index_cast %own : index to i32
      %scored_slots = arith.addi %forced, %filled : index
      %forced_i32 = arith.index_cast %forced : index to i32
      %from_kept_raw = arith.subi %lane_i32, %forced_i32 : i32
      %from_kept = arith.maxsi %from_kept_raw, %c0_i32 : i32
      %kept_here, %kept_ok = gpu.shuffle idx %kept_id, %from_kept, %width : i32
      %is_slot = arith.cmpi ult, %lane, %slots_out : index
      %writes = arith.andi %is_slot, %row_valid : i1
      scf.if %writes {
        %is_forced = arith.cmpi slt, %lane, %forced : index
        %is_kept = arith.cmpi slt, %lane, %scored_slots : index
        %first_two = arith.cmpi slt, %lane, %c2 : index
        %before = arith.subi %own_i32, %lane_i32 : i32
        %forced_id = arith.select %first_two, %before, %c0_i32 : i32
        %other = arith.select %is_kept, %kept_here, %minus_one_i32 : i32
        %id = arith.select %is_forced, %forced_id, %other : i32
        memref.store %id, %block_indices[%b, %m, %g, %lane] : memref<?x?x${G}x${T}xi32>
      }
      return
    }
<% endcall %>

// Host side: one dispatch per ${SELECT_SUBGROUPS} query rows, block_indices written into the caller's tensor.
${ host.select_blocks("select_blocks_portable_exe", "select_blocks_portable_rows", SELECT_SUBGROUPS, inputs, outputs) }

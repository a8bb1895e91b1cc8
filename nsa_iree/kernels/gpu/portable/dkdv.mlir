// dk/dv pass as a portable matrix-unit kernel: one workgroup per piece of @invert_block_indices (up to
// ROWS_PER_PIECE query rows that selected one kv block), dk and dv of the piece accumulated together; one text
// for every intrinsic (nsa_iree/fragments.py: Unit; dq_portable.mlir explains the units and maps).
//
// Subgroup w owns keys [16 w, 16 w + 16) of the block; their K and V rows are lhs fragments in registers,
// read from global memory once. The piece's rows go ${ROWS_PER_STEP} at a time (one step: the intrinsic's
// reduction K = 16 x ${ROWS_PER_STEP} (row, head) pairs), their q and do staged in workgroup memory both ways
// (heads x dims for s^T and dp^T, dims x heads for dk and dv) from registers loaded during the previous step:
//   s^T  = k q^T        per row: [16 keys x 16 heads], reduction D
//   dp^T = v do^T       per row: reduction Dv
//   p^T  = w exp(scale s^T - lse), ds^T = scale p^T (dp^T - delta)   (w: how often the row lists the block;
//          0 for keys past the row's last visible key, padding heads past HPG and padding rows), written to
//          [16 keys x (row, head)] tiles of the subgroup's own keys
//   dv  += p^T do       [16 keys x 16 columns] units, reduction over the step's (row, head) pairs
//   dk  += ds^T q
// Each subgroup writes its [16 keys, D] and [16 keys, Dv] f32 partials of the piece once; @dkdv_piece_sums adds
// the pieces of a block in piece order, so dk and dv stay bitwise reproducible.
<# With a window (WINDOW > 0) a row sees the block's keys from its first_key on too (the fourth word of its row
   record, gpu/piece_rows.mlir; common/rules.mlir: key_in_range), so a key gets contributions only from the rows whose
   band holds it; a subgroup skips s^T and dp^T of a row that sees none of its 16 keys, and dv += p^T do, dk += ds^T q
   of a step none of whose rows does (its p^T and ds^T are then all 0). #>
<% import "common/host.mlir" as host %>
<% import "common/rules.mlir" as rules %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "gpu/portable/units.mlir" as units %>
<% set u = {'p': 'dkv', 'kind': MMA_KIND, 'run': RUN, 'runs': RUNS, 'acc_n': ACC_N, 'lhs': LHS_UNIT, 'rhs': RHS_UNIT, 'acc': ACC_UNIT, 'maps': [RUN_MAJOR_MAP, RUN_K_MAP, ACC_ROW_MAP, ACC_COL_MAP]} %>

// Push constants: B, M, N (i32), the bits of scale (f32), and the number of pieces.
<% set inputs = ['q', 'k', 'v', 'block_indices', 'lse', 'delta', 'do', 'entries'] %>
<% set outputs = ['dk_pieces', 'dv_pieces'] %>
${ dispatch.layout("dkdv_portable_layout", 5, inputs, outputs) }

!dkv_entries = memref<?x${ROWS_PER_PIECE}x2xi32>
!dkv_dk_pieces = memref<?x${BS}x${D}xf32>
!dkv_dv_pieces = memref<?x${BS}x${DV}xf32>
!dkv_smem = memref<${DKP_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
// Workgroup tiles (rows padded by ${PAD} elements): one step's q and do both ways, p^T and ds^T of every key,
// the step's (lse, delta) pairs, and per piece row: [query row, last visible key, bits of the weight, 0].
<# (With a window the fourth word is the row's first visible key of the block: gpu/piece_rows.mlir.) #>
!dkv_q_step = memref<${ROW_HEADS}x${D_PADDED}x${E}, #gpu.address_space<workgroup>>
!dkv_qt_step = memref<${D}x${ROW_HEADS_PADDED}x${E}, #gpu.address_space<workgroup>>
!dkv_do_step = memref<${ROW_HEADS}x${DV_PADDED}x${E}, #gpu.address_space<workgroup>>
!dkv_dot_step = memref<${DV}x${ROW_HEADS_PADDED}x${E}, #gpu.address_space<workgroup>>
!dkv_key_tile = memref<${BS}x${ROW_HEADS_PADDED}x${E}, #gpu.address_space<workgroup>>
!dkv_stats = memref<${ROW_HEADS}x2xf32, #gpu.address_space<workgroup>>
!dkv_row_info = memref<${ROWS_PER_PIECE}x4xi32, #gpu.address_space<workgroup>>
${ units.types(u) }
!dkv_k_units = vector<${D_UNITS}x${RUNS}x${RUN}x${E}>
!dkv_v_units = vector<${DV_UNITS}x${RUNS}x${RUN}x${E}>
!dkv_dk_acc = vector<${D_TILES16}x${ACC_N}xf32>
!dkv_dv_acc = vector<${DV_TILES16}x${ACC_N}xf32>
!dkv_q_staged = vector<${Q_STEP_ITEMS_PER_LANE}x8x${E}>
!dkv_do_staged = vector<${DO_STEP_ITEMS_PER_LANE}x8x${E}>


<# out (staged_t, per_lane chunks of 8): a lane's part of one step's rows of `src` (src_t [B, M, H, cols]) in
   registers: chunk c = tid + i lanes is (row, head) pair c mod ROW_HEADS, elements 8 (c / ROW_HEADS) ..; zeros
   for padding rows and heads and past `items`. #>
<% macro step_rows(out, per_lane, zeros, items, src, src_t, staged_t) %>
<% call units.lane_chunks(out, per_lane, zeros, staged_t) %>
  %rh = arith.remui %c, %row_heads : index
  %chunk = arith.divui %c, %row_heads : index
  %rho = arith.divui %rh, %c16 : index
  %h = arith.remui %rh, %c16 : index
  %m_i32 = vector.extract %step_ms[%rho] : i32 from vector<${ROWS_PER_STEP}xi32>
  %used = arith.cmpi sge, %m_i32, %c0_i32 : i32
  %real = arith.cmpi ult, %h, %heads_per_group : index
  %in_tile = arith.cmpi ult, %c, ${items} : index
  %live0 = arith.andi %used, %real : i1
  %live = arith.andi %live0, %in_tile : i1
<% call units.chunk_or_zero("%live", src, "%b, %m, %head, %d0", src_t, staged_t) %>
    %m = arith.index_castui %m_i32 : i32 to index
    %head = arith.addi %h0, %h : index
    %d0 = arith.muli %chunk, %c8 : index
<% endcall %>
<% endcall %>
<% endmacro %>

<# out (acc_t, one flat unit per 16-column tile < tiles) = iter + lhs times the rhs read from the transposed step
   tile `tile` (tile_t [column][pair]): read j is column 16 tile + run_major(l, j), pairs run_k(l, j) ... #>
<% macro add_tiles(out, tiles, iter, acc_t, lhs, tile, tile_t) %>
${out} = scf.for %tile = %c0 to ${tiles} step %c1 iter_args(%acc = ${iter}) -> (${acc_t}) {
  %col0 = arith.muli %tile, %c16 : index
${ units.read_runs("%rhs_runs", tile, tile_t, "%col0", none, u) }
  %rhs = vector.shape_cast %rhs_runs : !dkv_runs to !dkv_rhs
  %old_flat = vector.extract %acc[%tile] : !dkv_acc_flat from ${acc_t}
  %old = vector.shape_cast %old_flat : !dkv_acc_flat to !dkv_acc
${ units.mma("%out", lhs, "%rhs", "%old", u) }
  %out_flat = vector.shape_cast %out : !dkv_acc to !dkv_acc_flat
  %next = vector.insert %out_flat, %acc[%tile] : !dkv_acc_flat into ${acc_t}
  scf.yield %next : ${acc_t}
} {unroll_loop}
<% endmacro %>

<# The piece's partials `acc` (acc_t) into `pieces` (pieces_t): element i of unit tile is key key_base +
   acc_row(l, i), column 16 tile + acc_col(l, i). #>
<% macro write_pieces(tiles, acc, acc_t, pieces, pieces_t) %>
scf.for %tile = %c0 to ${tiles} step %c1 {
  scf.for %i = %c0 to %acc_n step %c1 {
    %kr = affine.apply #dkv_acc_row(%lane, %i)
    %cc = affine.apply #dkv_acc_col(%lane, %i)
    %j = arith.addi %key_base, %kr : index
    %col0 = arith.muli %tile, %c16 : index
    %col = arith.addi %col0, %cc : index
    %x = vector.extract ${acc}[%tile, %i] : f32 from ${acc_t}
    memref.store %x, ${pieces}[%piece, %j, %col] : ${pieces_t}
  } {unroll_loop}
} {unroll_loop}
<% endmacro %>

<% call dispatch.executable("selection_attention_dkdv_portable_exe", "selection_attention_dkdv_piece", "dkdv_portable_layout", ['pieces'], lanes=LANES) %>
${ units.func_begin("selection_attention_dkdv_piece", LANES, SUBGROUP_SIZE) }
      ${ units.index_constants({"c0": 0, "c1": 1, "c8": 8, "c16": 16}) }
      %c0_i32 = arith.constant 0 : i32
      %minus_one = arith.constant -1 : i32
      %zero = arith.constant 0.0 : f32
      %one = arith.constant 1.0 : f32
      ${ units.zero_reads(u) }
      ${ units.index_constants({"heads_per_group": HPG, "block_size": BS, "kv_heads": G, "slots": T, "rows": ROWS_PER_PIECE,
          "rows_per_step": ROWS_PER_STEP, "row_steps": ROW_STEPS, "steps": ROW_STEPS_PLUS_1, "row_heads": ROW_HEADS, "lanes": LANES,
          "subgroup_size": SUBGROUP_SIZE, "unit_k": UNIT_K, "runs": RUNS, "acc_n": ACC_N, "d_units": D_UNITS,
          "dv_units": DV_UNITS, "d_tiles": D_TILES16, "dv_tiles": DV_TILES16, "q_items": Q_STEP_ITEMS, "do_items": DO_STEP_ITEMS,
          "q_per_lane": Q_STEP_ITEMS_PER_LANE, "do_per_lane": DO_STEP_ITEMS_PER_LANE}) }

${ dispatch.ids(['piece']) }
${ dispatch.push_constants("dkdv_portable_layout", ['batch', 'm_rows', 'n', 'scale', 'pieces']) }

${ dispatch.bindings("dkdv_portable_layout", inputs, outputs) }

      // A padding piece (no rows) is never read by the piece sums: nothing to do. Uniform per workgroup.
      %first_row_i32 = memref.load %entries[%piece, %c0, %c0] : !dkv_entries
      %piece_used = arith.cmpi sge, %first_row_i32, %c0_i32 : i32
      scf.if %piece_used {
        ${ units.views("!dkv_smem", [("q_step", 0, "!dkv_q_step"), ("qt_step", DKP_QT_OFFSET, "!dkv_qt_step"),
            ("do_step", DKP_DO_OFFSET, "!dkv_do_step"), ("dot_step", DKP_DOT_OFFSET, "!dkv_dot_step"),
            ("pt_tile", DKP_PT_OFFSET, "!dkv_key_tile"), ("dst_tile", DKP_DST_OFFSET, "!dkv_key_tile"),
            ("stats_step", DKP_STATS_OFFSET, "!dkv_stats"), ("row_info", DKP_ROW_INFO_OFFSET, "!dkv_row_info")]) }

        ${ units.lane_ids("%c16") }

        <% include "gpu/piece_rows.mlir" %>

        // This subgroup's 16 keys of K and V as lhs fragments, read once from global memory: read j of unit u
        // is key key_base + run_major(l, j), columns u K + run_k(l, j) ...; keys past N are zeros.
${ units.key_units("%k_units", "%d_units", "!dkv_k_units", "%k", "!dkv_k", u) }
${ units.key_units("%v_units", "%dv_units", "!dkv_v_units", "%v", "!dkv_v", u) }
        gpu.barrier

        // Iteration t loads step t's rows into registers (chunk c: (row, head) pair c mod ROW_HEADS, elements
        // 8 (c / ROW_HEADS) ..; padding rows and heads are zeros), computes step t - 1 from workgroup memory,
        // then stores the registers there for iteration t + 1.
        %dk_init = arith.constant dense<0.0> : !dkv_dk_acc
        %dv_init = arith.constant dense<0.0> : !dkv_dv_acc
        %q_none = arith.constant dense<0.0> : !dkv_q_staged
        %do_none = arith.constant dense<0.0> : !dkv_do_staged
        %dk_acc, %dv_acc = scf.for %t = %c0 to %steps step %c1 iter_args(%dk_iter = %dk_init, %dv_iter = %dv_init)
            -> (!dkv_dk_acc, !dkv_dv_acc) {
          %t_in_range = arith.cmpi ult, %t, %row_steps : index
          %t_safe = arith.select %t_in_range, %t, %c0 : index
          %row0 = arith.muli %t_safe, %rows_per_step : index
          // The step's query rows (-1: padding), one word per row.
          %ms_init = arith.constant dense<-1> : vector<${ROWS_PER_STEP}xi32>
          %step_ms = scf.for %rho = %c0 to %rows_per_step step %c1 iter_args(%acc = %ms_init) -> (vector<${ROWS_PER_STEP}xi32>) {
            %row = arith.addi %row0, %rho : index
            %x = memref.load %row_info[%row, %c0] : !dkv_row_info
            %next = vector.insert %x, %acc[%rho] : i32 into vector<${ROWS_PER_STEP}xi32>
            scf.yield %next : vector<${ROWS_PER_STEP}xi32>
          } {unroll_loop}
          %first_m_i32 = vector.extract %step_ms[0] : i32 from vector<${ROWS_PER_STEP}xi32>
          %first_used = arith.cmpi sge, %first_m_i32, %c0_i32 : i32
          // Used rows come first in a piece: a step whose first row is padding is all padding.
          %stage = arith.andi %t_in_range, %first_used : i1
          %q_staged, %do_staged, %lse_staged, %delta_staged = scf.if %stage
              -> (!dkv_q_staged, !dkv_do_staged, f32, f32) {
            ${ step_rows("%qs", "%q_per_lane", "%q_none", "%q_items", "%q", "!dkv_q", "!dkv_q_staged") }
            ${ step_rows("%dos", "%do_per_lane", "%do_none", "%do_items", "%do", "!dkv_do", "!dkv_do_staged") }
            // Lane tid < ROW_HEADS: lse and delta of (row tid / 16, head tid mod 16).
            %stats_lane = arith.cmpi ult, %tid, %row_heads : index
            %tid_safe = arith.select %stats_lane, %tid, %c0 : index
            %rho = arith.divui %tid_safe, %c16 : index
            %h = arith.remui %tid_safe, %c16 : index
            %m_i32 = vector.extract %step_ms[%rho] : i32 from vector<${ROWS_PER_STEP}xi32>
            %used = arith.cmpi sge, %m_i32, %c0_i32 : i32
            %real = arith.cmpi ult, %h, %heads_per_group : index
            %live0 = arith.andi %used, %real : i1
            %live = arith.andi %live0, %stats_lane : i1
            %l, %dl = scf.if %live -> (f32, f32) {
              %m = arith.index_castui %m_i32 : i32 to index
              %head = arith.addi %h0, %h : index
              %x = memref.load %lse[%b, %head, %m] : memref<?x${H}x?xf32>
              %y = memref.load %delta[%b, %m, %head] : memref<?x?x${H}xf32>
              scf.yield %x, %y : f32, f32
            } else {
              scf.yield %zero, %zero : f32, f32
            }
            scf.yield %qs, %dos, %l, %dl : !dkv_q_staged, !dkv_do_staged, f32, f32
          } else {
            scf.yield %q_none, %do_none, %zero, %zero : !dkv_q_staged, !dkv_do_staged, f32, f32
          }

          // Step t - 1 (its rows are in workgroup memory).
          %has_previous = arith.cmpi uge, %t, %c1 : index
          %t_minus_1 = arith.subi %t, %c1 : index
          %previous = arith.select %has_previous, %t_minus_1, %c0 : index
          %prow0 = arith.muli %previous, %rows_per_step : index
          %pfirst_i32 = memref.load %row_info[%prow0, %c0] : !dkv_row_info
          %pfirst_used = arith.cmpi sge, %pfirst_i32, %c0_i32 : i32
          %compute = arith.andi %has_previous, %pfirst_used : i1
          %dk_next, %dv_next = scf.if %compute -> (!dkv_dk_acc, !dkv_dv_acc) {
            %acc_zero = arith.constant dense<0.0> : !dkv_acc
<% if WINDOW != "0" %>
            // With a window: whether any row of the step sees one of this subgroup's keys key_base .. key_base + 15.
            %c15 = arith.constant 15 : index
            %key_last = arith.addi %key_base, %c15 : index
            %none_seen = arith.constant false
            %step_sees = scf.for %rho = %c0 to %rows_per_step step %c1 iter_args(%any_seen = %none_seen) -> (i1) {
<% else %>
            scf.for %rho = %c0 to %rows_per_step step %c1 {
<% endif %>
              %row = arith.addi %prow0, %rho : index
              %info = vector.load %row_info[%row, %c0] : !dkv_row_info, vector<4xi32>
              %m_i32 = vector.extract %info[0] : i32 from vector<4xi32>
              %last_i32 = vector.extract %info[1] : i32 from vector<4xi32>
              %weight_bits = vector.extract %info[2] : i32 from vector<4xi32>
              %row_used = arith.cmpi sge, %m_i32, %c0_i32 : i32
              %last = arith.index_cast %last_i32 : i32 to index
              %weight = arith.bitcast %weight_bits : i32 to f32
              %head_row0 = arith.muli %rho, %c16 : index
<% if WINDOW != "0" %>
              %first_i32 = vector.extract %info[3] : i32 from vector<4xi32>
              %first = arith.index_cast %first_i32 : i32 to index
              ${ rules.key_in_range("keys_seen", "key_base", "sle", "last", "first", j_last="key_last") }
              %sees = arith.andi %keys_seen, %row_used : i1
<% endif %>
              // s^T and dp^T of this row: rhs read j is head run_major(l, j) of the row, columns
              // u K + run_k(l, j) ...
<% if WINDOW != "0" %>
              %st, %dpt = scf.if %sees -> (!dkv_acc, !dkv_acc) {
              ${ units.unit_products("%st_seen", "%d_units", "%k_units", "!dkv_k_units", "%q_step", "!dkv_q_step", "%head_row0", u) }
              ${ units.unit_products("%dpt_seen", "%dv_units", "%v_units", "!dkv_v_units", "%do_step", "!dkv_do_step", "%head_row0", u) }
                scf.yield %st_seen, %dpt_seen : !dkv_acc, !dkv_acc
              } else {
                scf.yield %acc_zero, %acc_zero : !dkv_acc, !dkv_acc
              }
<% else %>
              ${ units.unit_products("%st", "%d_units", "%k_units", "!dkv_k_units", "%q_step", "!dkv_q_step", "%head_row0", u) }
              ${ units.unit_products("%dpt", "%dv_units", "%v_units", "!dkv_v_units", "%do_step", "!dkv_do_step", "%head_row0", u) }
<% endif %>

              // p^T and ds^T element by element: element i is key key_base + acc_row(l, i), head
              // acc_col(l, i); all computed (reading lse and delta) before any is written at
              // (key, 16 row + head) of the subgroup's own keys.
              %st_flat = vector.shape_cast %st : !dkv_acc to !dkv_acc_flat
              %dpt_flat = vector.shape_cast %dpt : !dkv_acc to !dkv_acc_flat
              %e_init = arith.constant dense<0.0> : vector<${ACC_N}x${E}>
              %p_vals, %ds_vals = scf.for %i = %c0 to %acc_n step %c1 iter_args(%pa = %e_init, %da = %e_init)
                  -> (vector<${ACC_N}x${E}>, vector<${ACC_N}x${E}>) {
                %kr = affine.apply #dkv_acc_row(%lane, %i)
                %h = affine.apply #dkv_acc_col(%lane, %i)
                %j = arith.addi %key_base, %kr : index
                %rh = arith.addi %head_row0, %h : index
                ${ rules.key_in_range("key_visible", "j", "sle", "last", "first") }
                %head_real = arith.cmpi ult, %h, %heads_per_group : index
                %live0 = arith.andi %key_visible, %head_real : i1
                %live = arith.andi %live0, %row_used : i1
                %stats = vector.load %stats_step[%rh, %c0] : !dkv_stats, vector<2xf32>
                %l = vector.extract %stats[0] : f32 from vector<2xf32>
                %dl = vector.extract %stats[1] : f32 from vector<2xf32>
                %sv = vector.extract %st_flat[%i] : f32 from !dkv_acc_flat
                %dpv = vector.extract %dpt_flat[%i] : f32 from !dkv_acc_flat
                ${ units.p_ds("%weight") }
                %p_live = arith.select %live, %p, %zero : f32
                %ds_live = arith.select %live, %ds_scaled, %zero : f32
                %p_e = ${TRUNCF} %p_live : f32 to ${E}
                %ds_e = ${TRUNCF} %ds_live : f32 to ${E}
                %pa_next = vector.insert %p_e, %pa[%i] : ${E} into vector<${ACC_N}x${E}>
                %da_next = vector.insert %ds_e, %da[%i] : ${E} into vector<${ACC_N}x${E}>
                scf.yield %pa_next, %da_next : vector<${ACC_N}x${E}>, vector<${ACC_N}x${E}>
              } {unroll_loop}
              scf.for %i = %c0 to %acc_n step %c1 {
                %kr = affine.apply #dkv_acc_row(%lane, %i)
                %h = affine.apply #dkv_acc_col(%lane, %i)
                %j = arith.addi %key_base, %kr : index
                %rh = arith.addi %head_row0, %h : index
                %p_e = vector.extract %p_vals[%i] : ${E} from vector<${ACC_N}x${E}>
                %ds_e = vector.extract %ds_vals[%i] : ${E} from vector<${ACC_N}x${E}>
                memref.store %p_e, %pt_tile[%j, %rh] : !dkv_key_tile
                memref.store %ds_e, %dst_tile[%j, %rh] : !dkv_key_tile
              } {unroll_loop}
<% if WINDOW != "0" %>
              %seen = arith.ori %any_seen, %sees : i1
              scf.yield %seen : i1
<% endif %>
            } {unroll_loop}
            gpu.barrier

            // dv += p^T do and dk += ds^T q over the step's (row, head) pairs: lhs read j is key
            // key_base + run_major(l, j), pairs run_k(l, j) ...; rhs read j is column 16 tile + run_major(l, j)
            // of the transposed do (q).
<% if WINDOW != "0" %>
            %dk_new, %dv_new = scf.if %step_sees -> (!dkv_dk_acc, !dkv_dv_acc) {
<% endif %>
            %lhs_p_runs, %lhs_ds_runs = scf.for %j = %c0 to %runs step %c1 iter_args(%rp = %zero_runs, %rd = %zero_runs)
                -> (!dkv_runs, !dkv_runs) {
              %kj = affine.apply #dkv_run_major(%lane, %j)
              %kk = affine.apply #dkv_run_k(%lane, %j)
              %key = arith.addi %key_base, %kj : index
              %x = vector.load %pt_tile[%key, %kk] : !dkv_key_tile, vector<${RUN}x${E}>
              %y = vector.load %dst_tile[%key, %kk] : !dkv_key_tile, vector<${RUN}x${E}>
              %rp_next = vector.insert %x, %rp[%j] : vector<${RUN}x${E}> into !dkv_runs
              %rd_next = vector.insert %y, %rd[%j] : vector<${RUN}x${E}> into !dkv_runs
              scf.yield %rp_next, %rd_next : !dkv_runs, !dkv_runs
            } {unroll_loop}
            %lhs_p = vector.shape_cast %lhs_p_runs : !dkv_runs to !dkv_lhs
            %lhs_ds = vector.shape_cast %lhs_ds_runs : !dkv_runs to !dkv_lhs
<% if WINDOW != "0" %>
            ${ add_tiles("%dv_seen", "%dv_tiles", "%dv_iter", "!dkv_dv_acc", "%lhs_p", "%dot_step", "!dkv_dot_step") }
            ${ add_tiles("%dk_seen", "%d_tiles", "%dk_iter", "!dkv_dk_acc", "%lhs_ds", "%qt_step", "!dkv_qt_step") }
              scf.yield %dk_seen, %dv_seen : !dkv_dk_acc, !dkv_dv_acc
            } else {
              scf.yield %dk_iter, %dv_iter : !dkv_dk_acc, !dkv_dv_acc
            }
<% else %>
            ${ add_tiles("%dv_new", "%dv_tiles", "%dv_iter", "!dkv_dv_acc", "%lhs_p", "%dot_step", "!dkv_dot_step") }
            ${ add_tiles("%dk_new", "%d_tiles", "%dk_iter", "!dkv_dk_acc", "%lhs_ds", "%qt_step", "!dkv_qt_step") }
<% endif %>
            scf.yield %dk_new, %dv_new : !dkv_dk_acc, !dkv_dv_acc
          } else {
            scf.yield %dk_iter, %dv_iter : !dkv_dk_acc, !dkv_dv_acc
          }

          // Step t's rows into workgroup memory, once every subgroup is done with step t - 1's.
          gpu.barrier
          scf.if %stage {
            ${ units.store_rows("%q_per_lane", "%q_items", "%q_staged", "!dkv_q_staged", "%row_heads", "%q_step", "!dkv_q_step", "%qt_step", "!dkv_qt_step") }
            ${ units.store_rows("%do_per_lane", "%do_items", "%do_staged", "!dkv_do_staged", "%row_heads", "%do_step", "!dkv_do_step", "%dot_step", "!dkv_dot_step") }
            %stats_lane = arith.cmpi ult, %tid, %row_heads : index
            scf.if %stats_lane {
              %pair0 = vector.broadcast %lse_staged : f32 to vector<2xf32>
              %pair = vector.insert %delta_staged, %pair0[1] : f32 into vector<2xf32>
              vector.store %pair, %stats_step[%tid, %c0] : !dkv_stats, vector<2xf32>
            }
          }
          gpu.barrier
          scf.yield %dk_next, %dv_next : !dkv_dk_acc, !dkv_dv_acc
        }

        // The piece's partials: element i of unit tile is key key_base + acc_row(l, i), column
        // 16 tile + acc_col(l, i).
        ${ write_pieces("%d_tiles", "%dk_acc", "!dkv_dk_acc", "%dk_pieces", "!dkv_dk_pieces") }
        ${ write_pieces("%dv_tiles", "%dv_acc", "!dkv_dv_acc", "%dv_pieces", "!dkv_dv_pieces") }
      }
      return
    }
<% endcall %>

// Host side: the kernel writes every used piece's partials, @dkdv_piece_sums adds them per block.
${ host.dkdv("selection_attention_dkdv_portable_exe") }

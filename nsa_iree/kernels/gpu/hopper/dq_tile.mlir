<# part: takes ASYNC_COPY_HINT, D_TILES, EX2, HOPPER_DQ_DO_OFFSET, HOPPER_DQ_DS_IN_V, HOPPER_DQ_DS_OFFSET, HOPPER_DQ_K_OFFSET, HOPPER_DQ_LANES, HOPPER_DQ_MAKES_DELTA, HOPPER_DQ_MIN_WORKGROUPS_PER_SM, HOPPER_DQ_ROWS, HOPPER_DQ_SMEM_BYTES, HOPPER_DQ_VALUES, HOPPER_DQ_V_OFFSET, HOPPER_K_TILE_BYTES, HOPPER_S_VALUES, HOPPER_V_TILE_BYTES, PACK_PAIR, selection #>
// dq on Hopper's warpgroup MMA (sm_90a), a part of dense_dq.mlir (the sliding window's dq pass: KernelSpec.window,
// kernels.DENSE) and wide_dq.mlir (64 heads per group: kernels.WIDE): dq as gpu/nvidia/dense_dq.mlir computes it,
// with the products on wgmma (gpu/hopper/wgmma.mlir) instead of mma.sync.
//
// One workgroup of HOPPER_DQ_ROWS / 64 warpgroups per (tile of HOPPER_DQ_ROWS rows, kv group g, b): row R of the
// group is (position R / HPG, head R mod HPG) (gpu/nvidia/dense_rows.mlir); warpgroup u holds rows 64 u .. 64 u + 63
// of the tile in its accumulators, subgroup w (of the workgroup's) rows 16 w .. 16 w + 15. The tile's q
// and do are staged once; the key tiles of BS keys stream through two buffers of K and V as in the forward
// (dense_forward.mlir), the band's tiles up to the last one the tile's last row sees. Per key tile:
//   s = q k^T and dp = do v^T   (two wgmma chains, one wait; A = q, do and B = k, v from workgroup memory)
//   p = exp(scale s - lse), ds = scale p (dp - delta)   (0 where the row does not see the key, or is padding)
//   ds written over the V tile just read (free once dp is made; HOPPER_DQ_DS_IN_V, else a region of its own), then
//   dq += ds k   (B = k MN-major)
// and at the end each row's dq is written (its keys summed in one fixed order: bitwise reproducible). Rows past
// M x HPG are padding, loaded as zeros and never written.
//
// Workgroup memory (bytes, from the allocation's first 1024-byte boundary): q [HOPPER_DQ_ROWS, D] at 0, do
// [HOPPER_DQ_ROWS, Dv] at HOPPER_DQ_DO_OFFSET, K tiles [2][BS, D] at HOPPER_DQ_K_OFFSET, V tiles [2][BS, Dv] at
// HOPPER_DQ_V_OFFSET, ds [HOPPER_DQ_ROWS, BS] over the V tile computed from or at HOPPER_DQ_DS_OFFSET, each in
// wgmma.mlir's swizzled layout.
//
// `selection` (wide_dq.mlir; dense_dq.mlir: false): the key tiles are a row's selected blocks rather than a range
// of keys. With 64 rows and 64 heads per group a workgroup's rows are one position's heads, which share its block
// list: the tile of slot t is block_indices[b, m, g, t] where that names a block (nv.selected_block: not -1, not in
// the future), staged once for the 64 heads; other slots are skipped (a block listed twice is computed twice, as
// the forward counts it).
<% set exe, function = ("hopper_wide_attention_dq_exe", "wide_attention_dq_tile") if selection else ("hopper_dense_attention_dq_exe", "dense_attention_dq_tile") %>
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/rules.mlir" as rules %>
<% import "gpu/nvidia/kernel.mlir" as nv %>
<% import "gpu/hopper/wgmma.mlir" as wg %>

// Push constants: B, M, N (i32; N is the number of keys, k's rows), then the bits of scale (f32). The block
// indices are bound (dq's ABI), read only with `selection`. Where the backward is one call (HOPPER_DQ_MAKES_DELTA: the window's
// dk/dv on Hopper too, gpu/hopper/dense_dkdv.mlir) this dispatch makes delta itself from o and do and writes it for
// the dk/dv pass after it, and the host function is the backward's (common/host.mlir dense_backward).
<% set makes_delta = HOPPER_DQ_MAKES_DELTA == "1" and not selection %>
<% set inputs = ['q', 'k', 'v', 'block_indices', 'lse', 'o' if makes_delta else 'delta', 'do'] %>
<% set outputs = ['dq', 'delta'] if makes_delta else ['dq'] %>
${ dispatch.layout("hopper_dense_dq_layout", 4, inputs, outputs) }

!hdq_q = memref<?x?x${H}x${D}x${E}>
!hdq_k = memref<?x?x${G}x${D}x${E}>
!hdq_v = memref<?x?x${G}x${DV}x${E}>
!hdq_do = memref<?x?x${H}x${DV}x${E}>
!hdq_smem = memref<${HOPPER_DQ_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
!hdq_elements = memref<${ (HOPPER_DQ_SMEM_BYTES | int) // 2 - 512 }x${E}, #gpu.address_space<workgroup>>
!hdq_words = memref<${ (HOPPER_DQ_SMEM_BYTES | int) // 4 - 256 }xi32, #gpu.address_space<workgroup>>
!hdq_s = ${ wg.acc_type(HOPPER_S_VALUES) }
!hdq_dq = ${ wg.acc_type(HOPPER_DQ_VALUES) }
!hdq_dq_acc = vector<1x${D_TILES}x2x2xf32>

<% set rows, bs, lanes = HOPPER_DQ_ROWS | int, BS | int, HOPPER_DQ_LANES | int %>
<% set k_bytes, v_bytes = HOPPER_K_TILE_BYTES | int, HOPPER_V_TILE_BYTES | int %>
<# The k16 steps' byte offsets (wgmma.mlir's swizzled layout): K-major q and do [rows, D or Dv], k and v [BS, D or
   Dv] and ds [rows, BS], 32 bytes a step in a column block and rows x 128 a block; MN-major k [BS, D] as dq's B, 16 keys
   (2048 bytes) a step. #>
<% set steps = namespace(q=[], k=[], do=[], v=[], ds=[], k_mn=[]) %>
<% for s in range((D | int) // 16) %>
<% set steps.q = steps.q + [(s // 4) * rows * 128 + (s % 4) * 32] %>
<% set steps.k = steps.k + [(s // 4) * bs * 128 + (s % 4) * 32] %>
<% endfor %>
<% for s in range((DV | int) // 16) %>
<% set steps.do = steps.do + [(s // 4) * rows * 128 + (s % 4) * 32] %>
<% set steps.v = steps.v + [(s // 4) * bs * 128 + (s % 4) * 32] %>
<% endfor %>
<% for s in range(bs // 16) %>
<% set steps.ds = steps.ds + [(s // 4) * rows * 128 + (s % 4) * 32] %>
<% set steps.k_mn = steps.k_mn + [s * 2048] %>
<% endfor %>
<% set s_values, dq_values = HOPPER_S_VALUES | int, HOPPER_DQ_VALUES | int %>
<% call dispatch.executable(exe, function, "hopper_dense_dq_layout", ['row_tiles', 'kv_heads', 'batch'], lanes=lanes) %>
${ nv.func_open(function, lanes, 32, HOPPER_DQ_MIN_WORKGROUPS_PER_SM) }
${ nv.constants(["c0", "c1", "c2", "c4", "c8", "c15", "c16", "c32", "c64", "c128", "zero", "log2e"]) }
      %c4_i64 = arith.constant 4 : i64
      %c16383_i64 = arith.constant 16383 : i64
      %subgroup_size = arith.constant 32 : index
      %lanes = arith.constant ${lanes} : index
${ nv.constants([("heads_per_group", HPG), ("block_size", BS), ("rows_per_workgroup", rows), ("d_tiles", D_TILES)]) }
      %stages = arith.constant 2 : index
      %lag = arith.constant 1 : index

${ dispatch.ids(['row_tile', 'g', 'b']) }
${ dispatch.push_constants("hopper_dense_dq_layout", ['batch', 'm_rows', 'n', 'scale']) }
${ nv.p_and_ds_constants() }

${ dispatch.bindings("hopper_dense_dq_layout", inputs, outputs) }

${ wg.aligned_allocation("!hdq_smem", [("elements", "!hdq_elements"), ("words", "!hdq_words")]) }

${ nv.lane_ids() }
      <% include "gpu/nvidia/dense_rows.mlir" %>
<% if selection %>
      // The workgroup's rows are position %m's heads (HPG = 64 rows): its T slots are the tiles.
      %m = arith.divui %tile_row0, %heads_per_group : index
      %slot_count = arith.constant ${T} : index
      %slot_steps = arith.addi %slot_count, %lag : index
<% endif %>
<% set tiles, loop_steps = ("%slot_count", "%slot_steps") if selection else ("%slots", "%steps") %>

      // The lane's rows' lse and delta as p_and_ds's terms (0 for padding rows, which take no part).
<% if makes_delta %>
      // delta = sum_e o[row, e] do[row, e] in f32, made here: lane c of a row's four takes the 8-element chunks c,
      // c + 4, ... of o and do; the four's sums are added by two xor shuffles (every lane the same sum, in one
      // fixed order), and lane 0 of the four writes it for the dk/dv pass.
      %c1_i32 = arith.constant 1 : i32
      %c2_i32 = arith.constant 2 : i32
      %c32_i32 = arith.constant 32 : i32
      %chunk_e0 = arith.muli %c, %c8 : index
      %writes_delta = arith.cmpi eq, %c, %c0 : index
<% endif %>
<% for i in ["0", "1"] %>
<% if makes_delta %>
      %lse_${i}, %delta_part_${i} = scf.if %head_valid_${i} -> (f32, f32) {
        %x = memref.load %lse[%b, %head_${i}, %m_${i}] : memref<?x${H}x?xf32>
<% for j in range((DV | int) // 32) %>
        %e_${j}_base = arith.constant ${ 32 * j } : index
        %e_${j} = arith.addi %chunk_e0, %e_${j}_base : index
        %o_${j} = vector.load %o[%b, %m_${i}, %head_${i}, %e_${j}] : !hdq_do, vector<8x${E}>
        %do_${j} = vector.load %do[%b, %m_${i}, %head_${i}, %e_${j}] : !hdq_do, vector<8x${E}>
        %o_f32_${j} = arith.extf %o_${j} : vector<8x${E}> to vector<8xf32>
        %do_f32_${j} = arith.extf %do_${j} : vector<8x${E}> to vector<8xf32>
<% if j == 0 %>
        %products_0 = arith.mulf %o_f32_0, %do_f32_0 : vector<8xf32>
<% else %>
        %products_${j} = math.fma %o_f32_${j}, %do_f32_${j}, %products_${j - 1} : vector<8xf32>
<% endif %>
<% endfor %>
        %y = vector.reduction <add>, %products_${ (DV | int) // 32 - 1 } : vector<8xf32> into f32
        scf.yield %x, %y : f32, f32
      } else {
        scf.yield %zero, %zero : f32, f32
      }
      %delta_from_1_${i}, %delta_ok_1_${i} = gpu.shuffle xor %delta_part_${i}, %c1_i32, %c32_i32 : f32
      %delta_pair_${i} = arith.addf %delta_part_${i}, %delta_from_1_${i} : f32
      %delta_from_2_${i}, %delta_ok_2_${i} = gpu.shuffle xor %delta_pair_${i}, %c2_i32, %c32_i32 : f32
      %delta_${i} = arith.addf %delta_pair_${i}, %delta_from_2_${i} : f32
      %writes_delta_${i} = arith.andi %writes_delta, %head_valid_${i} : i1
      scf.if %writes_delta_${i} {
        memref.store %delta_${i}, %delta[%b, %m_${i}, %head_${i}] : memref<?x?x${H}xf32>
      }
<% else %>
      %lse_${i}, %delta_${i} = scf.if %head_valid_${i} -> (f32, f32) {
        %x = memref.load %lse[%b, %head_${i}, %m_${i}] : memref<?x${H}x?xf32>
        %y = memref.load %delta[%b, %m_${i}, %head_${i}] : memref<?x?x${H}xf32>
        scf.yield %x, %y : f32, f32
      } else {
        scf.yield %zero, %zero : f32, f32
      }
<% endif %>
${ nv.p_and_ds_row("row_" ~ i, "lse_" ~ i, "delta_" ~ i) }
<% endfor %>

      // q and do of the tile, once: row R of each is the group's row tile_row0 + R (zeros for padding rows).
      %do_region = arith.constant ${ (HOPPER_DQ_DO_OFFSET | int) // 2 } : index
${ wg.stage_rows("q", "!hdq_q", "%tile_row0", rows, D, "%c0", lanes, "!hdq_elements", ASYNC_COPY_HINT) }
${ wg.stage_rows("do", "!hdq_do", "%tile_row0", rows, DV, "%do_region", lanes, "!hdq_elements", ASYNC_COPY_HINT) }
      nvvm.cp.async.commit.group
      // A warpgroup's operands q, do and ds: its 64 rows, 8192 bytes into each column block of the workgroup's.
      %warpgroup = arith.divui %tid, %c128 : index
      %warpgroup_bytes = arith.constant 8192 : index
      %q_offset = arith.muli %warpgroup, %warpgroup_bytes : index
${ wg.descriptor("q_desc", "%q_offset", 16, 1024) }
      %do_region_bytes = arith.constant ${HOPPER_DQ_DO_OFFSET} : index
      %do_offset = arith.addi %do_region_bytes, %q_offset : index
${ wg.descriptor("do_desc", "%do_offset", 16, 1024) }
      %dq_zero = llvm.mlir.zero : !hdq_dq

      %dq_struct = scf.for %t = %c0 to ${loop_steps} step %c1 iter_args(%dq_tile = %dq_zero) -> (!hdq_dq) {
        // Stage tile t (its keys past the tile's last row's position as zeros, not read) into buffer t mod 2.
        %stage_buffer = arith.remui %t, %stages : index
        %t_in_range = arith.cmpi ult, %t, ${tiles} : index
        scf.if %t_in_range {
<% if selection %>
${ nv.selected_block("%t", "%selected") }
          scf.if %selected {
<% else %>
${ nv.next_tile("%t", "%selected") }
<% endif %>
          %stage_key0 = arith.muli %block, %block_size : index
          %stage_to_pos = arith.subi %pos, %stage_key0 : index
          %stage_visible = arith.addi %stage_to_pos, %c1 : index
<% for x, width, tile_bytes, offset in [("k", D, k_bytes, HOPPER_DQ_K_OFFSET), ("v", DV, v_bytes, HOPPER_DQ_V_OFFSET)] %>
          %${x}_tile_elements = arith.constant ${ tile_bytes // 2 } : index
          %${x}_buffer_elements = arith.muli %stage_buffer, %${x}_tile_elements : index
          %${x}_region = arith.constant ${ (offset | int) // 2 } : index
          %${x}_base = arith.addi %${x}_region, %${x}_buffer_elements : index
${ wg.stage_keys(x, "!hdq_" ~ x, "%stage_key0", "%stage_visible", BS, width, "%" ~ x ~ "_base", lanes, "!hdq_elements", ASYNC_COPY_HINT) }
<% endfor %>
<% if selection %>
          }
<% endif %>
        }
        nvvm.cp.async.commit.group
        nvvm.cp.async.wait.group 1
        // The copies (generic proxy) made visible to wgmma's reads (async proxy), then to the whole warpgroup.
        llvm.inline_asm has_side_effects "fence.proxy.async.shared::cta;", "" : () -> ()
        gpu.barrier
${ nv.previous("%slot") }
<% if selection %>
        // (slot 0 read before the pipeline's first tile: not computed)
${ nv.selected_block("%slot", "%slot_selected", "slot_") }
        %compute = arith.andi %has_previous, %slot_selected : i1
<% endif %>
        %dq_next = scf.if ${ "%compute" if selection else "%has_previous" } -> (!hdq_dq) {
<% if selection %>
          %key0 = arith.muli %slot_block, %block_size : index
<% else %>
          %tile_of_slot = arith.addi %first_tile, %slot : index
          %key0 = arith.muli %tile_of_slot, %block_size : index
<% endif %>
${ nv.dense_row_bounds() }
<% for x, tile_bytes, offset in [("k", k_bytes, HOPPER_DQ_K_OFFSET), ("v", v_bytes, HOPPER_DQ_V_OFFSET)] %>
          %${x}_region_bytes = arith.constant ${offset} : index
          %${x}_tile_bytes = arith.constant ${tile_bytes} : index
          %${x}_buffer_bytes = arith.muli %buffer, %${x}_tile_bytes : index
          %${x}_offset = arith.addi %${x}_region_bytes, %${x}_buffer_bytes : index
<% endfor %>
${ wg.descriptor("k_desc", "%k_offset", 16, 1024) }
${ wg.descriptor("k_mn_desc", "%k_offset", bs * 128, 1024) }
${ wg.descriptor("v_desc", "%v_offset", 16, 1024) }
<% if HOPPER_DQ_DS_IN_V == "1" %>
          %ds_tile_offset = arith.addi %v_offset, %q_offset : index
          %ds_region = arith.divui %v_offset, %c4 : index
<% else %>
          %ds_region_bytes = arith.constant ${HOPPER_DQ_DS_OFFSET} : index
          %ds_tile_offset = arith.addi %ds_region_bytes, %q_offset : index
          %ds_region = arith.constant ${ (HOPPER_DQ_DS_OFFSET | int) // 4 } : index
<% endif %>
${ wg.descriptor("ds_desc", "%ds_tile_offset", 16, 1024) }

          // s = q k^T over D and dp = do v^T over Dv, in 16-column steps.
${ wg.chains([("s", none, "%q_desc", steps.q, "%k_desc", steps.k, BS, "col", "!hdq_s"), ("dp", none, "%do_desc", steps.do, "%v_desc", steps.v, BS, "col", "!hdq_s")], E) }
${ wg.values("sv", "%s", s_values, "!hdq_s") }
${ wg.values("dpv", "%dp", s_values, "!hdq_s") }
<% if HOPPER_DQ_DS_IN_V == "1" %>
          // The V tile is free once every subgroup has its dp: ds goes over it.
          gpu.barrier
<% endif %>
${ wg.pair_words("ds", "%ds_region", rows, BS) }
          // p and ds of value 4 i + 2 h + e: row 16 w + 8 h + r, key offset 8 i + 2 c + e (0 where the row does
          // not see the key or is padding); each pair into workgroup memory in the input type. (A test for tiles
          // every row sees whole, to skip the mask, made this kernel slower: docs/performance.md.)
<% for v in range(s_values) %>
<% set i, h, e = v // 4, (v // 2) % 2, v % 2 %>
          %j_${v}_base = arith.constant ${ 8 * i + e } : index
          %j_${v} = arith.addi %c2x, %j_${v}_base : index
          ${ rules.key_in_range("in_" ~ v, "j_" ~ v, "slt", "visible_" ~ h, "first_visible_" ~ h) }
          %live_${v} = arith.andi %in_${v}, %head_valid_${h} : i1
          %exponent_${v} = math.fma %sv_${v}, %scale_log2, %row_${h}_lse2 : f32
          %p_${v} = ${EX2} %exponent_${v} : (f32) -> f32
          %dp_scaled_${v} = math.fma %dpv_${v}, %scale, %row_${h}_delta : f32
          %ds_all_${v} = arith.mulf %p_${v}, %dp_scaled_${v} : f32
          %ds_${v} = arith.select %live_${v}, %ds_all_${v}, %zero : f32
<% if e == 1 %>
          %ds_pair_${v} = ${PACK_PAIR} %ds_${v}, %ds_${v - 1} : (f32, f32) -> i32
          memref.store %ds_pair_${v}, %words[%ds_at_${i}_${h}] : !hdq_words
<% endif %>
<% endfor %>
          llvm.inline_asm has_side_effects "fence.proxy.async.shared::cta;", "" : () -> ()
          gpu.barrier
          // dq += ds k over the tile's keys in 16-key steps (k MN-major: its rows are the product's K).
${ wg.chain("dq_new", "%dq_tile", "%ds_desc", steps.ds, "%k_mn_desc", steps.k_mn, D, E, "row", "!hdq_dq") }
          scf.yield %dq_new : !hdq_dq
        } else {
          scf.yield %dq_tile : !hdq_dq
        }
        // The next iteration stages into the buffer just read.
        gpu.barrier
        scf.yield %dq_next : !hdq_dq
      }

      // dq as the NVIDIA kernels' accumulator vector (element [0][tile][i][e] is value 4 tile + 2 i + e), each
      // row written (not padding rows).
      %dq_vector_zero = arith.constant dense<0.0> : !hdq_dq_acc
<% for v in range(dq_values) %>
      %dq_value_${v} = llvm.extractvalue %dq_struct[${v}] : !hdq_dq
      %${ "dq_acc" if v == dq_values - 1 else "dq_vec_" ~ v } = vector.insert %dq_value_${v}, ${ "%dq_vector_zero" if v == 0 else "%dq_vec_" ~ (v - 1) }[0, ${v // 4}, ${(v // 2) % 2}, ${v % 2}] : f32 into !hdq_dq_acc
<% endfor %>
${ nv.store_rows("%dq_acc", "!hdq_dq_acc", "%d_tiles", "%dq", "!hdq_q") }
      return
    }
<% endcall %>

<% if not makes_delta %>
// Host side: one dispatch over the row tiles, dq written into the caller's tensor.
${ host.dq(exe, function, HOPPER_DQ_ROWS) }
<% endif %>

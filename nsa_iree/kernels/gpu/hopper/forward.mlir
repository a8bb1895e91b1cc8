<# part: takes ASYNC_COPY_HINT, DV_TILES, EX2, HOPPER_K_OFFSET, HOPPER_K_TILE_BYTES, HOPPER_LANES, HOPPER_MIN_WORKGROUPS_PER_SM, HOPPER_O_VALUES, HOPPER_P_IN_K, HOPPER_P_OFFSET, HOPPER_P_REGISTERS, HOPPER_ROWS, HOPPER_SMEM_BYTES, HOPPER_S_VALUES, HOPPER_V_OFFSET, HOPPER_V_BUFFERS, HOPPER_V_TILE_BYTES, PACK_PAIR, RESCALE_SLACK, VOTE_ANY, selection #>
// The forward on Hopper's warpgroup MMA (sm_90a), a part of dense_forward.mlir (the sliding window's forward:
// KernelSpec.window, kernels.DENSE) and wide_forward.mlir (64 heads per group: kernels.WIDE): the forward as
// gpu/nvidia/dense_forward.mlir computes it, with the products on wgmma (gpu/hopper/wgmma.mlir) instead of mma.sync.
// (The text takes the compressed attention's KEY_STRIDE too; the family serves only the window and the selection of
// 64 heads per group, the ones checked on an H200.)
//
// One workgroup of HOPPER_ROWS / 64 warpgroups per (tile of HOPPER_ROWS rows, kv group g, b): row R of the group
// is (position R / HPG, head R mod HPG) (gpu/nvidia/dense_rows.mlir); warpgroup u holds rows 64 u .. 64 u + 63 of
// the tile in its accumulators, subgroup w (of the workgroup's) rows 16 w .. 16 w + 15. The tile's q is staged
// once; the key tiles of BS keys stream through two buffers (tile t staged while tile t - 1 is computed), up to
// the last tile the tile's last row sees, from the band's first: each staged once for all the tile's rows. Per
// key tile, each warpgroup for its 64 rows: s = q k^T (wgmma, A = q and B = k from workgroup memory), the online
// softmax of the forward kernels in the lanes' rows (a row's max and sum over its 4 lanes; the running max moves
// only past RESCALE_SLACK), p written over the K tile just read (HOPPER_P_IN_K; else a region of its own) in the
// input type, then o += p v (wgmma, B = v MN-major). Each row's keys are taken in one fixed order; a row that sees
// no key gets o = 0 and lse = -inf; rows past M x HPG are padding, loaded as zeros and never written.
//
// Workgroup memory (bytes, from the allocation's first 1024-byte boundary): q [HOPPER_ROWS, D] at 0, K tiles
// [2][BS, D] at HOPPER_K_OFFSET, V tiles [2][BS, Dv] at HOPPER_V_OFFSET (p [HOPPER_ROWS, BS] at HOPPER_P_OFFSET
// where it does not go over a K tile), each in wgmma.mlir's swizzled layout.
//
// `selection` (wide_forward.mlir; dense_forward.mlir: false): the tiles are a row's selected blocks rather than a
// range of keys. With HOPPER_ROWS 64 and 64 heads per group a workgroup's rows are one position's heads, which share
// its block list: the tile of slot t is block_indices[b, m, g, t] where that names a block (nv.selected_block: not
// -1, not in the future), staged once for the 64 heads; other slots are skipped.
// HOPPER_V_BUFFERS 1 (the wide forward): one V buffer, V of tile t staged once o += p v of tile t - 1 has read it and
// waited for just before its own product (the top of an iteration stages and waits for K only). HOPPER_P_REGISTERS 1
// (the wide forward): p stays in registers as o += p v's A operand (wg.chain_registers), with no p tile.
<% set exe, function = ("hopper_wide_attention_fwd_exe", "wide_attention_fwd_tile") if selection else ("hopper_dense_attention_fwd_exe", "dense_attention_fwd_tile") %>
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/rules.mlir" as rules %>
<% import "gpu/nvidia/kernel.mlir" as nv %>
<% import "gpu/nvidia/softmax.mlir" as softmax %>
<% import "gpu/hopper/wgmma.mlir" as wg %>

// Push constants: B, M, N (i32; N is the number of keys, k's rows), then the bits of scale (f32). The block
// indices are bound (the forward's ABI), read only with `selection`.
<% set inputs = ['q', 'k', 'v', 'block_indices'] %>
<% set outputs = ['o', 'lse'] %>
${ dispatch.layout("hopper_dense_fwd_layout", 4, inputs, outputs) }

!hfw_q = memref<?x?x${H}x${D}x${E}>
!hfw_k = memref<?x?x${G}x${D}x${E}>
!hfw_v = memref<?x?x${G}x${DV}x${E}>
!fwk_o = memref<?x?x${H}x${DV}x${E}>
!hfw_smem = memref<${HOPPER_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
!hfw_elements = memref<${ (HOPPER_SMEM_BYTES | int) // 2 - 512 }x${E}, #gpu.address_space<workgroup>>
!hfw_words = memref<${ (HOPPER_SMEM_BYTES | int) // 4 - 256 }xi32, #gpu.address_space<workgroup>>
!hfw_s = ${ wg.acc_type(HOPPER_S_VALUES) }
!hfw_o = ${ wg.acc_type(HOPPER_O_VALUES) }
!fwk_o_acc = vector<1x${DV_TILES}x2x2xf32>

<% set k_bytes, v_bytes = HOPPER_K_TILE_BYTES | int, HOPPER_V_TILE_BYTES | int %>
<# HOPPER_V_BUFFERS 1 (the wide forward only): one V buffer, staged at the end of an iteration, not two. #>
<% set one_v = HOPPER_V_BUFFERS == "1" %>
<# HOPPER_P_REGISTERS 1 (the wide forward only): p stays in registers as o += p v's A operand (no p tile). #>
<% set p_registers = HOPPER_P_REGISTERS == "1" %>
<% if p_registers and not selection %>${ fail("p in registers is written for the selection's wide forward") }<% endif %>
<% if one_v and not selection %>${ fail("one V buffer is written for the selection's wide forward") }<% endif %>
<% set rows = HOPPER_ROWS | int %>
<# The k16 steps' byte offsets (wgmma.mlir's swizzled layout): K-major q [rows, D], k [BS, D] and p [rows, BS], 32
   bytes a step in a column block and rows x 128 a block; MN-major v [BS, Dv], two 8-key groups (2048 bytes) a step. #>
<% set steps = namespace(q=[], k=[], p=[], v=[]) %>
<% for s in range((D | int) // 16) %>
<% set steps.q = steps.q + [(s // 4) * rows * 128 + (s % 4) * 32] %>
<% set steps.k = steps.k + [(s // 4) * (BS | int) * 128 + (s % 4) * 32] %>
<% endfor %>
<% for s in range((BS | int) // 16) %>
<% set steps.p = steps.p + [(s // 4) * rows * 128 + (s % 4) * 32] %>
<% set steps.v = steps.v + [s * 2048] %>
<% endfor %>
<% set s_values, o_values = HOPPER_S_VALUES | int, HOPPER_O_VALUES | int %>
<% call dispatch.executable(exe, function, "hopper_dense_fwd_layout", ['row_tiles', 'kv_heads', 'batch'], lanes=HOPPER_LANES) %>
${ nv.func_open(function, HOPPER_LANES, 32, HOPPER_MIN_WORKGROUPS_PER_SM) }
${ nv.constants(["c0", "c1", "c2", "c4", "c8", "c15", "c16", "c32", "c64", "c128", "c0_i32", "c1_i32", "c2_i32", "c32_i32", "zero", "one", "minus_inf", "log2e", "ln2"]) }
      %rescale_slack = arith.constant ${RESCALE_SLACK} : f32
      %c4_i64 = arith.constant 4 : i64
      %c16383_i64 = arith.constant 16383 : i64
      %subgroup_size = arith.constant 32 : index
      %lanes = arith.constant ${HOPPER_LANES} : index
${ nv.constants([("heads_per_group", HPG), ("block_size", BS), ("rows_per_workgroup", HOPPER_ROWS), ("dv_tiles", DV_TILES)]) }
      %stages = arith.constant 2 : index
      %lag = arith.constant 1 : index

${ dispatch.ids(['row_tile', 'g', 'b']) }
${ dispatch.push_constants("hopper_dense_fwd_layout", ['batch', 'm_rows', 'n', 'scale']) }
      %scale_log2 = arith.mulf %scale, %log2e : f32

${ dispatch.bindings("hopper_dense_fwd_layout", inputs, outputs) }

${ wg.aligned_allocation("!hfw_smem", [("elements", "!hfw_elements"), ("words", "!hfw_words")]) }

${ nv.lane_ids() }
      <% include "gpu/nvidia/dense_rows.mlir" %>
<% if selection %>
      // The workgroup's rows are position %m's heads (HPG = HOPPER_ROWS): its T slots are the tiles.
      %m = arith.divui %tile_row0, %heads_per_group : index
      %slot_count = arith.constant ${T} : index
      %slot_steps = arith.addi %slot_count, %lag : index
<% endif %>
<% set tiles, loop_steps = ("%slot_count", "%slot_steps") if selection else ("%slots", "%steps") %>

      // q's tile, once: row R of the tile is the group's row tile_row0 + R (zeros for padding rows).
${ wg.stage_rows("q", "!hfw_q", "%tile_row0", HOPPER_ROWS, D, "%c0", HOPPER_LANES, "!hfw_elements", ASYNC_COPY_HINT) }
      nvvm.cp.async.commit.group

      // A warpgroup's operands q and p (p where it is a tile): its 64 rows, 1024 bytes into each chunk of the
      // workgroup's rows.
      %warpgroup = arith.divui %tid, %c128 : index
      %warpgroup_bytes = arith.constant 8192 : index
      %q_offset = arith.muli %warpgroup, %warpgroup_bytes : index
${ wg.descriptor("q_desc", "%q_offset", 16, 1024) }
<% if HOPPER_P_IN_K == "0" and not p_registers %>
      %p_region_bytes = arith.constant ${HOPPER_P_OFFSET} : index
      %p_offset = arith.addi %p_region_bytes, %q_offset : index
${ wg.descriptor("p_desc", "%p_offset", 16, 1024) }
<% endif %>
      %s_zero = llvm.mlir.zero : !hfw_s
      %o_zero = llvm.mlir.zero : !hfw_o

      %o_struct, %max_0, %max_1, %sum_0, %sum_1 = scf.for %t = %c0 to ${loop_steps} step %c1
          iter_args(%o_tile = %o_zero, %mx0 = %minus_inf, %mx1 = %minus_inf, %l0 = %zero, %l1 = %zero)
          -> (!hfw_o, f32, f32, f32, f32) {
        // Stage tile t (its keys past the tile's last row's position as zeros, not read) into buffer t mod 2 (with
        // one V buffer, its K only).
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
<% for x, width, tile_bytes, offset in [("k", D, k_bytes, HOPPER_K_OFFSET), ("v", DV, v_bytes, HOPPER_V_OFFSET)][:(1 if one_v else 2)] %>
          %${x}_tile_elements = arith.constant ${ (tile_bytes | int) // 2 } : index
          %${x}_buffer_elements = arith.muli %stage_buffer, %${x}_tile_elements : index
          %${x}_region = arith.constant ${ (offset | int) // 2 } : index
          %${x}_base = arith.addi %${x}_region, %${x}_buffer_elements : index
${ wg.stage_keys(x, "!hfw_" ~ x, "%stage_key0", "%stage_visible", BS, width, "%" ~ x ~ "_base", HOPPER_LANES, "!hfw_elements", ASYNC_COPY_HINT) }
<% endfor %>
<% if selection %>
          }
<% endif %>
        }
        nvvm.cp.async.commit.group
<% if one_v %>
        // (one V buffer: V of the tile computed now may still be in flight; waited for before o += p v)
<% endif %>
        nvvm.cp.async.wait.group ${ 2 if one_v else 1 }
        // The copies (generic proxy) made visible to wgmma's reads (async proxy), then to the whole warpgroup.
        llvm.inline_asm has_side_effects "fence.proxy.async.shared::cta;", "" : () -> ()
        gpu.barrier
${ nv.previous("%slot") }
<% if selection %>
        // (slot 0 read before the pipeline's first tile: not computed)
${ nv.selected_block("%slot", "%slot_selected", "slot_") }
        %compute = arith.andi %has_previous, %slot_selected : i1
<% endif %>
        %o_next, %mx0_next, %mx1_next, %l0_next, %l1_next = scf.if ${ "%compute" if selection else "%has_previous" } -> (!hfw_o, f32, f32, f32, f32) {
<% if selection %>
          %key0 = arith.muli %slot_block, %block_size : index
<% elif WINDOW != "0" %>
          %tile_of_slot = arith.addi %first_tile, %slot : index
          %key0 = arith.muli %tile_of_slot, %block_size : index
<% else %>
          %key0 = arith.muli %slot, %block_size : index
<% endif %>
${ nv.dense_row_bounds() }
          %k_region = arith.constant ${HOPPER_K_OFFSET} : index
          %k_tile_bytes = arith.constant ${k_bytes} : index
          %k_buffer_bytes = arith.muli %buffer, %k_tile_bytes : index
          %k_offset = arith.addi %k_region, %k_buffer_bytes : index
${ wg.descriptor("k_desc", "%k_offset", 16, 1024) }
          %v_region = arith.constant ${HOPPER_V_OFFSET} : index
          %v_tile_bytes = arith.constant ${v_bytes} : index
          %v_buffer_bytes = arith.muli %${ "c0" if one_v else "buffer" }, %v_tile_bytes : index
          %v_offset = arith.addi %v_region, %v_buffer_bytes : index
${ wg.descriptor("v_desc", "%v_offset", (BS | int) * 128, 1024) }

          // s = q k^T over D in 16-column steps.
${ wg.chain("s", "%s_zero", "%q_desc", steps.q, "%k_desc", steps.k, BS, E, "col", "!hfw_s") }
${ wg.values("sv", "%s", s_values, "!hfw_s") }
          // x = s scale log2(e), -inf where the row does not see the key or is padding: value 4 i + 2 h + e is
          // row 8 h + r of the subgroup, key offset 8 i + 2 c + e.
<% for v in range(s_values) %>
<% set i, h, e = v // 4, (v // 2) % 2, v % 2 %>
          %j_${v}_base = arith.constant ${ 8 * i + e } : index
          %j_${v} = arith.addi %c2x, %j_${v}_base : index
          ${ rules.key_in_range("in_" ~ v, "j_" ~ v, "slt", "visible_" ~ h, "first_visible_" ~ h) }
          %live_${v} = arith.andi %in_${v}, %head_valid_${h} : i1
          %scaled_${v} = arith.mulf %sv_${v}, %scale_log2 : f32
          %x_${v} = arith.select %live_${v}, %scaled_${v}, %minus_inf : f32
<% endfor %>
<% for h in [0, 1] %>
          %lane_max_${h}_0 = arith.maximumf %x_${h * 2}, %x_${h * 2 + 1} : f32
<% for i in range(1, s_values // 4) %>
          %lane_max_${h}_${i}_a = arith.maximumf %x_${4 * i + 2 * h}, %x_${4 * i + 2 * h + 1} : f32
          %lane_max_${h}_${i} = arith.maximumf %lane_max_${h}_${i - 1}, %lane_max_${h}_${i}_a : f32
<% endfor %>
${ softmax.quad_reduce("%block_max_" ~ h, "%lane_max_" ~ h ~ "_" ~ (s_values // 4 - 1), "arith.maximumf") }
<% endfor %>
          // The running max moves as in the forward kernels (gpu/nvidia/softmax.mlir): then o and the sums are
          // rescaled.
${ softmax.moves(VOTE_ANY) }
          %o_ref, %max_ref_0, %max_ref_1, %l0_ref, %l1_ref = scf.if %any_grows -> (!hfw_o, f32, f32, f32, f32) {
${ softmax.rescale_factors(EX2) }
<% for v in range(o_values) %>
            %o_old_${v} = llvm.extractvalue %o_tile[${v}] : !hfw_o
            %o_scaled_${v} = arith.mulf %o_old_${v}, %alpha_${ (v // 2) % 2 } : f32
            %o_r${v} = llvm.insertvalue %o_scaled_${v}, ${ "%o_tile" if v == 0 else "%o_r" ~ (v - 1) }[${v}] : !hfw_o
<% endfor %>
            scf.yield %o_r${o_values - 1}, %new_max_0, %new_max_1, %l0_scaled, %l1_scaled : !hfw_o, f32, f32, f32, f32
          } else {
            scf.yield %o_tile, %mx0, %mx1, %l0, %l1 : !hfw_o, f32, f32, f32, f32
          }
${ softmax.reference_max() }
<% if p_registers %>
<% elif HOPPER_P_IN_K == "1" %>
          // p goes over the K tile just read (p_in_k): once every warpgroup's s is done.
          gpu.barrier
          %p_region = arith.divui %k_offset, %c4 : index
          %p_offset = arith.addi %k_offset, %q_offset : index
${ wg.descriptor("p_desc", "%p_offset", 16, 1024) }
<% else %>
          %p_region = arith.constant ${ (HOPPER_P_OFFSET | int) // 4 } : index
<% endif %>
<% if p_registers %>
          // p = 2^(x - max), its sums per lane, and p as pairs of the input type in registers: the pair of values
          // 4 i + 2 h (+ 1) is o += p v's A fragment word 2 (i mod 2) + h of k16 step i / 2.
<% else %>
          // p = 2^(x - max), its sums per lane, and p into workgroup memory as pairs of the input type: the pair
          // at row R = 16 w + 8 h + r, keys 8 i + 2 c (+ 1) is at byte (i / 8) rows 128 + 128 R + 16 ((i mod 8) ^ r)
          // + 4 c (wgmma.mlir's layout of a [rows, BS] tile).
${ wg.pair_words("p", "%p_region", rows, BS) }
<% endif %>
<% for v in range(0, s_values, 2) %>
<% set i, h = v // 4, (v // 2) % 2 %>
          %shifted_${v} = arith.subf %x_${v}, %safe_max_${h} : f32
          %shifted_${v + 1} = arith.subf %x_${v + 1}, %safe_max_${h} : f32
          %p_${v} = ${EX2} %shifted_${v} : (f32) -> f32
          %p_${v + 1} = ${EX2} %shifted_${v + 1} : (f32) -> f32
          %pair_sum_${v} = arith.addf %p_${v}, %p_${v + 1} : f32
          %packed_${v} = ${PACK_PAIR} %p_${v + 1}, %p_${v} : (f32, f32) -> i32
<% if not p_registers %>
          memref.store %packed_${v}, %words[%p_at_${i}_${h}] : !hfw_words
<% endif %>
<% endfor %>
<% for h in [0, 1] %>
          %psum_${h}_0 = arith.addf %l${h}_ref, %pair_sum_${2 * h} : f32
<% for i in range(1, s_values // 4) %>
          %psum_${h}_${i} = arith.addf %psum_${h}_${i - 1}, %pair_sum_${4 * i + 2 * h} : f32
<% endfor %>
<% endfor %>
<% if one_v %>
          // (one V buffer: this tile's V, staged after the previous tile's o += p v, has landed)
          nvvm.cp.async.wait.group 1
<% endif %>
<% if one_v or not p_registers %>
          llvm.inline_asm has_side_effects "fence.proxy.async.shared::cta;", "" : () -> ()
          gpu.barrier
<% endif %>
          // o += p v over the tile's keys in 16-key steps (v MN-major: its rows are the product's K).
<% if p_registers %>
${ wg.chain_registers("o_new", "%o_ref", "%packed_", "%v_desc", steps.v, DV, E, "row", "!hfw_o") }
<% else %>
${ wg.chain("o_new", "%o_ref", "%p_desc", steps.p, "%v_desc", steps.v, DV, E, "row", "!hfw_o") }
<% endif %>
          scf.yield %o_new, %max_ref_0, %max_ref_1, %psum_0_${s_values // 4 - 1}, %psum_1_${s_values // 4 - 1} : !hfw_o, f32, f32, f32, f32
        } else {
          scf.yield %o_tile, %mx0, %mx1, %l0, %l1 : !hfw_o, f32, f32, f32, f32
        }
        // The next iteration stages into the buffer just read.
        gpu.barrier
<% if one_v %>
        // One V buffer (HOPPER_V_BUFFERS 1): V of tile t goes into it now that o += p v of tile t - 1 has read it,
        // and lands while the next iteration makes s of tile t.
        scf.if %t_in_range {
${ nv.selected_block("%t", "%v_selected", "v_tile_") }
          scf.if %v_selected {
            %v_key0 = arith.muli %v_tile_block, %block_size : index
            %v_to_pos = arith.subi %pos, %v_key0 : index
            %v_visible = arith.addi %v_to_pos, %c1 : index
            %v_region = arith.constant ${ (HOPPER_V_OFFSET | int) // 2 } : index
${ wg.stage_keys("v", "!hfw_v", "%v_key0", "%v_visible", BS, DV, "%v_region", HOPPER_LANES, "!hfw_elements", ASYNC_COPY_HINT) }
          }
        }
        nvvm.cp.async.commit.group
<% endif %>
        scf.yield %o_next, %mx0_next, %mx1_next, %l0_next, %l1_next : !hfw_o, f32, f32, f32, f32
      }

      // o as the forward kernels' accumulator vector: element [0][tile][i][e] is value 4 tile + 2 i + e.
      %o_vector_zero = arith.constant dense<0.0> : !fwk_o_acc
<% for v in range(o_values) %>
      %o_value_${v} = llvm.extractvalue %o_struct[${v}] : !hfw_o
      %${ "o_acc" if v == o_values - 1 else "o_vec_" ~ v } = vector.insert %o_value_${v}, ${ "%o_vector_zero" if v == 0 else "%o_vec_" ~ (v - 1) }[0, ${v // 4}, ${(v // 2) % 2}, ${v % 2}] : f32 into !fwk_o_acc
<% endfor %>
${ softmax.rows_out() }
      return
    }
<% endcall %>

// Host side: one dispatch over the row tiles, o and lse written into the caller's tensors.
${ host.forward(exe, function, HOPPER_ROWS) }

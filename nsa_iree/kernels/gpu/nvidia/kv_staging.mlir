// Part of dq_kernel.mlir and forward_kernel.mlir (`// part: kv_staging`): the first half of loop iteration t,
// which stages slot t's K and V rows into buffer t mod STAGES with 16-byte asynchronous copies (rows past the
// last visible key zero-filled, not read; each lane's copies unrolled; chunk c of row j stored at chunk
// c ^ (j & mask), so the rows are unpadded and each 8 lanes fill one aligned 128-byte line: padded rows split
// the copies into about twice the L2 requests and ~45% more L2 -> SM bytes, bench/results/kernels_H200.md), commits one group (empty for a skipped slot or t >= T), waits
// for the group of the slot computed in this iteration and synchronises the workgroup.
// K and V rows, or K rows alone where staged_values is false (select_blocks). Slot t's block is `staged_block`'s (nv.selected_block for the selection kernels: the block a row selected; the
// dense forward's: tile t). Uses %t, %stages, %slots, %block_indices, %b, %m, %g, %last_visible_block, %pos, %tid, %lanes, %k_per_lane,
// %v_per_lane, %k, %v (types !dqk_k_block, !dqk_v_block), %k_swizzle_mask, %v_swizzle_mask,
// %k_rows, %v_rows and the constants.
<# part: takes ASYNC_COPY_HINT, DQ_STAGES_MINUS_1, staged_block, staged_values #>
        %stage_buffer = arith.remui %t, %stages : index
        %t_in_range = arith.cmpi ult, %t, %slots : index
        scf.if %t_in_range {
${ staged_block("%t", "%selected") }
          scf.if %selected {
            %key0 = arith.muli %block, %block_size : index
            %to_pos = arith.subi %pos, %key0 : index
            %visible = arith.addi %to_pos, %c1 : index
            // The block's rows as 2-d views (one base address per block; a lane's copies differ by constants).
            <# K (columns d0, D wide) then V (columns e0, Dv wide), or K alone (staged_values false): the same copies,
               each with its own sizes and swizzle. #>
            <% set staged = [("k", "%d0", D), ("v", "%e0", DV)] if staged_values else [("k", "%d0", D)] %>
            <% for x, col, width in staged %>
            %${x}_block = memref.subview %${x}[%b, %key0, %g, 0] [1, ${BS}, 1, ${width}] [1, 1, 1, 1] : !dqk_${x} to !dqk_${x}_block
            <% endfor %>
            // Item = (key j, chunk of 8 elements); lanes run along a row (coalesced). Where every row of the block
            // is visible and the lanes cover whole rows in a multiple of the swizzle's row period per pass (the
            // constants below fold), a lane's copies differ by constant offsets on both sides and take no test;
            // otherwise each copy tests its row (rows past the last visible key zero-filled, not read).
            %whole_block = arith.cmpi sge, %visible, %block_size : index
            <% for x, col, width in staged %>
            %${x}_rows_per_pass = arith.divui %lanes, %${x}_chunks : index
            %${x}_lanes_rem = arith.remui %lanes, %${x}_chunks : index
            %${x}_items_rem = arith.remui %${x}_items, %lanes : index
            %${x}_period_rem = arith.andi %${x}_rows_per_pass, %${x}_swizzle_mask : index
            %${x}_rem_01 = arith.ori %${x}_lanes_rem, %${x}_items_rem : index
            %${x}_rem_all = arith.ori %${x}_rem_01, %${x}_period_rem : index
            %${x}_regular = arith.cmpi eq, %${x}_rem_all, %c0 : index
            %${x}_untested = arith.andi %whole_block, %${x}_regular : i1
            scf.if %${x}_untested {
             %lane_j = arith.divui %tid, %${x}_chunks : index
             %lane_chunk = arith.remui %tid, %${x}_chunks : index
             ${col} = arith.muli %lane_chunk, %c8 : index
             %lane_bits = arith.andi %lane_j, %${x}_swizzle_mask : index
             %lane_swizzle = arith.muli %lane_bits, %c8 : index
             ${col}_stored = arith.xori ${col}, %lane_swizzle : index
             // The lane's chunks of the block as a view with one base address: copy i reads at a constant offset.
             %lane_src = memref.subview %${x}_block[%lane_j, ${col}] [%${x}_per_lane, 8] [%${x}_rows_per_pass, 1]
                 : !dqk_${x}_block to memref<?x8x${E}, strided<[?, 1], offset: ?>>
             scf.for %i = %c0 to %${x}_per_lane step %c1 {
              %i_rows = arith.muli %i, %${x}_rows_per_pass : index
              %j = arith.addi %lane_j, %i_rows : index
              %copy = nvgpu.device_async_copy %lane_src[%i, %c0], %${x}_rows[%stage_buffer, %j, ${col}_stored], 8 ${ASYNC_COPY_HINT}
                  : memref<?x8x${E}, strided<[?, 1], offset: ?>> to !dqk_${x}_rows
             } {unroll_loop}
            } else {
             scf.for %i = %c0 to %${x}_per_lane step %c1 {
              %i_lanes = arith.muli %i, %lanes : index
              %item = arith.addi %tid, %i_lanes : index
              %in_tile = arith.cmpi ult, %item, %${x}_items : index
              scf.if %in_tile {
               %chunk = arith.remui %item, %${x}_chunks : index
               %j = arith.divui %item, %${x}_chunks : index
               ${col} = arith.muli %chunk, %c8 : index
               %is_visible = arith.cmpi slt, %j, %visible : index
               %count = arith.select %is_visible, %c8, %c0 : index
               %row = arith.select %is_visible, %j, %c0 : index
               %j_bits = arith.andi %j, %${x}_swizzle_mask : index
               %swizzle = arith.muli %j_bits, %c8 : index
               ${col}_stored = arith.xori ${col}, %swizzle : index
               %copy = nvgpu.device_async_copy %${x}_block[%row, ${col}], %${x}_rows[%stage_buffer, %j, ${col}_stored], 8, %count ${ASYNC_COPY_HINT}
                   : !dqk_${x}_block to !dqk_${x}_rows
              }
             } {unroll_loop}
            }
            <% endfor %>
          }
        }
        nvvm.cp.async.commit.group
        nvvm.cp.async.wait.group ${DQ_STAGES_MINUS_1}
        gpu.barrier


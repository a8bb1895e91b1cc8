// Part of both GPU families' dk/dv kernels (gpu/nvidia/dkdv.mlir, gpu/portable/dkdv.mlir): the piece's block
// (%block, %b, %g, %key0, %h0, %offset, from its flat block id), then per row of the piece its query row m (-1 for
// padding), the last visible key of the block for it, and its weight (how many of its slots name the block: the
// inversion lists a row once, duplicates count twice). Uses %entries, %piece, %n, %m_rows, %block_size,
// %kv_heads, %heads_per_group, %block_indices, %tid, %lanes, %rows and the constants; fills %row_info
// (!dkv_row_info: per row [m, last, bits of the weight, 0], one 16-byte word).
<# part: takes nothing #>
<# With a window (WINDOW > 0) the row's fourth word is the block's first key it sees (rules.first_key). #>
<% import "common/rules.mlir" as rules %>
        // The piece's flat block fb = (b * G + g) * NB + i.
        %num_blocks = arith.ceildivui %n, %block_size : index
        %fb_i32 = memref.load %entries[%piece, %c0, %c1] : !dkv_entries
        %fb = arith.index_castui %fb_i32 : i32 to index
        %block = arith.remui %fb, %num_blocks : index
        %bg = arith.divui %fb, %num_blocks : index
        %g = arith.remui %bg, %kv_heads : index
        %b = arith.divui %bg, %kv_heads : index
        %block_i32 = arith.index_castui %block : index to i32
        %key0 = arith.muli %block, %block_size : index
        %h0 = arith.muli %g, %heads_per_group : index
        ${ rules.offset() }

        // Per piece row: its query row m (-1: padding), the last visible key of the block for it, and its
        // weight (how many of its slots name the block; the inversion lists the row once).
        scf.for %row = %tid to %rows step %lanes {
          %c_i32 = memref.load %entries[%piece, %row, %c0] : !dkv_entries
          %used = arith.cmpi sge, %c_i32, %c0_i32 : i32
          %c_safe_i32 = arith.maxsi %c_i32, %c0_i32 : i32
          %c_row = arith.index_castui %c_safe_i32 : i32 to index
          %bm = arith.divui %c_row, %kv_heads : index
          %m = arith.remui %bm, %m_rows : index
          ${ rules.position() }
          %last = arith.subi %pos, %key0 : index
          %last_i32 = arith.index_cast %last : index to i32
          %weight = scf.for %t = %c0 to %slots step %c1 iter_args(%acc = %zero) -> (f32) {
            %listed = memref.load %block_indices[%b, %m, %g, %t] : memref<?x?x${G}x${T}xi32>
            %same = arith.cmpi eq, %listed, %block_i32 : i32
            %inc = arith.select %same, %one, %zero : f32
            %next = arith.addf %acc, %inc : f32
            scf.yield %next : f32
          } {unroll_loop}
          %m_i32 = arith.index_cast %m : index to i32
          %m_or_none = arith.select %used, %m_i32, %minus_one : i32
          %weight_bits = arith.bitcast %weight : f32 to i32
          %info0 = vector.broadcast %c0_i32 : i32 to vector<4xi32>
          %info1 = vector.insert %m_or_none, %info0[0] : i32 into vector<4xi32>
          %info2 = vector.insert %last_i32, %info1[1] : i32 into vector<4xi32>
<% if WINDOW != "0" %>
          %info3 = vector.insert %weight_bits, %info2[2] : i32 into vector<4xi32>
          ${ rules.first_key("first") }
          %first_i32 = arith.index_cast %first : index to i32
          %info = vector.insert %first_i32, %info3[3] : i32 into vector<4xi32>
<% else %>
          %info = vector.insert %weight_bits, %info2[2] : i32 into vector<4xi32>
<% endif %>
          vector.store %info, %row_info[%row, %c0] : !dkv_row_info, vector<4xi32>
        }

<# Macros of the kernels over the block lists' pieces (imported as pieces): dkdv_tile.mlir's and
   forward_pieces.mlir's. #>

<# After gpu/piece_rows.mlir has filled %row_info: each row's log2 weight as its fourth word, and how many rows the
   piece has at word %count_word of %words (`words_t`); `first_slot`: also the first of the row's slots naming the
   block as its third word (the weight's, then read), where the row's partials go. #>
<% macro row_words(first_slot, words_t) %>
        // Each row's log2 weight as its fourth word (-inf for a padding row: its p is 0), and how many rows the
        // piece has (the inversion fills a piece from its first row on): written by the lane of the last one.
        scf.for %row = %tid to %rows step %lanes {
          %info = vector.load %row_info[%row, %c0] : !dkv_row_info, vector<4xi32>
          %info_m = vector.extract %info[0] : i32 from vector<4xi32>
          %info_weight = vector.extract %info[2] : i32 from vector<4xi32>
          %row_used = arith.cmpi sge, %info_m, %c0_i32 : i32
          %weight = arith.bitcast %info_weight : i32 to f32
          %weight_log2_any = math.log2 %weight : f32
          %single = arith.cmpf oeq, %weight, %one : f32
          %weight_log2 = arith.select %single, %zero, %weight_log2_any : f32
          %row_log2 = arith.select %row_used, %weight_log2, %minus_inf : f32
          %row_log2_bits = arith.bitcast %row_log2 : f32 to i32
          memref.store %row_log2_bits, %row_info[%row, %c3] : !dkv_row_info
<% if first_slot %>
          // the first of the row's slots that names the block as its third word (the weight's, now read): where
          // its partials go, [b, m, g, that slot] of dq_slots (dkdv_tile.mlir) or o_slots (forward_pieces.mlir)
          %info_m_safe = arith.maxsi %info_m, %c0_i32 : i32
          %slot_m = arith.index_castui %info_m_safe : i32 to index
          %slots_i32 = arith.constant ${T} : i32
          %first_slot = scf.for %t = %c0 to %slots step %c1 iter_args(%found = %slots_i32) -> (i32) {
            %listed = memref.load %block_indices[%b, %slot_m, %g, %t] : memref<?x?x${G}x${T}xi32>
            %same = arith.cmpi eq, %listed, %block_i32 : i32
            %none_yet = arith.cmpi eq, %found, %slots_i32 : i32
            %first_here = arith.andi %same, %none_yet : i1
            %t_i32 = arith.index_cast %t : index to i32
            %found_next = arith.select %first_here, %t_i32, %found : i32
            scf.yield %found_next : i32
          }
          memref.store %first_slot, %row_info[%row, %c2] : !dkv_row_info
<% endif %>
          %next = arith.addi %row, %c1 : index
          %next_in = arith.cmpi ult, %next, %rows : index
          %next_at = arith.select %next_in, %next, %c0 : index
          %next_m = memref.load %row_info[%next_at, %c0] : !dkv_row_info
          %next_listed = arith.cmpi sge, %next_m, %c0_i32 : i32
          %next_used = arith.andi %next_in, %next_listed : i1
          %is_last = arith.cmpi ugt, %row_used, %next_used : i1
          scf.if %is_last {
            %count_i32 = arith.index_cast %next : index to i32
            memref.store %count_i32, %words[%count_word] : ${words_t}
          }
        }
<% endmacro %>

<# The lane's accumulator values of row half `h` (values 4 i + 2 h and + 1: row 16 w + r + 8 h, columns 8 i + 2 c and
   + 1) stored as f32 pairs into a row's place of per-(row, slot) partials: `dest` (`dest_t`, [B, M, G, T, HPG,
   width]) at [%b, `m`, %g, `slot`, `head`, column], for the `count` values of accumulator `acc` (`acc_t`); names
   %`name`_<h>_<i>_*. dkdv_tile.mlir's dq partials and forward_pieces.mlir's o partials. #>
<% macro pair_stores(name, acc, acc_t, count, h, dest, dest_t, m, slot, head) %>
<% for i in range((count | int) // 4) %>
            %${name}_${h}_${i}_lo = llvm.extractvalue ${acc}[${ 4 * i + 2 * h }] : ${acc_t}
            %${name}_${h}_${i}_hi = llvm.extractvalue ${acc}[${ 4 * i + 2 * h + 1 }] : ${acc_t}
            %${name}_${h}_${i}_pair = vector.from_elements %${name}_${h}_${i}_lo, %${name}_${h}_${i}_hi : vector<2xf32>
            %${name}_${h}_${i}_col0 = arith.constant ${ 8 * i } : index
            %${name}_${h}_${i}_col = arith.addi %${name}_${h}_${i}_col0, %c2x : index
            vector.store %${name}_${h}_${i}_pair, ${dest}[%b, ${m}, %g, ${slot}, ${head}, %${name}_${h}_${i}_col] : ${dest_t}, vector<2xf32>
<% endfor %>
<% endmacro %>

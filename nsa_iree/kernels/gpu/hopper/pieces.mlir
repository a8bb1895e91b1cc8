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
   + 1) stored straight from the fragments as f32 pairs into a row's place of per-(row, slot) partials `dest`
   (`dest_t`, [B, M, G, T, HPG, width]) at [%b, `m`, %g, `slot`, `head`, column], for the `count` values of
   accumulator `acc` (`acc_t`); names %`name`_<h>_<i>_*. Each pair one 8-byte store (its alignment named: IREE's
   lowering would give the store the element's, and the PTX two 4-byte stores). Used for dkdv_tile.mlir's dq
   partials (staged_stores spilled more there and was slower: docs/performance.md). Needs %b, %g, %c2x. #>
<% macro pair_stores(name, acc, acc_t, count, h, dest, dest_t, m, slot, head) %>
<% for i in range((count | int) // 4) %>
            %${name}_${h}_${i}_lo = llvm.extractvalue ${acc}[${ 4 * i + 2 * h }] : ${acc_t}
            %${name}_${h}_${i}_hi = llvm.extractvalue ${acc}[${ 4 * i + 2 * h + 1 }] : ${acc_t}
            %${name}_${h}_${i}_pair = vector.from_elements %${name}_${h}_${i}_lo, %${name}_${h}_${i}_hi : vector<2xf32>
            %${name}_${h}_${i}_col0 = arith.constant ${ 8 * i } : index
            %${name}_${h}_${i}_col = arith.addi %${name}_${h}_${i}_col0, %c2x : index
            vector.store %${name}_${h}_${i}_pair, ${dest}[%b, ${m}, %g, ${slot}, ${head}, %${name}_${h}_${i}_col] alignment = 8 : ${dest_t}, vector<2xf32>
<% endfor %>
<% endmacro %>

<# The subgroup's 16 rows of accumulator `acc` (`acc_t`, `count` values a lane: columns 0 .. 2 count - 1) stored
   through workgroup memory in whole 16-byte segments of rows, `cols` columns a round (2 count / cols rounds):
   - the lane's 8-byte pairs written into the subgroup's quarter of `stage` (`stage_t`, [buffers, 4, 16 cols] f32, at
     [`buffer`, %subgroup, row cols + column]), 16-byte segment k of a row at segment k xor (row mod 8), so that
     neither the writes nor the reads meet a bank more often than their width needs;
   - once the subgroup's lanes have written (a warp barrier), read back a segment a lane, cols / 4 lanes a row, and
     stored to the row's place of per-(row, slot) partials `dest` (`dest_t`, [B, M, G, T, HPG, width]) at [%b, m, %g,
     slot, head, column]: row R of the 64-row chunk (16 %subgroup + the lane's row) is row `row0` + R / HPG of the
     piece, head R mod HPG, whose m and slot are words 0 and 2 of its %row_info (`!dkv_row_info`; m -1: a padding
     row, not stored).
   Stored from the fragments, a lane's pairs would give each store instruction 8 bytes a lane, 32 bytes of each of
   eight rows; here 512 bytes of whole rows (two rows at cols 64, four at 32). `cols`: a multiple of 32 (the
   swizzle stays within a row) up to 128 that divides 2 count. The caller frees `stage` first (every subgroup done
   reading it) and sizes a quarter at 16 cols floats or more. Needs %lane, %r, %c, %subgroup, %b, %g,
   %heads_per_group, %row_info, %c0, %c2, %c4, %c8, %c16, %c0_i32; names %`name`_*. #>
<% macro staged_stores(name, acc, acc_t, count, cols, stage, stage_t, buffer, dest, dest_t, row0) %>
<% set cols = cols | int %>
<% if cols % 32 or cols > 128 or (2 * (count | int)) % cols %>
${ fail("gpu/hopper/pieces.mlir staged_stores: cols must be a multiple of 32 up to 128 dividing the row's " ~ 2 * (count | int) ~ " columns, not " ~ cols) }
<% endif %>
<% set lanes_per_row = cols // 4 %>
<% set rows_per_read = 32 // lanes_per_row %>
          %${name}_all_lanes = arith.constant -1 : i32
          %${name}_cols = arith.constant ${cols} : index
          // the lane's fragment rows r and r + 8 (their segments xor r), and its read-back segment and first row
          %${name}_half = arith.divui %c, %c2 : index
          %${name}_odd = arith.remui %c, %c2 : index
          %${name}_odd2 = arith.muli %${name}_odd, %c2 : index
          %${name}_x = arith.xori %${name}_half, %r : index
<% for h in range(2) %>
          %${name}_row_${h}_at = arith.constant ${ 8 * h } : index
          %${name}_row_${h} = arith.addi %r, %${name}_row_${h}_at : index
          %${name}_row_${h}_base0 = arith.muli %${name}_row_${h}, %${name}_cols : index
          %${name}_row_${h}_base = arith.addi %${name}_row_${h}_base0, %${name}_odd2 : index
<% endfor %>
          %${name}_lanes_per_row = arith.constant ${lanes_per_row} : index
          %${name}_segment = arith.remui %lane, %${name}_lanes_per_row : index
          %${name}_segment_col = arith.muli %${name}_segment, %c4 : index
          %${name}_read_row0 = arith.divui %lane, %${name}_lanes_per_row : index
          %${name}_w16 = arith.muli %subgroup, %c16 : index
<% for j in range(16 // rows_per_read) %>
          %${name}_read_${j}_at = arith.constant ${ j * rows_per_read } : index
          %${name}_read_${j} = arith.addi %${name}_read_row0, %${name}_read_${j}_at : index
          %${name}_read_${j}_low = arith.remui %${name}_read_${j}, %c8 : index
          %${name}_read_${j}_phys = arith.xori %${name}_segment, %${name}_read_${j}_low : index
          %${name}_read_${j}_phys4 = arith.muli %${name}_read_${j}_phys, %c4 : index
          %${name}_read_${j}_base = arith.muli %${name}_read_${j}, %${name}_cols : index
          %${name}_read_${j}_index = arith.addi %${name}_read_${j}_base, %${name}_read_${j}_phys4 : index
          %${name}_read_${j}_chunk_row = arith.addi %${name}_w16, %${name}_read_${j} : index
          %${name}_read_${j}_in = arith.divui %${name}_read_${j}_chunk_row, %heads_per_group : index
          %${name}_read_${j}_piece_row = arith.addi ${row0}, %${name}_read_${j}_in : index
          %${name}_read_${j}_head = arith.remui %${name}_read_${j}_chunk_row, %heads_per_group : index
<% endfor %>
<% for p in range((2 * (count | int)) // cols) %>
<% if p > 0 %>
          // (the previous round read back by every lane of the subgroup)
          nvvm.bar.warp.sync %${name}_all_lanes : i32
<% endif %>
<% for i in range(cols // 8) %>
<% set value = 4 * (p * (cols // 8) + i) %>
          %${name}_${p}_${i}_swizzled = arith.constant ${ 2 * i } : index
          %${name}_${p}_${i}_phys = arith.xori %${name}_${p}_${i}_swizzled, %${name}_x : index
          %${name}_${p}_${i}_phys4 = arith.muli %${name}_${p}_${i}_phys, %c4 : index
<% for h in range(2) %>
          %${name}_${p}_${i}_${h}_lo = llvm.extractvalue ${acc}[${ value + 2 * h }] : ${acc_t}
          %${name}_${p}_${i}_${h}_hi = llvm.extractvalue ${acc}[${ value + 2 * h + 1 }] : ${acc_t}
          %${name}_${p}_${i}_${h}_pair = vector.from_elements %${name}_${p}_${i}_${h}_lo, %${name}_${p}_${i}_${h}_hi : vector<2xf32>
          %${name}_${p}_${i}_${h}_at = arith.addi %${name}_row_${h}_base, %${name}_${p}_${i}_phys4 : index
          vector.store %${name}_${p}_${i}_${h}_pair, ${stage}[${buffer}, %subgroup, %${name}_${p}_${i}_${h}_at] alignment = 8 : ${stage_t}, vector<2xf32>
<% endfor %>
<% endfor %>
          nvvm.bar.warp.sync %${name}_all_lanes : i32
          %${name}_${p}_col0 = arith.constant ${ p * cols } : index
          %${name}_${p}_col = arith.addi %${name}_${p}_col0, %${name}_segment_col : index
<% for j in range(16 // rows_per_read) %>
          %${name}_${p}_${j}_info = vector.load %row_info[%${name}_read_${j}_piece_row, %c0] : !dkv_row_info, vector<4xi32>
          %${name}_${p}_${j}_m_i32 = vector.extract %${name}_${p}_${j}_info[0] : i32 from vector<4xi32>
          %${name}_${p}_${j}_real = arith.cmpi sge, %${name}_${p}_${j}_m_i32, %c0_i32 : i32
          scf.if %${name}_${p}_${j}_real {
            %${name}_${p}_${j}_slot_i32 = vector.extract %${name}_${p}_${j}_info[2] : i32 from vector<4xi32>
            %${name}_${p}_${j}_m = arith.index_castui %${name}_${p}_${j}_m_i32 : i32 to index
            %${name}_${p}_${j}_slot = arith.index_castui %${name}_${p}_${j}_slot_i32 : i32 to index
            %${name}_${p}_${j}_values = vector.load ${stage}[${buffer}, %subgroup, %${name}_read_${j}_index] alignment = 16 : ${stage_t}, vector<4xf32>
            vector.store %${name}_${p}_${j}_values, ${dest}[%b, %${name}_${p}_${j}_m, %g, %${name}_${p}_${j}_slot, %${name}_read_${j}_head, %${name}_${p}_col] alignment = 16 : ${dest_t}, vector<4xf32>
          }
<% endfor %>
<% endfor %>
<% endmacro %>

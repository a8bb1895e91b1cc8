// dk/dv pass on CPUs (two-pass, block-major, no atomics): one hand-written dispatch, one work item per piece of
// the inverted lists of @invert_block_indices (up to ROWS_PER_PIECE query rows that selected one kv block, in
// increasing m), so that a block many rows select (block 0, or a tile of compressed keys every later row sees)
// spreads over the cores. Vectors run along the block's BS keys for the scores and along the head dims for the
// products into dk and dv:
//   S[h, :]  = scale * sum_d q[row, h, d] * kT[d, :]    (each q element a scalar broadcast over the keys)
//   P[h, :]  = w * exp(S[h, :] - lse[h])                (visible keys; w: how often the row lists the block)
//   dP[h, :] = sum_e do[row, h, e] * vT[e, :];  DS = P * (dP - delta[h])
//   dv[j, :] += sum_h P[h, j] * do[row, h, :];  dk[j, :] += sum_h DS[h, j] * q[row, h, :]
// (CPU_KROWS keys times CPU_VCOLS / CPU_KCOLS head elements per register block.) Each piece's dk (times scale)
// and dv stay in its f32 partial row [BS, D + Dv]; @dkdv_piece_sums adds a block's partials in piece order
// (bitwise reproducible) and rounds them once to the input type.
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/host.mlir" as host %>
<% import "cpu/host.mlir" as cpu %>
<% import "cpu/products.mlir" as products %>
<% import "cpu/rows.mlir" as rows %>
<% import "common/rules.mlir" as rules %>

// Push constants: B, M, N, the number of pieces (i32), then the bits of scale (f32).
<% set inputs = ['q', 'do', ("kT", "memref<?x" ~ D ~ "x" ~ BS ~ "x" ~ E ~ ">{%flat_blocks}", "key_blocks_t [B * G * NB, D, BS] (mlir/cpu_blocks.mlir)"), ("vT", "memref<?x" ~ DV ~ "x" ~ BS ~ "x" ~ E ~ ">{%flat_blocks}", "value_blocks_t [B * G * NB, Dv, BS]"), 'block_indices', 'lse', 'delta', 'entries'] %>
<% set outputs = [("acc", "memref<?x" ~ BS ~ "x" ~ CPU_DKV ~ "xf32>{%pieces}", "f32 partials [pieces, BS, D + Dv]: each piece's dk (times scale), then dv")] %>
${ dispatch.layout("dkdv_cpu_layout", 5, inputs, outputs) }

<% call dispatch.executable("selection_attention_dkdv_cpu_exe", "selection_attention_dkdv_cpu_piece", "dkdv_cpu_layout", ['pieces']) %>
<% call rows.function("selection_attention_dkdv_cpu_piece") %>
      %c0_i32 = arith.constant 0 : i32
      %zero = arith.constant 0.0 : f32
      %one = arith.constant 1.0 : f32
<% endcall %>
      %rows_per_piece = arith.constant ${ROWS_PER_PIECE} : index
${ products.constants(CPU_KROWS, CPU_VCOLS, CPU_KCOLS, CPU_SROWS) }

${ dispatch.ids(['piece']) }
      %batch_i32 = hal.interface.constant.load layout(#dkdv_cpu_layout) ordinal(0) : i32
      %m_rows_i32 = hal.interface.constant.load layout(#dkdv_cpu_layout) ordinal(1) : i32
      %n_i32 = hal.interface.constant.load layout(#dkdv_cpu_layout) ordinal(2) : i32
      %pieces_i32 = hal.interface.constant.load layout(#dkdv_cpu_layout) ordinal(3) : i32
      %batch = arith.index_castui %batch_i32 : i32 to index
      %m_rows = arith.index_castui %m_rows_i32 : i32 to index
      %n = arith.index_castui %n_i32 : i32 to index
      %pieces = arith.index_castui %pieces_i32 : i32 to index
      %scale_bits = hal.interface.constant.load layout(#dkdv_cpu_layout) ordinal(4) : i32
      %scale = arith.bitcast %scale_bits : i32 to f32
      %num_blocks = arith.ceildivui %n, %block_size : index
      %bg_count = arith.muli %batch, %kv_heads : index
      %flat_blocks = arith.muli %bg_count, %num_blocks : index

${ dispatch.bindings("dkdv_cpu_layout", inputs, outputs) }

      %s_tile = memref.alloca() : memref<${HPG}x${BS}xf32>
      %dp_tile = memref.alloca() : memref<${HPG}x${BS}xf32>

      // The piece's flat block f = (b * G + g) * NB + i, from its first entry; (-1, -1) marks a piece past the
      // used ones, which no block's sum reads.
      %f_i32 = memref.load %entries[%piece, %c0, %c1] : memref<?x${ROWS_PER_PIECE}x2xi32>
      %in_use = arith.cmpi sge, %f_i32, %c0_i32 : i32
      scf.if %in_use {
        %f = arith.index_cast %f_i32 : i32 to index
        %i = arith.remui %f, %num_blocks : index
        %bg_g = arith.divui %f, %num_blocks : index
        %g = arith.remui %bg_g, %kv_heads : index
        %b = arith.divui %bg_g, %kv_heads : index
        %h_first = arith.muli %g, %heads_per_group : index
        %key0 = arith.muli %i, %block_size : index
        %block_i32 = arith.index_cast %i : index to i32
        ${ rules.offset() }

        // The piece's partial row starts at 0: dk in columns [0, D), dv in [D, D + Dv).
        %zero_row = arith.constant dense<0.0> : vector<${CPU_DKV}xf32>
        scf.for %j = %c0 to %block_size step %c1 {
          vector.store %zero_row, %acc[%piece, %j, %c0] : memref<?x${BS}x${CPU_DKV}xf32>, vector<${CPU_DKV}xf32>
        }

        scf.for %r = %c0 to %rows_per_piece step %c1 {
          %c_i32 = memref.load %entries[%piece, %r, %c0] : memref<?x${ROWS_PER_PIECE}x2xi32>
          %used = arith.cmpi sge, %c_i32, %c0_i32 : i32
          scf.if %used {
            %c = arith.index_cast %c_i32 : i32 to index
            %row = arith.divui %c, %kv_heads : index
            %m = arith.remui %row, %m_rows : index
            // w: how often the row lists this block; visible: its keys <= pos(m) in the block.
            %w = scf.for %t = %c0 to %slots step %c1 iter_args(%sum = %zero) -> (f32) {
              %listed = memref.load %block_indices[%b, %m, %g, %t] : memref<?x?x${G}x${T}xi32>
              %same = arith.cmpi eq, %listed, %block_i32 : i32
              %inc = arith.select %same, %one, %zero : f32
              %next = arith.addf %sum, %inc : f32
              scf.yield %next : f32
            }
            ${ rules.position() }
            %to_pos = arith.subi %pos, %key0 : index
            %to_pos_inclusive = arith.addi %to_pos, %c1 : index
            %visible = arith.minsi %to_pos_inclusive, %block_size : index
            %visible_v = vector.broadcast %visible : index to vector<${BS}xindex>
<% if WINDOW != "0" %>
            ${ rules.first_key("window_first") }
            %first_v = vector.broadcast %window_first : index to vector<${BS}xindex>
<% endif %>
            ${ rules.key_in_range("key_mask", "key_iota", "slt", "visible_v", "first_v", "vector<" ~ BS ~ "xindex>", "vector<" ~ BS ~ "xi1>") }

            // S and dP over the visible keys (a whole or half block), their key vectors accumulating in registers.
${ products.visible_scores(CPU_SROWS, CPU_SROWS_HALF) | indent(2, true) }
            // P = w * exp(S - lse) on visible keys (0 elsewhere, never NaN), DS = P * (dP - delta): in place.
            %w_v = vector.broadcast %w : f32 to vector<${BS}xf32>
${ products.p_ds(true) | indent(2, true) }
            // dv[j, :] += sum_h P[h, j] do[h, :] and dk[j, :] += sum_h DS[h, j] q[h, :] over the visible keys,
            // CPU_KROWS keys times CPU_VCOLS (CPU_KCOLS) elements per register block.
${ products.add_to_acc(CPU_KROWS, CPU_VCOLS, CPU_KCOLS, CPU_DKV, at="piece") }
          }
        }

${ products.scale_dk("piece", CPU_DKV) }
      }
      return
    }
<% endcall %>

${ host.dkdv_signature() }
<% call host.sizes() %>
  %kv_heads = arith.constant ${G} : index
  %block_size = arith.constant ${BS} : index
<% endcall %>
  %pieces = tensor.dim %entries, %c0 : tensor<?x${ROWS_PER_PIECE}x2xi32>
${ cpu.flat_blocks() }

${ cpu.blocks_t() }

${ host.push_constants(pieces=true) }
  %partials = flow.dispatch @selection_attention_dkdv_cpu_exe::@selection_attention_dkdv_cpu_piece[%pieces](
      %batch_i32, %m_rows_i32, %n_i32, %pieces_i32, %scale_bits, %q, %do, %key_blocks_t, %value_blocks_t,
      %block_indices, %lse, %delta, %entries)
      : (i32, i32, i32, i32, i32, ${ dispatch.tensor_types(inputs) })
      -> ${ dispatch.tensor_types(outputs) }
${ cpu.piece_sums("partials") }
  return %dk, %dv : tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
}

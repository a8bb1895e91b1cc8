// dk/dv pass (block-major, no atomics), over the pieces made by @invert_block_indices.
// A piece is up to ROWS_PER_PIECE query rows that selected one kv block. For each piece, with the block's
// K/V tile and the piece's gathered q, do, lse and delta rows:
//   s = q k^T, p = w * exp(scale * s - lse) on visible keys (w: how often the row lists the block),
//   dv_piece = p^T do;  dp = do v^T, ds = p * (dp - delta), dk_piece = scale * ds^T q.
// dv and dk are two dispatch regions (IREE 3.13 accepts one root contraction per region); each recomputes s.
// The pieces of a block are then summed in piece order, so dk/dv are bitwise reproducible.
<% import "common/contraction.mlir" as contraction %>
<% import "common/host.mlir" as host %>
<% import "linalg/host.mlir" as linalg %>
<% import "common/rules.mlir" as rules %>
${ host.dkdv_signature() }
<% call host.sizes() %>
  %c0_i32 = arith.constant 0 : i32
  %zero = arith.constant 0.0 : f32
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
<% endcall %>
  %pieces = tensor.dim %entries, %c0 : tensor<?x${ROWS_PER_PIECE}x2xi32>
  %num_blocks = arith.ceildivui %n, %block_size : index
  ${ rules.offset() }
  %rows_total = arith.muli %batch, %m_rows : index
  %row_groups = arith.muli %rows_total, %kv_heads : index

${ linalg.kv_blocks() }

  // Row-group views: row c = (b * M + m) * G + g holds the HPG heads of group g of query row m.
  %q_grouped = tensor.expand_shape %q [[0], [1], [2, 3], [4]] output_shape [%batch, %m_rows, ${G}, ${HPG}, ${D}]
      : tensor<?x?x${H}x${D}x${E}> into tensor<?x?x${G}x${HPG}x${D}x${E}>
  %q_rows = tensor.collapse_shape %q_grouped [[0, 1, 2], [3], [4]]
      : tensor<?x?x${G}x${HPG}x${D}x${E}> into tensor<?x${HPG}x${D}x${E}>
  %do_grouped = tensor.expand_shape %do [[0], [1], [2, 3], [4]] output_shape [%batch, %m_rows, ${G}, ${HPG}, ${DV}]
      : tensor<?x?x${H}x${DV}x${E}> into tensor<?x?x${G}x${HPG}x${DV}x${E}>
  %do_rows = tensor.collapse_shape %do_grouped [[0, 1, 2], [3], [4]]
      : tensor<?x?x${G}x${HPG}x${DV}x${E}> into tensor<?x${HPG}x${DV}x${E}>
  // lse is head-major [B, H, M]; the row gathers below want it row-major, as delta already is.
  %lse_grouped = tensor.expand_shape %lse [[0], [1, 2], [3]] output_shape [%batch, ${G}, ${HPG}, %m_rows]
      : tensor<?x${H}x?xf32> into tensor<?x${G}x${HPG}x?xf32>
  %stats_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}xf32>
  %lse_t = linalg.transpose ins(%lse_grouped : tensor<?x${G}x${HPG}x?xf32>)
      outs(%stats_init : tensor<?x?x${G}x${HPG}xf32>) permutation = [0, 3, 1, 2]
  %lse_rows = tensor.collapse_shape %lse_t [[0, 1, 2], [3]] : tensor<?x?x${G}x${HPG}xf32> into tensor<?x${HPG}xf32>
  %delta_grouped = tensor.expand_shape %delta [[0], [1], [2, 3]] output_shape [%batch, %m_rows, ${G}, ${HPG}]
      : tensor<?x?x${H}xf32> into tensor<?x?x${G}x${HPG}xf32>
  %delta_rows = tensor.collapse_shape %delta_grouped [[0, 1, 2], [3]] : tensor<?x?x${G}x${HPG}xf32> into tensor<?x${HPG}xf32>

  // Per piece: which key block it reads. Per piece row: which row group, how often that row lists the
  // block (its weight; 0 pads the piece) and the last visible key of the block (-1 when none).
  %piece_block_init = tensor.empty(%pieces) : tensor<?xi32>
  %piece_block = linalg.generic {
      indexing_maps = [affine_map<(p) -> (p)>], iterator_types = ["parallel"]}
      outs(%piece_block_init : tensor<?xi32>) {
  ^bb0(%out: i32):
    %p = linalg.index 0 : index
    %fb = tensor.extract %entries[%p, %c0, %c1] : tensor<?x${ROWS_PER_PIECE}x2xi32>
    %safe = arith.maxsi %fb, %c0_i32 : i32
    linalg.yield %safe : i32
  } -> tensor<?xi32>
  %row_init = tensor.empty(%pieces) : tensor<?x${ROWS_PER_PIECE}xi32>
  %weight_init = tensor.empty(%pieces) : tensor<?x${ROWS_PER_PIECE}xf32>
  %row_index, %last_key, %weight = linalg.generic {
      indexing_maps = [affine_map<(p, r) -> (p)>, affine_map<(p, r) -> (p, r)>, affine_map<(p, r) -> (p, r)>,
                       affine_map<(p, r) -> (p, r)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%piece_block : tensor<?xi32>)
      outs(%row_init, %row_init, %weight_init : tensor<?x${ROWS_PER_PIECE}xi32>, tensor<?x${ROWS_PER_PIECE}xi32>, tensor<?x${ROWS_PER_PIECE}xf32>) {
  ^bb0(%fb_i32: i32, %o1: i32, %o2: i32, %o3: f32):
    %p = linalg.index 0 : index
    %r = linalg.index 1 : index
    %c_i32 = tensor.extract %entries[%p, %r, %c0] : tensor<?x${ROWS_PER_PIECE}x2xi32>
    %used = arith.cmpi sge, %c_i32, %c0_i32 : i32
    // A padding row re-reads the piece's first row (weight 0): a row of this block's list, so a NaN it
    // carries (0 * NaN) is one that row already brings to the block, never one from an unrelated row.
    %first_i32 = tensor.extract %entries[%p, %c0, %c0] : tensor<?x${ROWS_PER_PIECE}x2xi32>
    %pad_row_i32 = arith.maxsi %first_i32, %c0_i32 : i32
    %c_safe_i32 = arith.select %used, %c_i32, %pad_row_i32 : i32
    %c_row = arith.index_cast %c_safe_i32 : i32 to index
    %fb = arith.index_cast %fb_i32 : i32 to index
    %block = arith.remui %fb, %num_blocks : index
    %g = arith.remui %c_row, %kv_heads : index
    %bm = arith.divui %c_row, %kv_heads : index
    %m = arith.remui %bm, %m_rows : index
    %b = arith.divui %bm, %m_rows : index
    ${ rules.position() }
    %key0 = arith.muli %block, %block_size : index
    %last = arith.subi %pos, %key0 : index
    %last_i32 = arith.index_cast %last : index to i32
${ rules.key_code("last_key_here", "last_i32", "used") }
    %block_i32 = arith.index_cast %block : index to i32
    %one = arith.constant 1.0 : f32
    %slot_count = arith.constant ${T} : index
    %count = scf.for %t = %c0 to %slot_count step %c1 iter_args(%acc = %zero) -> (f32) {
      %listed = tensor.extract %block_indices[%b, %m, %g, %t] : tensor<?x?x${G}x${T}xi32>
      %same = arith.cmpi eq, %listed, %block_i32 : i32
      %inc = arith.select %same, %one, %zero : f32
      %next = arith.addf %acc, %inc : f32
      scf.yield %next : f32
    }
    %w = arith.select %used, %count, %zero : f32
    linalg.yield %c_safe_i32, %last_key_here, %w : i32, i32, f32
  } -> (tensor<?x${ROWS_PER_PIECE}xi32>, tensor<?x${ROWS_PER_PIECE}xi32>, tensor<?x${ROWS_PER_PIECE}xf32>)

<# In a piece region's elementwise body (%sv, %l, %last, %w of the element): %p = w exp(scale s - lse) where key j is
   visible to the row (j <= last), else 0. #>
<% macro piece_p() %>
      %j = linalg.index 3 : index
      %j_i32 = arith.index_cast %j : index to i32
${ rules.key_visible("visible", "j_i32", "last") }
      %scaled = arith.mulf %sv, %scale : f32
      %shifted = arith.subf %scaled, %l : f32
      %e_s = math.exp %shifted : f32
      %weighted = arith.mulf %w, %e_s : f32
      %p = arith.select %visible, %weighted, %zero : f32
<% endmacro %>

<# %`name` [pieces, ROWS_PER_PIECE, HPG, BS] = the piece rows' %`rows` times the block's %`tile` over their `dim`
   (loop `index`) into %sc_zero (lowering attributes `config`): s = q k^T, dp = do v^T. #>
<% macro rows_by_keys(name, rows, tile, dim, index, config) %>
    %${name} = linalg.generic {
        indexing_maps = [affine_map<(p, r, h, j, ${index}) -> (p, r, h, ${index})>, affine_map<(p, r, h, j, ${index}) -> (p, j, ${index})>,
                         affine_map<(p, r, h, j, ${index}) -> (p, r, h, j)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]
        ${config}}
        ins(%${rows}, %${tile} : tensor<?x${ROWS_PER_PIECE}x${HPG}x${dim}x${E}>, tensor<?x${BS}x${dim}x${E}>)
        outs(%sc_zero : tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}xf32>) {
${ contraction.mul_add("    ") }
    } -> tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}xf32>
<% endmacro %>

<# In a piece region: the piece's gathered q, do and lse rows (%q_sel, %do_sel, %lse_sel), its block's K tile
   (%k_tile) and %s = q k^T [pieces, ROWS_PER_PIECE, HPG, BS] (lowering attributes `config`). #>
<% macro piece_scores(config) %>
    %pr_init = tensor.empty(%pieces) : tensor<?x${ROWS_PER_PIECE}x${HPG}x${D}x${E}>
    %q_sel = iree_linalg_ext.gather dimension_map = [0]
        ins(%q_rows, %row_index : tensor<?x${HPG}x${D}x${E}>, tensor<?x${ROWS_PER_PIECE}xi32>)
        outs(%pr_init : tensor<?x${ROWS_PER_PIECE}x${HPG}x${D}x${E}>) -> tensor<?x${ROWS_PER_PIECE}x${HPG}x${D}x${E}>
    %kt_init = tensor.empty(%pieces) : tensor<?x${BS}x${D}x${E}>
    %k_tile = iree_linalg_ext.gather dimension_map = [0]
        ins(%key_blocks, %piece_block : tensor<?x${BS}x${D}x${E}>, tensor<?xi32>)
        outs(%kt_init : tensor<?x${BS}x${D}x${E}>) -> tensor<?x${BS}x${D}x${E}>
    %dr_init = tensor.empty(%pieces) : tensor<?x${ROWS_PER_PIECE}x${HPG}x${DV}x${E}>
    %do_sel = iree_linalg_ext.gather dimension_map = [0]
        ins(%do_rows, %row_index : tensor<?x${HPG}x${DV}x${E}>, tensor<?x${ROWS_PER_PIECE}xi32>)
        outs(%dr_init : tensor<?x${ROWS_PER_PIECE}x${HPG}x${DV}x${E}>) -> tensor<?x${ROWS_PER_PIECE}x${HPG}x${DV}x${E}>
    %st_init = tensor.empty(%pieces) : tensor<?x${ROWS_PER_PIECE}x${HPG}xf32>
    %lse_sel = iree_linalg_ext.gather dimension_map = [0]
        ins(%lse_rows, %row_index : tensor<?x${HPG}xf32>, tensor<?x${ROWS_PER_PIECE}xi32>)
        outs(%st_init : tensor<?x${ROWS_PER_PIECE}x${HPG}xf32>) -> tensor<?x${ROWS_PER_PIECE}x${HPG}xf32>
    %sc_init = tensor.empty(%pieces) : tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}xf32>
    %sc_zero = linalg.fill ins(%zero : f32) outs(%sc_init : tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}xf32>)
        -> tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}xf32>
${ rows_by_keys("s", "q_sel", "k_tile", D, "d", config) }<% endmacro %>

<# A region's root and its result: %`name`_piece [pieces, BS, `dim`] f32 = sum over the piece's rows and heads of
   %`weights` [.., HPG, BS] (p or ds) times %`rows` [.., HPG, `dim`] (do or q), lowering attributes `config`. #>
<% macro piece_root(name, weights, rows, index, dim, config) %>
    %${name}_init = tensor.empty(%pieces) : tensor<?x${BS}x${dim}xf32>
    %${name}_zero = linalg.fill ins(%zero : f32) outs(%${name}_init : tensor<?x${BS}x${dim}xf32>) -> tensor<?x${BS}x${dim}xf32>
    %${name}_piece = linalg.generic {
        indexing_maps = [affine_map<(p, j, ${index}, r, h) -> (p, r, h, j)>, affine_map<(p, j, ${index}, r, h) -> (p, r, h, ${index})>,
                         affine_map<(p, j, ${index}, r, h) -> (p, j, ${index})>],
        iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]
        ${config}}
        ins(%${weights}, %${rows} : tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}x${E}>, tensor<?x${ROWS_PER_PIECE}x${HPG}x${dim}x${E}>)
        outs(%${name}_zero : tensor<?x${BS}x${dim}xf32>) {
${ contraction.mul_add("    ") }
    } -> tensor<?x${BS}x${dim}xf32>
    flow.return %${name}_piece : tensor<?x${BS}x${dim}xf32>
<% endmacro %>

  // ---- dv: p^T do per piece. (The gathers and p below are repeated in the dk region: one root per region.)
  %dv_pieces = flow.dispatch.region -> (tensor<?x${BS}x${DV}xf32>{%pieces}) {
${ piece_scores(DV_SCORES_CONFIG) }
    %pe_init = tensor.empty(%pieces) : tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}x${E}>
    %p_e = linalg.generic {
        indexing_maps = [affine_map<(p, r, h, j) -> (p, r, h, j)>, affine_map<(p, r, h, j) -> (p, r, h)>,
                         affine_map<(p, r, h, j) -> (p, r)>, affine_map<(p, r, h, j) -> (p, r)>,
                         affine_map<(p, r, h, j) -> (p, r, h, j)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
        ins(%s, %lse_sel, %last_key, %weight : tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}xf32>,
            tensor<?x${ROWS_PER_PIECE}x${HPG}xf32>, tensor<?x${ROWS_PER_PIECE}xi32>, tensor<?x${ROWS_PER_PIECE}xf32>)
        outs(%pe_init : tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}x${E}>) {
    ^bb0(%sv: f32, %l: f32, %last: i32, %w: f32, %out: ${E}):
${ piece_p() }
      %p_e_value = ${TRUNCF} %p : f32 to ${E}
      linalg.yield %p_e_value : ${E}
    } -> tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}x${E}>
${ piece_root("dv", "p_e", "do_sel", "e", DV, DV_ROOT_CONFIG) }
  }

  // ---- dk: scale * ds^T q per piece, ds = p * (dp - delta), dp = do v^T.
  %dk_pieces = flow.dispatch.region -> (tensor<?x${BS}x${D}xf32>{%pieces}) {
${ piece_scores(DK_SCORES_CONFIG) }
    %vt_init = tensor.empty(%pieces) : tensor<?x${BS}x${DV}x${E}>
    %v_tile = iree_linalg_ext.gather dimension_map = [0]
        ins(%value_blocks, %piece_block : tensor<?x${BS}x${DV}x${E}>, tensor<?xi32>)
        outs(%vt_init : tensor<?x${BS}x${DV}x${E}>) -> tensor<?x${BS}x${DV}x${E}>
    %delta_sel = iree_linalg_ext.gather dimension_map = [0]
        ins(%delta_rows, %row_index : tensor<?x${HPG}xf32>, tensor<?x${ROWS_PER_PIECE}xi32>)
        outs(%st_init : tensor<?x${ROWS_PER_PIECE}x${HPG}xf32>) -> tensor<?x${ROWS_PER_PIECE}x${HPG}xf32>
${ rows_by_keys("dp", "do_sel", "v_tile", DV, "e", DK_DP_CONFIG) }    %dse_init = tensor.empty(%pieces) : tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}x${E}>
    %ds_e = linalg.generic {
        indexing_maps = [affine_map<(p, r, h, j) -> (p, r, h, j)>, affine_map<(p, r, h, j) -> (p, r, h, j)>,
                         affine_map<(p, r, h, j) -> (p, r, h)>, affine_map<(p, r, h, j) -> (p, r, h)>,
                         affine_map<(p, r, h, j) -> (p, r)>, affine_map<(p, r, h, j) -> (p, r)>,
                         affine_map<(p, r, h, j) -> (p, r, h, j)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
        ins(%s, %dp, %lse_sel, %delta_sel, %last_key, %weight : tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}xf32>,
            tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}xf32>, tensor<?x${ROWS_PER_PIECE}x${HPG}xf32>,
            tensor<?x${ROWS_PER_PIECE}x${HPG}xf32>, tensor<?x${ROWS_PER_PIECE}xi32>, tensor<?x${ROWS_PER_PIECE}xf32>)
        outs(%dse_init : tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}x${E}>) {
    ^bb0(%sv: f32, %dpv: f32, %l: f32, %dl: f32, %last: i32, %w: f32, %out: ${E}):
${ piece_p() }
      %dp_minus_delta = arith.subf %dpv, %dl : f32
      %ds_raw = arith.mulf %p, %dp_minus_delta : f32
      %ds_scaled = arith.mulf %ds_raw, %scale : f32
      %ds_value = ${TRUNCF} %ds_scaled : f32 to ${E}
      linalg.yield %ds_value : ${E}
    } -> tensor<?x${ROWS_PER_PIECE}x${HPG}x${BS}x${E}>
${ piece_root("dk", "ds_e", "q_sel", "d", D, DK_ROOT_CONFIG) }
  }

  // ---- Sum each block's pieces in piece order (nsa_iree/mlir/piece_sums.mlir) and cast to the input type.
  %dk, %dv = func.call @dkdv_piece_sums(%dk_pieces, %dv_pieces, %piece_start, %piece_count, %batch, %n)
      : (tensor<?x${BS}x${D}xf32>, tensor<?x${BS}x${DV}xf32>, tensor<?xi32>, tensor<?xi32>, index, index)
      -> (tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>)
  return %dk, %dv : tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
}

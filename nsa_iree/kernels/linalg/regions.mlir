// The text the linalg passes' dispatch regions share, as macros: the selected blocks gathered per row, the
// zeroed score tile, and a score-shaped contraction over the gathered keys.

<# %gathered_`name` [B, M, G, T, BS, `dim`]: %`blocks` gathered at %block_gather_index (through %`name`g_init). #>
<% macro gather(name, blocks, dim) %>
    %${name}g_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}x${BS}x${dim}x${E}>
    %gathered_${name} = iree_linalg_ext.gather dimension_map = [0]
        ins(%${blocks}, %block_gather_index : tensor<?x${BS}x${dim}x${E}>, tensor<?x?x${G}x${T}xi32>)
        outs(%${name}g_init : tensor<?x?x${G}x${T}x${BS}x${dim}x${E}>) -> tensor<?x?x${G}x${T}x${BS}x${dim}x${E}>
<% endmacro %>

<# %scores_zero [B, M, G, HPG, T, BS] f32, zero (through %scores_init). #>
<% macro scores_zero() %>
    %scores_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}x${T}x${BS}xf32>
    %scores_zero = linalg.fill ins(%zero : f32) outs(%scores_init : tensor<?x?x${G}x${HPG}x${T}x${BS}xf32>)
        -> tensor<?x?x${G}x${HPG}x${T}x${BS}xf32>
<% endmacro %>

<# %`name` [B, M, G, HPG, T, BS] f32 = sum over `index` (`dim` of them) of %`x` [B, M, G, HPG, `dim`] times
   %`y` [B, M, G, T, BS, `dim`] (s = q k^T, dp = do v^T), with lowering attributes `config`. #>
<% macro product(name, x, y, index, dim, config) %>
    %${name} = linalg.generic {
        indexing_maps = [affine_map<(b, m, g, h, t, j, ${index}) -> (b, m, g, h, ${index})>,
                         affine_map<(b, m, g, h, t, j, ${index}) -> (b, m, g, t, j, ${index})>,
                         affine_map<(b, m, g, h, t, j, ${index}) -> (b, m, g, h, t, j)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]
        ${config}}
        ins(%${x}, %${y} : tensor<?x?x${G}x${HPG}x${dim}x${E}>, tensor<?x?x${G}x${T}x${BS}x${dim}x${E}>)
        outs(%scores_zero : tensor<?x?x${G}x${HPG}x${T}x${BS}xf32>) {
    ^bb0(%x: ${E}, %y: ${E}, %acc: f32):
      %x32 = ${EXTF} %x : ${E} to f32
      %y32 = ${EXTF} %y : ${E} to f32
      %xy = arith.mulf %x32, %y32 : f32
      %sum = arith.addf %acc, %xy : f32
      linalg.yield %sum : f32
    } -> tensor<?x?x${G}x${HPG}x${T}x${BS}xf32>
<% endmacro %>

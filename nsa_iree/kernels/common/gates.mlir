// The NSA layer's gating (nsa_iree.layer.gated_sum, docs/semantics.md 'The whole layer'): the branches' outputs
// o_i [B, M, H, Dv] weighted by their gates g_i [B, M, H], for n = 1 to 3 branches, every target (IREE tiles and
// vectorises these elementwise ops itself):
//   @gated_sum_<n>      o = sum_i o_i g_i, in f32, rounded once to E (one pass over the o_i)
//   @gate_products_<n>  do_i = do g_i, each in f32 rounded once to E (one pass over do)
//   @gate_dot           dg_i = sum over Dv of do o_i, in f32 (as delta, common/delta.mlir), rounded once to E
<% import "common/contraction.mlir" as contraction %>
<% set rows_t = "tensor<?x?x" ~ H ~ "x" ~ DV ~ "x" ~ E ~ ">" %>
<% set gate_t = "tensor<?x?x" ~ H ~ "x" ~ E ~ ">" %>
<% set row_map = "affine_map<(b, m, h, e) -> (b, m, h, e)>" %>
<% set head_map = "affine_map<(b, m, h, e) -> (b, m, h)>" %>
<# `text` once per branch i = 1 .. n, "#" standing for i and "@" for i - 1, joined by ", ". #>
<% macro each(n, text) %><% for i in range(1, n + 1) %>${ text | replace("#", i | string) | replace("@", (i - 1) | string) }${ ", " if not loop.last else "" }<% endfor %><% endmacro %>

func.func @gate_dot(%o: ${rows_t}, %do: ${rows_t}, %dg_out: ${gate_t} {iree.abi.output = 0 : index},
    %transients: !hal.buffer {iree.abi.transients}) -> ${gate_t} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %batch = tensor.dim %o, %c0 : ${rows_t}
  %m_rows = tensor.dim %o, %c1 : ${rows_t}
  %dg = flow.dispatch.region -> (${gate_t}{%batch, %m_rows}) {
    %init = tensor.empty(%batch, %m_rows) : tensor<?x?x${H}xf32>
    %zeros = linalg.fill ins(%zero : f32) outs(%init : tensor<?x?x${H}xf32>) -> tensor<?x?x${H}xf32>
    %sums = linalg.generic {
        indexing_maps = [${row_map}, ${row_map}, ${head_map}],
        iterator_types = ["parallel", "parallel", "parallel", "reduction"]
        ${DELTA_CONFIG}}
        ins(%o, %do : ${rows_t}, ${rows_t}) outs(%zeros : tensor<?x?x${H}xf32>) {
${ contraction.mul_add("    ") }
    } -> tensor<?x?x${H}xf32>
    %rounded_init = tensor.empty(%batch, %m_rows) : ${gate_t}
    %rounded = linalg.generic {
        indexing_maps = [affine_map<(b, m, h) -> (b, m, h)>, affine_map<(b, m, h) -> (b, m, h)>],
        iterator_types = ["parallel", "parallel", "parallel"]}
        ins(%sums : tensor<?x?x${H}xf32>) outs(%rounded_init : ${gate_t}) {
    ^bb0(%sum: f32, %unused: ${E}):
      %r = ${TRUNCF} %sum : f32 to ${E}
      linalg.yield %r : ${E}
    } -> ${gate_t}
    flow.return %rounded : ${gate_t}
  }
  return %dg : ${gate_t}
}
<% for n in [1, 2, 3] %>

func.func @gated_sum_${n}(${ each(n, "%o_#: " ~ rows_t ~ ", %g_#: " ~ gate_t) },
    %o_out: ${rows_t} {iree.abi.output = 0 : index},
    %transients: !hal.buffer {iree.abi.transients}) -> ${rows_t} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %batch = tensor.dim %o_1, %c0 : ${rows_t}
  %m_rows = tensor.dim %o_1, %c1 : ${rows_t}
  // (a dispatch region of its own: IREE keeps GATES_CONFIG on an op it does not reshape first)
  %o = flow.dispatch.region -> (${rows_t}{%batch, %m_rows}) {
    %init = tensor.empty(%batch, %m_rows) : ${rows_t}
    %sum = linalg.generic {
        indexing_maps = [${ each(n, row_map ~ ", " ~ head_map) }, ${row_map}],
        iterator_types = ["parallel", "parallel", "parallel", "parallel"]
        ${GATES_CONFIG}}
        ins(${ each(n, "%o_#, %g_#") } : ${ each(n, rows_t ~ ", " ~ gate_t) })
        outs(%init : ${rows_t}) {
    ^bb0(${ each(n, "%x_#: " ~ E ~ ", %w_#: " ~ E) }, %unused: ${E}):
<% set total = namespace(name="%p_1") %>
<% for i in range(1, n + 1) %>
      %xf_${i} = ${EXTF} %x_${i} : ${E} to f32
      %wf_${i} = ${EXTF} %w_${i} : ${E} to f32
      %p_${i} = arith.mulf %xf_${i}, %wf_${i} : f32
<% if i > 1 %>
      %s_${i} = arith.addf ${total.name}, %p_${i} : f32
<% set total.name = "%s_" ~ i %>
<% endif %>
<% endfor %>
      %rounded = ${TRUNCF} ${total.name} : f32 to ${E}
      linalg.yield %rounded : ${E}
    } -> ${rows_t}
    flow.return %sum : ${rows_t}
  }
  return %o : ${rows_t}
}

func.func @gate_products_${n}(%do: ${rows_t}, ${ each(n, "%g_#: " ~ gate_t) },
    ${ each(n, "%do_#_out: " ~ rows_t ~ " {iree.abi.output = @ : index}") },
    %transients: !hal.buffer {iree.abi.transients}) -> (${ each(n, rows_t) }) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %batch = tensor.dim %do, %c0 : ${rows_t}
  %m_rows = tensor.dim %do, %c1 : ${rows_t}
  ${ each(n, "%do_#") } = flow.dispatch.region -> (${ each(n, rows_t ~ "{%batch, %m_rows}") }) {
    %init = tensor.empty(%batch, %m_rows) : ${rows_t}
    ${ each(n, "%p_do_#") } = linalg.generic {
        indexing_maps = [${row_map}, ${ each(n, head_map) }, ${ each(n, row_map) }],
        iterator_types = ["parallel", "parallel", "parallel", "parallel"]
        ${GATES_CONFIG}}
        ins(%do, ${ each(n, "%g_#") } : ${rows_t}, ${ each(n, gate_t) })
        outs(${ each(n, "%init") } : ${ each(n, rows_t) }) {
    ^bb0(%x: ${E}, ${ each(n, "%w_#: " ~ E) }, ${ each(n, "%unused_#: " ~ E) }):
      %xf = ${EXTF} %x : ${E} to f32
<% for i in range(1, n + 1) %>
      %wf_${i} = ${EXTF} %w_${i} : ${E} to f32
      %p_${i} = arith.mulf %xf, %wf_${i} : f32
      %r_${i} = ${TRUNCF} %p_${i} : f32 to ${E}
<% endfor %>
      linalg.yield ${ each(n, "%r_#") } : ${ each(n, E) }
    } -> (${ each(n, rows_t) })
    flow.return ${ each(n, "%p_do_#") } : ${ each(n, rows_t) }
  }
  return ${ each(n, "%do_#") } : ${ each(n, rows_t) }
}
<% endfor %>

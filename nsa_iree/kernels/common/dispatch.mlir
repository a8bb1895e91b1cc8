// The text every hand-written dispatch shares, as macros (the templates import this file): its pipeline layout,
// the executable around its function, its workgroup ids, push constants and bindings. A binding is named by
// the operand it holds; OPERANDS below says what each holds, its memref type and its dynamic sizes, once.

<# What a binding named `name` holds: its memref type with dynamic sizes, then a line saying what it is. #>
<% macro operand(name) %>
<% if name in ("q", "dq") %>memref<?x?x${H}x${D}x${E}>{%batch, %m_rows}|${name} [B, M, H, D]
<% elif name in ("do", "o") %>memref<?x?x${H}x${DV}x${E}>{%batch, %m_rows}|${name} [B, M, H, Dv]
<% elif name == "k" %>memref<?x?x${G}x${D}x${E}>{%batch, %n}|k [B, N, G, D]
<% elif name == "v" %>memref<?x?x${G}x${DV}x${E}>{%batch, %n}|v [B, N, G, Dv]
<% elif name == "block_indices" %>memref<?x?x${G}x${T}xi32>{%batch, %m_rows}|block_indices [B, M, G, T] i32
<% elif name == "lse" %>memref<?x${H}x?xf32>{%batch, %m_rows}|lse [B, H, M] f32
<% elif name == "lse_rows" %>memref<?x?x${H}xf32>{%batch, %m_rows}|lse by rows [B, M, H] f32 (cpu/host.mlir: lse_by_heads)
<% elif name == "delta" %>memref<?x?x${H}xf32>{%batch, %m_rows}|delta [B, M, H] f32
<% elif name == "entries" %>memref<?x${ROWS_PER_PIECE}x2xi32>{%pieces}|entries [pieces, ROWS_PER_PIECE, 2] i32
<% elif name == "dk_pieces" %>memref<?x${BS}x${D}xf32>{%pieces}|dk pieces [pieces, BS, D] f32
<% elif name == "dv_pieces" %>memref<?x${BS}x${DV}xf32>{%pieces}|dv pieces [pieces, BS, Dv] f32
<% elif name == "dq_slots" %>memref<?x?x${G}x${T}x${HPG}x${D}xf32>{%batch, %m_rows}|dq slots [B, M, G, T, HPG, D] f32
<% elif name == "o_slots" %>memref<?x?x${G}x${T}x${HPG}x${DV}xf32>{%batch, %m_rows}|o slots [B, M, G, T, HPG, Dv] f32
<% elif name == "stats_slots" %>memref<?x?x${G}x${T}x${HPG}x2xf32>{%batch, %m_rows}|max and sum slots [B, M, G, T, HPG, 2] f32
<% elif name == "key_blocks_t" %>memref<?x${D}x${BS}x${E}>{%flat_blocks}|key_blocks_t [B * G * NB, D, BS] (cpu/blocks.mlir)
<% elif name == "value_blocks_t" %>memref<?x${DV}x${BS}x${E}>{%flat_blocks}|value_blocks_t [B * G * NB, Dv, BS]
<% elif name == "dk" %>memref<?x?x${G}x${D}x${DKV_E}>{%batch, %n}|dk [B, N, G, D]
<% elif name == "dv" %>memref<?x?x${G}x${DV}x${DKV_E}>{%batch, %n}|dv [B, N, G, Dv]
<% elif name == "dkv" %>memref<?xf32>{%dkv_size}|dk/dv f32 accumulator (tied, zero on entry)
<% else %>${ fail("common/dispatch.mlir: no operand named " ~ name) }
<% endif %>
<% endmacro %>

<# #`name`: `constants` push constants (i32), a read-only binding per name in `inputs` and a writable one per
   name in `outputs` (operand names, or (name, type, what) triples for operands of one kernel's own). #>
<% macro layout(name, constants, inputs, outputs) %>
#${name} = #hal.pipeline.layout<constants = ${constants}, bindings = [
<% for x in inputs %>
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // ${ _what(x) }
<% endfor %>
<% for x in outputs %>
  #hal.pipeline.binding<storage_buffer>${ "," if not loop.last else " " }             // ${ _what(x) }
<% endfor %>
]>
<% endmacro %>

<% macro _what(x) %>${ x[2] if x is not string else operand(x).split("|")[1].strip() }<% endmacro %>
<% macro _type(x) %>${ x[1] if x is not string else operand(x).split("|")[0].strip() }<% endmacro %>
<% macro _name(x) %>${ x[0] if x is not string else x }<% endmacro %>

<# The subspans of layout #`name`'s bindings, in order: %<operand> for each of `inputs` and `outputs` (those
   named in `only`, where given). #>
<% macro bindings(name, inputs, outputs, only=none) %>
<% for x in inputs + outputs if only is none or _name(x) in only %>
<% set binding = (inputs + outputs).index(x) %>
      %${ _name(x) } = hal.interface.binding.subspan layout(#${name}) binding(${binding}) alignment(64) offset(%c0)${ " flags(ReadOnly)" if binding < inputs | length else "" }
          : ${ _type(x) }
<% endfor %>
<% endmacro %>

<# hal.executable.source @`name` exporting @`function` with layout #`layout` and `lanes` threads a workgroup,
   over a grid of the sizes named in `workload` (then 1s); the call block's text is its builtin.module. #>
<% macro executable(name, function, layout, workload, lanes=1) %>
<% set grid = workload + ["c1"] * (3 - workload | length) %>
hal.executable.source private @${name} {
  hal.executable.export public @${function} ordinal(0) layout(#${layout})
      count(%device: !hal.device, %${ workload | join(": index, %") }: index) -> (index, index, index) {
<% if workload | length < 3 %>
    %c1 = arith.constant 1 : index
<% endif %>
    hal.return %${ grid | join(", %") } : index, index, index
  } <workgroup_size = [${lanes} : index, 1 : index, 1 : index]>
  builtin.module {
${ caller() }
  }
}
<% endmacro %>

<# %<name> = workgroup id 0, 1, 2 for each of `names`. #>
<% macro ids(names) %>
<% for name in names %>
      %${name} = hal.interface.workgroup.id[${loop.index0}] : index
<% endfor %>
<% endmacro %>

<# The push constants of layout #`name`, in order: each of `names` loaded as %<name>_i32 (scale: %scale_bits),
   then each cast to an index %<name> (scale: bitcast to f32). #>
<% macro push_constants(name, names) %>
<% for c in names %>
      %${ "scale_bits" if c == "scale" else c ~ "_i32" } = hal.interface.constant.load layout(#${name}) ordinal(${loop.index0}) : i32
<% endfor %>
<% for c in names %>
<% if c == "scale" %>
      %scale = arith.bitcast %scale_bits : i32 to f32
<% else %>
      %${c} = arith.index_castui %${c}_i32 : i32 to index
<% endif %>
<% endfor %>
<% endmacro %>

<# The tensor types, with their dynamic sizes, of `items` (operand names or triples, as layout() takes them),
   comma-separated: a flow.dispatch's operand or result types where the host passes the bindings' operands. #>
<% macro tensor_types(items) %>
<% for x in items %>
${ "tensor" ~ _type(x)[6:] }${ "," if not loop.last }
<% endfor %>
<%- endmacro %>

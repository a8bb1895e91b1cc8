// dq pass as a portable matrix-unit kernel: one workgroup per (query row m, kv group g, batch b), one text
// for every intrinsic (MFMA 16x16x32 on gfx950, mma.sync 16x8x16 on NVIDIA); only the unit's fragment shapes
// and the placement maps below differ (nsa_iree/fragments.py: Unit, pinned by tests/test_fragments.py).
//
// Per selected block (slot t - 1, while slot t's K and V rows travel from global memory in registers):
//   s  = q k^T    [16 heads x 16 keys] per subgroup: subgroup w owns keys 16 w .. 16 w + 15
//   dp = do v^T   the same keys; q and do are register fragments loaded once
//   ds = scale p (dp - delta), p = exp(scale s - lse), 0 where the key is invisible or the head is padding;
//                 written to a [16 heads, BS keys] tile in workgroup memory
//   dq += ds k    [16 heads x 16 d] units, subgroup w owns d tiles w, w + SUBGROUPS, ...: its dq is
//                 complete in registers at the end and written once (no cross-subgroup sum)
// Every operand is read from workgroup memory with its reduction dimension contiguous: K rows [key][d] for s,
// V rows [key][dv] for dp, the ds tile [head][key] and a transposed K copy [d][key] for dq (written while
// staging, from the same registers: K and V are read from global memory once per workgroup). A lane reads
// its fragment as ${RUNS} contiguous vectors of ${RUN} elements (MFMA: one 16-byte read per fragment).
//
// Visibility (semantics.md): slot t of row m names block i; it is skipped when i < 0 or i * BS > pos(m),
// pos(m) = m + N - M (tested as i <= floor(pos / BS)); key i * BS + j is visible when j < pos - i * BS + 1.
// Keys past that are staged as zeros and their ds is 0, so a NaN in an unread key reaches nothing.
<# With a window (WINDOW > 0) also j >= pos - WINDOW + 1 - i * BS (common/rules.mlir: first_key, key_in_range): the
   keys before it are staged as zeros as well, and a subgroup that sees none of its 16 keys skips s and dp
   (dq_scores.mlir). dq += ds k runs over the whole block (ds 0 outside the band): skipping its units of K keys by
   a test inside the loop over d tiles would read each ds fragment once per d tile instead of once. #>
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "gpu/portable/units.mlir" as units %>
<% set u = {'p': 'dqp', 'kind': MMA_KIND, 'run': RUN, 'runs': RUNS, 'acc_n': ACC_N, 'lhs': LHS_UNIT, 'rhs': RHS_UNIT, 'acc': ACC_UNIT, 'maps': [RUN_MAJOR_MAP, RUN_K_MAP, ACC_ROW_MAP, ACC_COL_MAP]} %>

// Push constants: B, M, N (i32), then the bits of scale (f32).
<% set inputs = ['q', 'k', 'v', 'block_indices', 'lse', 'delta', 'do'] %>
<% set outputs = ['dq'] %>
${ dispatch.layout("dq_portable_layout", 4, inputs, outputs) }

<% set onepass = false %>
<% include "gpu/portable/dq_types.mlir" %>

<% call dispatch.executable("selection_attention_dq_portable_exe", "selection_attention_dq_row", "dq_portable_layout", ['m_rows', 'kv_heads', 'batch'], lanes=LANES) %>
${ units.func_begin("selection_attention_dq_row", LANES, SUBGROUP_SIZE) }
      <% include "gpu/portable/dq_constants.mlir" %>

${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("dq_portable_layout", ['batch', 'm_rows', 'n', 'scale']) }

${ dispatch.bindings("dq_portable_layout", inputs, outputs) }

      ${ units.views("!dqp_smem", [("k_rows", 0, "!dqp_k_rows"), ("v_rows", DQP_V_OFFSET, "!dqp_v_rows"),
          ("k_cols", DQP_KT_OFFSET, "!dqp_k_cols"), ("ds_tile", DQP_DS_OFFSET, "!dqp_ds")]) }

      ${ units.lane_ids("%c16") }
      %h0 = arith.muli %g, %heads_per_group : index

      <% include "gpu/portable/dq_prologue.mlir" %>
      <% include "gpu/portable/dq_slots.mlir" %>
      return
    }
<% endcall %>

// Host side: one dispatch, dq written into the caller's tensor.
${ host.dq("selection_attention_dq_portable_exe") }

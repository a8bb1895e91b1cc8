// Part of dq_portable.mlir and onepass_portable.mlir, after the slot loop: dq of this subgroup's d tiles
// written once.
      // dq of this subgroup's d tiles: element i of unit x is head acc_row(l, i), d 16 tile + acc_col(l, i).
<# part: takes nothing #>
      scf.for %x_unit = %c0 to %dq_units step %c1 {
        %x_sub = arith.muli %x_unit, %subgroups : index
        %tile = arith.addi %subgroup, %x_sub : index
        %mine = arith.cmpi ult, %tile, %d_tiles : index
        scf.if %mine {
          %d_base = arith.muli %tile, %c16 : index
          scf.for %i = %c0 to %acc_n step %c1 {
            %h = affine.apply #dqp_acc_row(%lane, %i)
            %col = affine.apply #dqp_acc_col(%lane, %i)
            %real = arith.cmpi ult, %h, %heads_per_group : index
            scf.if %real {
              %x = vector.extract %dq_acc[%x_unit, %i] : f32 from !dqp_dq_units
              %x_e = ${TRUNCF} %x : f32 to ${E}
              %head = arith.addi %h0, %h : index
              %d = arith.addi %d_base, %col : index
              memref.store %x_e, %dq[%b, %m, %head, %d] : !dqp_q
            }
          } {unroll_loop}
        }
      } {unroll_loop}

// Part of dq_portable.mlir and onepass_portable.mlir (`// part: dq_portable_types`): the type aliases and
// placement maps of the portable dq body (the parts dq_portable_*).
<# part: takes ACC_N, BS_PADDED, DQP_SMEM_BYTES, DQ_UNITS_PER_SUBGROUP, DV_PADDED, DV_UNITS, D_PADDED, D_UNITS, K_ITEMS_PER_LANE, PAD, RUN, RUNS, V_ITEMS_PER_LANE, u, units #>
!dqp_smem = memref<${DQP_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
// Workgroup tiles (rows padded by ${PAD} elements): K rows, V rows, K transposed, ds.
!dqp_k_rows = memref<${BS}x${D_PADDED}x${E}, #gpu.address_space<workgroup>>
!dqp_v_rows = memref<${BS}x${DV_PADDED}x${E}, #gpu.address_space<workgroup>>
!dqp_k_cols = memref<${D}x${BS_PADDED}x${E}, #gpu.address_space<workgroup>>
!dqp_ds = memref<16x${BS_PADDED}x${E}, #gpu.address_space<workgroup>>
!dqp_runs_pair = vector<2x${RUNS}x${RUN}x${E}>
!dqp_q_units = vector<${D_UNITS}x${RUNS}x${RUN}x${E}>
!dqp_do_units = vector<${DV_UNITS}x${RUNS}x${RUN}x${E}>
!dqp_dq_units = vector<${DQ_UNITS_PER_SUBGROUP}x${ACC_N}xf32>
!dqp_k_staged = vector<${K_ITEMS_PER_LANE}x8x${E}>
!dqp_v_staged = vector<${V_ITEMS_PER_LANE}x8x${E}>
${ units.types(u) }

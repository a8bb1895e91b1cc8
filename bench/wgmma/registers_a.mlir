// wgmma with A from registers (the p v product's form): each warp's [16, 16] slice of a [64, 16] as mma.sync's A
// fragment (4 b32 registers a lane), B = b [128, 16] (N x K) from workgroup memory (copied in, already in the
// core-matrix layout), m64n128k16 through llvm.inline_asm with 64 tied f32 accumulators: c [64, 128] = a b^T.
//     iree-compile bench/wgmma/registers_a.mlir -o registers_a.vmfb
//     python3 -m bench.wgmma.check registers_a.vmfb --laid-out --n 128 --function wgmma_rega_gemm
#wg_target = #hal.executable.target<"cuda", "cuda-nvptx-fb", {iree_codegen.target_info = #iree_gpu.target<arch = "sm_90a", features = "+ptx80", wgp = <compute = fp64|fp32|fp16|int64|int32|int16|int8, storage = b64|b32|b16|b8, subgroup = shuffle|arithmetic, dot = dp4xi8toi32, mma = [<NV_MMA_SYNC_F32_16x8x16_F16>, <NV_MMA_SYNC_F16_16x8x16_F16>, <NV_MMA_SYNC_F32_16x8x16_BF16>, <NV_WMMA_F32_16x16x16_F16>, <NV_WMMA_F16_16x16x16_F16>], subgroup_size_choices = [32], max_workgroup_sizes = [1024, 1024, 1024], max_thread_count_per_workgroup = 1024, max_workgroup_memory_bytes = 232448, max_workgroup_counts = [2147483647, 65535, 65535]>>}>

#layout = #hal.pipeline.layout<bindings = [
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // a [64, 16] bf16 (M x K)
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // b: 128x16 bf16 (N x K) in the no-swizzle K-major core-matrix layout
  #hal.pipeline.binding<storage_buffer>             // c [64, 128] f32
]>
!smem = memref<2048xbf16, #gpu.address_space<workgroup>>
module attributes {stream.affinity.default = #hal.device.affinity<@wg_device>} {
util.global private @wg_device = #hal.device.target<"cuda", [#wg_target]> : !hal.device
hal.executable.source private @wgmma_rega_exe {
  hal.executable.export public @wgmma_rega ordinal(0) layout(#layout)
      count(%device: !hal.device) -> (index, index, index) {
    %c1 = arith.constant 1 : index
    hal.return %c1, %c1, %c1 : index, index, index
  } <workgroup_size = [128 : index, 1 : index, 1 : index]>
  builtin.module {
    func.func @wgmma_rega() attributes {translation_info = #iree_codegen.translation_info<
        pipeline = #iree_codegen.pass_pipeline<"canonicalize,cse">
        workgroup_size = [128, 1, 1] subgroup_size = 32>} {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      %c4 = arith.constant 4 : index
      %c8 = arith.constant 8 : index
      %c16 = arith.constant 16 : index
      %c32 = arith.constant 32 : index
      %a = hal.interface.binding.subspan layout(#layout) binding(0) alignment(64) offset(%c0) flags(ReadOnly) : memref<64x16xbf16>
      %b = hal.interface.binding.subspan layout(#layout) binding(1) alignment(64) offset(%c0) flags(ReadOnly) : memref<2048xbf16>
      %c = hal.interface.binding.subspan layout(#layout) binding(2) alignment(64) offset(%c0) : memref<64x128xf32>
      %smem = memref.alloc() : !smem
      %tid = gpu.thread_id x
      // B: straight copy (already in the smem layout), 8 elements per lane per step
      %total = arith.constant 2048 : index
      %step = arith.constant 1024 : index
      scf.for %i = %c0 to %total step %step {
        %t8 = arith.muli %tid, %c8 : index
        %e = arith.addi %i, %t8 : index
        %v = vector.load %b[%e] : memref<2048xbf16>, vector<8xbf16>
        vector.store %v, %smem[%e] : !smem, vector<8xbf16>
      }
      llvm.inline_asm has_side_effects "fence.proxy.async.shared::cta;", "" : () -> ()
      gpu.barrier
      // A fragment (same as mma.m16n8k16's A per warp, warp w owns rows 16w..16w+15):
      // a0 = (r, 2q..2q+1), a1 = (r+8, 2q..), a2 = (r, 2q+8..), a3 = (r+8, 2q+8..), r = 16w + lane/4, q = lane%4
      %warp = arith.divui %tid, %c32 : index
      %lane = arith.remui %tid, %c32 : index
      %wr = arith.muli %warp, %c16 : index
      %lr = arith.divui %lane, %c4 : index
      %r0 = arith.addi %wr, %lr : index
      %r1 = arith.addi %r0, %c8 : index
      %lc = arith.remui %lane, %c4 : index
      %col0 = arith.muli %lc, %c2 : index
      %col8 = arith.addi %col0, %c8 : index
      %p0 = vector.load %a[%r0, %col0] : memref<64x16xbf16>, vector<2xbf16>
      %p1 = vector.load %a[%r1, %col0] : memref<64x16xbf16>, vector<2xbf16>
      %p2 = vector.load %a[%r0, %col8] : memref<64x16xbf16>, vector<2xbf16>
      %p3 = vector.load %a[%r1, %col8] : memref<64x16xbf16>, vector<2xbf16>
      %a0 = vector.bitcast %p0 : vector<2xbf16> to vector<1xi32>
      %a1 = vector.bitcast %p1 : vector<2xbf16> to vector<1xi32>
      %a2 = vector.bitcast %p2 : vector<2xbf16> to vector<1xi32>
      %a3 = vector.bitcast %p3 : vector<2xbf16> to vector<1xi32>
      %ra0 = vector.extract %a0[0] : i32 from vector<1xi32>
      %ra1 = vector.extract %a1[0] : i32 from vector<1xi32>
      %ra2 = vector.extract %a2[0] : i32 from vector<1xi32>
      %ra3 = vector.extract %a3[0] : i32 from vector<1xi32>
      %base_idx = memref.extract_aligned_pointer_as_index %smem : !smem -> index
      %base = arith.index_cast %base_idx : index to i64
      %c4_i64 = arith.constant 4 : i64
      %mask14 = arith.constant 16383 : i64
      %lbo_sbo = arith.constant 68720001024 : i64  // SBO 256 B << 32 | LBO 128 B << 16 (both >> 4)
      %b4 = arith.shrui %base, %c4_i64 : i64
      %b14 = arith.andi %b4, %mask14 : i64
      %desc_b = arith.ori %b14, %lbo_sbo : i64
      %zero = arith.constant 0.0 : f32
      llvm.inline_asm has_side_effects "wgmma.fence.sync.aligned;", "" : () -> ()
      %acc = llvm.inline_asm has_side_effects "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {$0, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35, $36, $37, $38, $39, $40, $41, $42, $43, $44, $45, $46, $47, $48, $49, $50, $51, $52, $53, $54, $55, $56, $57, $58, $59, $60, $61, $62, $63}, {$128, $129, $130, $131}, $132, 1, 1, 1, 0;", "=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,r,r,r,r,l" %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %zero, %ra0, %ra1, %ra2, %ra3, %desc_b : (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, i32, i32, i32, i32, i64) -> !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      llvm.inline_asm has_side_effects "wgmma.commit_group.sync.aligned;", "" : () -> ()
      llvm.inline_asm has_side_effects "wgmma.wait_group.sync.aligned 0;", "" : () -> ()
      %d0 = llvm.extractvalue %acc[0] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d1 = llvm.extractvalue %acc[1] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d2 = llvm.extractvalue %acc[2] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d3 = llvm.extractvalue %acc[3] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d4 = llvm.extractvalue %acc[4] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d5 = llvm.extractvalue %acc[5] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d6 = llvm.extractvalue %acc[6] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d7 = llvm.extractvalue %acc[7] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d8 = llvm.extractvalue %acc[8] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d9 = llvm.extractvalue %acc[9] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d10 = llvm.extractvalue %acc[10] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d11 = llvm.extractvalue %acc[11] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d12 = llvm.extractvalue %acc[12] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d13 = llvm.extractvalue %acc[13] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d14 = llvm.extractvalue %acc[14] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d15 = llvm.extractvalue %acc[15] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d16 = llvm.extractvalue %acc[16] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d17 = llvm.extractvalue %acc[17] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d18 = llvm.extractvalue %acc[18] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d19 = llvm.extractvalue %acc[19] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d20 = llvm.extractvalue %acc[20] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d21 = llvm.extractvalue %acc[21] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d22 = llvm.extractvalue %acc[22] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d23 = llvm.extractvalue %acc[23] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d24 = llvm.extractvalue %acc[24] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d25 = llvm.extractvalue %acc[25] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d26 = llvm.extractvalue %acc[26] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d27 = llvm.extractvalue %acc[27] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d28 = llvm.extractvalue %acc[28] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d29 = llvm.extractvalue %acc[29] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d30 = llvm.extractvalue %acc[30] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d31 = llvm.extractvalue %acc[31] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d32 = llvm.extractvalue %acc[32] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d33 = llvm.extractvalue %acc[33] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d34 = llvm.extractvalue %acc[34] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d35 = llvm.extractvalue %acc[35] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d36 = llvm.extractvalue %acc[36] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d37 = llvm.extractvalue %acc[37] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d38 = llvm.extractvalue %acc[38] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d39 = llvm.extractvalue %acc[39] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d40 = llvm.extractvalue %acc[40] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d41 = llvm.extractvalue %acc[41] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d42 = llvm.extractvalue %acc[42] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d43 = llvm.extractvalue %acc[43] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d44 = llvm.extractvalue %acc[44] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d45 = llvm.extractvalue %acc[45] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d46 = llvm.extractvalue %acc[46] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d47 = llvm.extractvalue %acc[47] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d48 = llvm.extractvalue %acc[48] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d49 = llvm.extractvalue %acc[49] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d50 = llvm.extractvalue %acc[50] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d51 = llvm.extractvalue %acc[51] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d52 = llvm.extractvalue %acc[52] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d53 = llvm.extractvalue %acc[53] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d54 = llvm.extractvalue %acc[54] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d55 = llvm.extractvalue %acc[55] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d56 = llvm.extractvalue %acc[56] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d57 = llvm.extractvalue %acc[57] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d58 = llvm.extractvalue %acc[58] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d59 = llvm.extractvalue %acc[59] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d60 = llvm.extractvalue %acc[60] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d61 = llvm.extractvalue %acc[61] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d62 = llvm.extractvalue %acc[62] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d63 = llvm.extractvalue %acc[63] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %cb0 = arith.constant 0 : index
      %col0_0 = arith.addi %col0, %cb0 : index
      %col0_1 = arith.addi %col0_0, %c1 : index
      memref.store %d0, %c[%r0, %col0_0] : memref<64x128xf32>
      memref.store %d1, %c[%r0, %col0_1] : memref<64x128xf32>
      memref.store %d2, %c[%r1, %col0_0] : memref<64x128xf32>
      memref.store %d3, %c[%r1, %col0_1] : memref<64x128xf32>
      %cb1 = arith.constant 8 : index
      %col1_0 = arith.addi %col0, %cb1 : index
      %col1_1 = arith.addi %col1_0, %c1 : index
      memref.store %d4, %c[%r0, %col1_0] : memref<64x128xf32>
      memref.store %d5, %c[%r0, %col1_1] : memref<64x128xf32>
      memref.store %d6, %c[%r1, %col1_0] : memref<64x128xf32>
      memref.store %d7, %c[%r1, %col1_1] : memref<64x128xf32>
      %cb2 = arith.constant 16 : index
      %col2_0 = arith.addi %col0, %cb2 : index
      %col2_1 = arith.addi %col2_0, %c1 : index
      memref.store %d8, %c[%r0, %col2_0] : memref<64x128xf32>
      memref.store %d9, %c[%r0, %col2_1] : memref<64x128xf32>
      memref.store %d10, %c[%r1, %col2_0] : memref<64x128xf32>
      memref.store %d11, %c[%r1, %col2_1] : memref<64x128xf32>
      %cb3 = arith.constant 24 : index
      %col3_0 = arith.addi %col0, %cb3 : index
      %col3_1 = arith.addi %col3_0, %c1 : index
      memref.store %d12, %c[%r0, %col3_0] : memref<64x128xf32>
      memref.store %d13, %c[%r0, %col3_1] : memref<64x128xf32>
      memref.store %d14, %c[%r1, %col3_0] : memref<64x128xf32>
      memref.store %d15, %c[%r1, %col3_1] : memref<64x128xf32>
      %cb4 = arith.constant 32 : index
      %col4_0 = arith.addi %col0, %cb4 : index
      %col4_1 = arith.addi %col4_0, %c1 : index
      memref.store %d16, %c[%r0, %col4_0] : memref<64x128xf32>
      memref.store %d17, %c[%r0, %col4_1] : memref<64x128xf32>
      memref.store %d18, %c[%r1, %col4_0] : memref<64x128xf32>
      memref.store %d19, %c[%r1, %col4_1] : memref<64x128xf32>
      %cb5 = arith.constant 40 : index
      %col5_0 = arith.addi %col0, %cb5 : index
      %col5_1 = arith.addi %col5_0, %c1 : index
      memref.store %d20, %c[%r0, %col5_0] : memref<64x128xf32>
      memref.store %d21, %c[%r0, %col5_1] : memref<64x128xf32>
      memref.store %d22, %c[%r1, %col5_0] : memref<64x128xf32>
      memref.store %d23, %c[%r1, %col5_1] : memref<64x128xf32>
      %cb6 = arith.constant 48 : index
      %col6_0 = arith.addi %col0, %cb6 : index
      %col6_1 = arith.addi %col6_0, %c1 : index
      memref.store %d24, %c[%r0, %col6_0] : memref<64x128xf32>
      memref.store %d25, %c[%r0, %col6_1] : memref<64x128xf32>
      memref.store %d26, %c[%r1, %col6_0] : memref<64x128xf32>
      memref.store %d27, %c[%r1, %col6_1] : memref<64x128xf32>
      %cb7 = arith.constant 56 : index
      %col7_0 = arith.addi %col0, %cb7 : index
      %col7_1 = arith.addi %col7_0, %c1 : index
      memref.store %d28, %c[%r0, %col7_0] : memref<64x128xf32>
      memref.store %d29, %c[%r0, %col7_1] : memref<64x128xf32>
      memref.store %d30, %c[%r1, %col7_0] : memref<64x128xf32>
      memref.store %d31, %c[%r1, %col7_1] : memref<64x128xf32>
      %cb8 = arith.constant 64 : index
      %col8_0 = arith.addi %col0, %cb8 : index
      %col8_1 = arith.addi %col8_0, %c1 : index
      memref.store %d32, %c[%r0, %col8_0] : memref<64x128xf32>
      memref.store %d33, %c[%r0, %col8_1] : memref<64x128xf32>
      memref.store %d34, %c[%r1, %col8_0] : memref<64x128xf32>
      memref.store %d35, %c[%r1, %col8_1] : memref<64x128xf32>
      %cb9 = arith.constant 72 : index
      %col9_0 = arith.addi %col0, %cb9 : index
      %col9_1 = arith.addi %col9_0, %c1 : index
      memref.store %d36, %c[%r0, %col9_0] : memref<64x128xf32>
      memref.store %d37, %c[%r0, %col9_1] : memref<64x128xf32>
      memref.store %d38, %c[%r1, %col9_0] : memref<64x128xf32>
      memref.store %d39, %c[%r1, %col9_1] : memref<64x128xf32>
      %cb10 = arith.constant 80 : index
      %col10_0 = arith.addi %col0, %cb10 : index
      %col10_1 = arith.addi %col10_0, %c1 : index
      memref.store %d40, %c[%r0, %col10_0] : memref<64x128xf32>
      memref.store %d41, %c[%r0, %col10_1] : memref<64x128xf32>
      memref.store %d42, %c[%r1, %col10_0] : memref<64x128xf32>
      memref.store %d43, %c[%r1, %col10_1] : memref<64x128xf32>
      %cb11 = arith.constant 88 : index
      %col11_0 = arith.addi %col0, %cb11 : index
      %col11_1 = arith.addi %col11_0, %c1 : index
      memref.store %d44, %c[%r0, %col11_0] : memref<64x128xf32>
      memref.store %d45, %c[%r0, %col11_1] : memref<64x128xf32>
      memref.store %d46, %c[%r1, %col11_0] : memref<64x128xf32>
      memref.store %d47, %c[%r1, %col11_1] : memref<64x128xf32>
      %cb12 = arith.constant 96 : index
      %col12_0 = arith.addi %col0, %cb12 : index
      %col12_1 = arith.addi %col12_0, %c1 : index
      memref.store %d48, %c[%r0, %col12_0] : memref<64x128xf32>
      memref.store %d49, %c[%r0, %col12_1] : memref<64x128xf32>
      memref.store %d50, %c[%r1, %col12_0] : memref<64x128xf32>
      memref.store %d51, %c[%r1, %col12_1] : memref<64x128xf32>
      %cb13 = arith.constant 104 : index
      %col13_0 = arith.addi %col0, %cb13 : index
      %col13_1 = arith.addi %col13_0, %c1 : index
      memref.store %d52, %c[%r0, %col13_0] : memref<64x128xf32>
      memref.store %d53, %c[%r0, %col13_1] : memref<64x128xf32>
      memref.store %d54, %c[%r1, %col13_0] : memref<64x128xf32>
      memref.store %d55, %c[%r1, %col13_1] : memref<64x128xf32>
      %cb14 = arith.constant 112 : index
      %col14_0 = arith.addi %col0, %cb14 : index
      %col14_1 = arith.addi %col14_0, %c1 : index
      memref.store %d56, %c[%r0, %col14_0] : memref<64x128xf32>
      memref.store %d57, %c[%r0, %col14_1] : memref<64x128xf32>
      memref.store %d58, %c[%r1, %col14_0] : memref<64x128xf32>
      memref.store %d59, %c[%r1, %col14_1] : memref<64x128xf32>
      %cb15 = arith.constant 120 : index
      %col15_0 = arith.addi %col0, %cb15 : index
      %col15_1 = arith.addi %col15_0, %c1 : index
      memref.store %d60, %c[%r0, %col15_0] : memref<64x128xf32>
      memref.store %d61, %c[%r0, %col15_1] : memref<64x128xf32>
      memref.store %d62, %c[%r1, %col15_0] : memref<64x128xf32>
      memref.store %d63, %c[%r1, %col15_1] : memref<64x128xf32>
      return
    }
  }
}
func.func @wgmma_rega_gemm(%a: tensor<64x16xbf16>, %b: tensor<2048xbf16>) -> tensor<64x128xf32> {
  %c = flow.dispatch @wgmma_rega_exe::@wgmma_rega(%a, %b) : (tensor<64x16xbf16>, tensor<2048xbf16>) -> tensor<64x128xf32>
  return %c : tensor<64x128xf32>
}
}
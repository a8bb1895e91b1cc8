// The body every contraction of two E tensors into f32 shares (s = q k^T, dp = do v^T, p v, ds q, ...), as a
// macro: both operands extended to f32, multiplied, added to the accumulator.

<# The region `^bb0(%x, %y, %acc)` yielding %acc + ext(%x) * ext(%y); `indent`: its leading spaces. #>
<% macro mul_add(indent) %>
${indent}^bb0(%x: ${E}, %y: ${E}, %acc: f32):
${indent}  %x32 = ${EXTF} %x : ${E} to f32
${indent}  %y32 = ${EXTF} %y : ${E} to f32
${indent}  %xy = arith.mulf %x32, %y32 : f32
${indent}  %sum = arith.addf %acc, %xy : f32
${indent}  linalg.yield %sum : f32
<% endmacro %>

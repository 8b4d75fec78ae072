module @attention_block {
  util.global private @"model.layers.0.input_layernorm.weight" = #stream.parameter.named<"model"::"model.layers.0.input_layernorm.weight"> : tensor<64xbf16>
  util.global private @"model.layers.0.self_attn.q_proj.weight" = #stream.parameter.named<"model"::"model.layers.0.self_attn.q_proj.weight"> : tensor<64x8xi32>
  util.global private @"model.layers.0.self_attn.q_proj.scales" = #stream.parameter.named<"model"::"model.layers.0.self_attn.q_proj.scales"> : tensor<64x2xbf16>
  util.global private @"model.layers.0.self_attn.q_proj.biases" = #stream.parameter.named<"model"::"model.layers.0.self_attn.q_proj.biases"> : tensor<64x2xbf16>
  util.global private @"model.layers.0.self_attn.k_proj.weight" = #stream.parameter.named<"model"::"model.layers.0.self_attn.k_proj.weight"> : tensor<32x8xi32>
  util.global private @"model.layers.0.self_attn.k_proj.scales" = #stream.parameter.named<"model"::"model.layers.0.self_attn.k_proj.scales"> : tensor<32x2xbf16>
  util.global private @"model.layers.0.self_attn.k_proj.biases" = #stream.parameter.named<"model"::"model.layers.0.self_attn.k_proj.biases"> : tensor<32x2xbf16>
  util.global private @"model.layers.0.self_attn.v_proj.weight" = #stream.parameter.named<"model"::"model.layers.0.self_attn.v_proj.weight"> : tensor<32x8xi32>
  util.global private @"model.layers.0.self_attn.v_proj.scales" = #stream.parameter.named<"model"::"model.layers.0.self_attn.v_proj.scales"> : tensor<32x2xbf16>
  util.global private @"model.layers.0.self_attn.v_proj.biases" = #stream.parameter.named<"model"::"model.layers.0.self_attn.v_proj.biases"> : tensor<32x2xbf16>
  util.global private @"model.layers.0.self_attn.o_proj.weight" = #stream.parameter.named<"model"::"model.layers.0.self_attn.o_proj.weight"> : tensor<64x8xi32>
  util.global private @"model.layers.0.self_attn.o_proj.scales" = #stream.parameter.named<"model"::"model.layers.0.self_attn.o_proj.scales"> : tensor<64x2xbf16>
  util.global private @"model.layers.0.self_attn.o_proj.biases" = #stream.parameter.named<"model"::"model.layers.0.self_attn.o_proj.biases"> : tensor<64x2xbf16>
  func.func @decode(%x: tensor<1x1x64xf32>, %offset: tensor<i32>, %cache_k: tensor<1x2x32x16xf32>, %cache_v: tensor<1x2x32x16xf32>) -> (tensor<1x1x64xf32>, tensor<1x2x32x16xf32>, tensor<1x2x32x16xf32>) {
    %0 = util.global.load @"model.layers.0.input_layernorm.weight" : tensor<64xbf16>
    %1 = "stablehlo.multiply"(%x, %x) : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %2 = "stablehlo.constant"() {value = dense<0.0e0> : tensor<f32>} : () -> tensor<f32>
    %3 = "stablehlo.reduce"(%1, %2) ({
    ^bb0(%-acc: tensor<f32>, %-elt: tensor<f32>):
      %-folded = "stablehlo.add"(%-acc, %-elt) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%-folded) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 2>} : (tensor<1x1x64xf32>, tensor<f32>) -> tensor<1x1xf32>
    %4 = "stablehlo.constant"() {value = dense<6.4e1> : tensor<1x1xf32>} : () -> tensor<1x1xf32>
    %5 = "stablehlo.divide"(%3, %4) : (tensor<1x1xf32>, tensor<1x1xf32>) -> tensor<1x1xf32>
    %6 = "stablehlo.constant"() {value = dense<1.0e-5> : tensor<1x1xf32>} : () -> tensor<1x1xf32>
    %7 = "stablehlo.add"(%5, %6) : (tensor<1x1xf32>, tensor<1x1xf32>) -> tensor<1x1xf32>
    %8 = "stablehlo.rsqrt"(%7) : (tensor<1x1xf32>) -> tensor<1x1xf32>
    %9 = "stablehlo.broadcast_in_dim"(%8) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<1x1xf32>) -> tensor<1x1x64xf32>
    %10 = "stablehlo.multiply"(%x, %9) : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %11 = "stablehlo.convert"(%0) : (tensor<64xbf16>) -> tensor<64xf32>
    %12 = "stablehlo.broadcast_in_dim"(%11) {broadcast_dimensions = array<i64: 2>} : (tensor<64xf32>) -> tensor<1x1x64xf32>
    %13 = "stablehlo.multiply"(%10, %12) : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %14 = util.global.load @"model.layers.0.self_attn.q_proj.weight" : tensor<64x8xi32>
    %15 = util.global.load @"model.layers.0.self_attn.q_proj.scales" : tensor<64x2xbf16>
    %16 = util.global.load @"model.layers.0.self_attn.q_proj.biases" : tensor<64x2xbf16>
    %17 = "stablehlo.broadcast_in_dim"(%14) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<64x8xi32>) -> tensor<64x8x8xi32>
    %18 = "stablehlo.constant"() {value = dense<[0, 4, 8, 12, 16, 20, 24, 28]> : tensor<8xi32>} : () -> tensor<8xi32>
    %19 = "stablehlo.broadcast_in_dim"(%18) {broadcast_dimensions = array<i64: 2>} : (tensor<8xi32>) -> tensor<64x8x8xi32>
    %20 = "stablehlo.shift_right_logical"(%17, %19) : (tensor<64x8x8xi32>, tensor<64x8x8xi32>) -> tensor<64x8x8xi32>
    %21 = "stablehlo.constant"() {value = dense<15> : tensor<64x8x8xi32>} : () -> tensor<64x8x8xi32>
    %22 = "stablehlo.and"(%20, %21) : (tensor<64x8x8xi32>, tensor<64x8x8xi32>) -> tensor<64x8x8xi32>
    %23 = "stablehlo.convert"(%22) : (tensor<64x8x8xi32>) -> tensor<64x8x8xf32>
    %24 = "stablehlo.reshape"(%23) : (tensor<64x8x8xf32>) -> tensor<64x2x32xf32>
    %25 = "stablehlo.convert"(%15) : (tensor<64x2xbf16>) -> tensor<64x2xf32>
    %26 = "stablehlo.convert"(%16) : (tensor<64x2xbf16>) -> tensor<64x2xf32>
    %27 = "stablehlo.broadcast_in_dim"(%25) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<64x2xf32>) -> tensor<64x2x32xf32>
    %28 = "stablehlo.broadcast_in_dim"(%26) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<64x2xf32>) -> tensor<64x2x32xf32>
    %29 = "stablehlo.multiply"(%24, %27) : (tensor<64x2x32xf32>, tensor<64x2x32xf32>) -> tensor<64x2x32xf32>
    %30 = "stablehlo.add"(%29, %28) : (tensor<64x2x32xf32>, tensor<64x2x32xf32>) -> tensor<64x2x32xf32>
    %31 = "stablehlo.reshape"(%13) : (tensor<1x1x64xf32>) -> tensor<1x1x2x32xf32>
    %32 = "stablehlo.dot_general"(%30, %31) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1, 2], rhs_contracting_dimensions = [2, 3]>} : (tensor<64x2x32xf32>, tensor<1x1x2x32xf32>) -> tensor<64x1x1xf32>
    %33 = "stablehlo.reshape"(%32) : (tensor<64x1x1xf32>) -> tensor<1x1x64xf32>
    %34 = "stablehlo.reshape"(%33) : (tensor<1x1x64xf32>) -> tensor<1x1x4x16xf32>
    %35 = "stablehlo.transpose"(%34) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<1x1x4x16xf32>) -> tensor<1x4x1x16xf32>
    %36 = util.global.load @"model.layers.0.self_attn.k_proj.weight" : tensor<32x8xi32>
    %37 = util.global.load @"model.layers.0.self_attn.k_proj.scales" : tensor<32x2xbf16>
    %38 = util.global.load @"model.layers.0.self_attn.k_proj.biases" : tensor<32x2xbf16>
    %39 = "stablehlo.broadcast_in_dim"(%36) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x8xi32>) -> tensor<32x8x8xi32>
    %40 = "stablehlo.constant"() {value = dense<[0, 4, 8, 12, 16, 20, 24, 28]> : tensor<8xi32>} : () -> tensor<8xi32>
    %41 = "stablehlo.broadcast_in_dim"(%40) {broadcast_dimensions = array<i64: 2>} : (tensor<8xi32>) -> tensor<32x8x8xi32>
    %42 = "stablehlo.shift_right_logical"(%39, %41) : (tensor<32x8x8xi32>, tensor<32x8x8xi32>) -> tensor<32x8x8xi32>
    %43 = "stablehlo.constant"() {value = dense<15> : tensor<32x8x8xi32>} : () -> tensor<32x8x8xi32>
    %44 = "stablehlo.and"(%42, %43) : (tensor<32x8x8xi32>, tensor<32x8x8xi32>) -> tensor<32x8x8xi32>
    %45 = "stablehlo.convert"(%44) : (tensor<32x8x8xi32>) -> tensor<32x8x8xf32>
    %46 = "stablehlo.reshape"(%45) : (tensor<32x8x8xf32>) -> tensor<32x2x32xf32>
    %47 = "stablehlo.convert"(%37) : (tensor<32x2xbf16>) -> tensor<32x2xf32>
    %48 = "stablehlo.convert"(%38) : (tensor<32x2xbf16>) -> tensor<32x2xf32>
    %49 = "stablehlo.broadcast_in_dim"(%47) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x2xf32>) -> tensor<32x2x32xf32>
    %50 = "stablehlo.broadcast_in_dim"(%48) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x2xf32>) -> tensor<32x2x32xf32>
    %51 = "stablehlo.multiply"(%46, %49) : (tensor<32x2x32xf32>, tensor<32x2x32xf32>) -> tensor<32x2x32xf32>
    %52 = "stablehlo.add"(%51, %50) : (tensor<32x2x32xf32>, tensor<32x2x32xf32>) -> tensor<32x2x32xf32>
    %53 = "stablehlo.reshape"(%13) : (tensor<1x1x64xf32>) -> tensor<1x1x2x32xf32>
    %54 = "stablehlo.dot_general"(%52, %53) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1, 2], rhs_contracting_dimensions = [2, 3]>} : (tensor<32x2x32xf32>, tensor<1x1x2x32xf32>) -> tensor<32x1x1xf32>
    %55 = "stablehlo.reshape"(%54) : (tensor<32x1x1xf32>) -> tensor<1x1x32xf32>
    %56 = "stablehlo.reshape"(%55) : (tensor<1x1x32xf32>) -> tensor<1x1x2x16xf32>
    %57 = "stablehlo.transpose"(%56) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<1x1x2x16xf32>) -> tensor<1x2x1x16xf32>
    %58 = util.global.load @"model.layers.0.self_attn.v_proj.weight" : tensor<32x8xi32>
    %59 = util.global.load @"model.layers.0.self_attn.v_proj.scales" : tensor<32x2xbf16>
    %60 = util.global.load @"model.layers.0.self_attn.v_proj.biases" : tensor<32x2xbf16>
    %61 = "stablehlo.broadcast_in_dim"(%58) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x8xi32>) -> tensor<32x8x8xi32>
    %62 = "stablehlo.constant"() {value = dense<[0, 4, 8, 12, 16, 20, 24, 28]> : tensor<8xi32>} : () -> tensor<8xi32>
    %63 = "stablehlo.broadcast_in_dim"(%62) {broadcast_dimensions = array<i64: 2>} : (tensor<8xi32>) -> tensor<32x8x8xi32>
    %64 = "stablehlo.shift_right_logical"(%61, %63) : (tensor<32x8x8xi32>, tensor<32x8x8xi32>) -> tensor<32x8x8xi32>
    %65 = "stablehlo.constant"() {value = dense<15> : tensor<32x8x8xi32>} : () -> tensor<32x8x8xi32>
    %66 = "stablehlo.and"(%64, %65) : (tensor<32x8x8xi32>, tensor<32x8x8xi32>) -> tensor<32x8x8xi32>
    %67 = "stablehlo.convert"(%66) : (tensor<32x8x8xi32>) -> tensor<32x8x8xf32>
    %68 = "stablehlo.reshape"(%67) : (tensor<32x8x8xf32>) -> tensor<32x2x32xf32>
    %69 = "stablehlo.convert"(%59) : (tensor<32x2xbf16>) -> tensor<32x2xf32>
    %70 = "stablehlo.convert"(%60) : (tensor<32x2xbf16>) -> tensor<32x2xf32>
    %71 = "stablehlo.broadcast_in_dim"(%69) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x2xf32>) -> tensor<32x2x32xf32>
    %72 = "stablehlo.broadcast_in_dim"(%70) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x2xf32>) -> tensor<32x2x32xf32>
    %73 = "stablehlo.multiply"(%68, %71) : (tensor<32x2x32xf32>, tensor<32x2x32xf32>) -> tensor<32x2x32xf32>
    %74 = "stablehlo.add"(%73, %72) : (tensor<32x2x32xf32>, tensor<32x2x32xf32>) -> tensor<32x2x32xf32>
    %75 = "stablehlo.reshape"(%13) : (tensor<1x1x64xf32>) -> tensor<1x1x2x32xf32>
    %76 = "stablehlo.dot_general"(%74, %75) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1, 2], rhs_contracting_dimensions = [2, 3]>} : (tensor<32x2x32xf32>, tensor<1x1x2x32xf32>) -> tensor<32x1x1xf32>
    %77 = "stablehlo.reshape"(%76) : (tensor<32x1x1xf32>) -> tensor<1x1x32xf32>
    %78 = "stablehlo.reshape"(%77) : (tensor<1x1x32xf32>) -> tensor<1x1x2x16xf32>
    %79 = "stablehlo.transpose"(%78) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<1x1x2x16xf32>) -> tensor<1x2x1x16xf32>
    %80 = "stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<1xi32>
    %81 = "stablehlo.broadcast_in_dim"(%offset) {broadcast_dimensions = array<i64>} : (tensor<i32>) -> tensor<1xi32>
    %82 = "stablehlo.add"(%80, %81) : (tensor<1xi32>, tensor<1xi32>) -> tensor<1xi32>
    %83 = "stablehlo.convert"(%82) : (tensor<1xi32>) -> tensor<1xf32>
    %84 = "stablehlo.broadcast_in_dim"(%83) {broadcast_dimensions = array<i64: 0>} : (tensor<1xf32>) -> tensor<1x8xf32>
    %85 = "stablehlo.constant"() {value = dense<[1.0e0, 3.1622776e-1, 1.0e-1, 3.162278e-2, 1.0e-2, 3.1622779e-3, 1.0e-3, 3.162278e-4]> : tensor<8xf32>} : () -> tensor<8xf32>
    %86 = "stablehlo.broadcast_in_dim"(%85) {broadcast_dimensions = array<i64: 1>} : (tensor<8xf32>) -> tensor<1x8xf32>
    %87 = "stablehlo.multiply"(%84, %86) : (tensor<1x8xf32>, tensor<1x8xf32>) -> tensor<1x8xf32>
    %88 = "stablehlo.cosine"(%87) : (tensor<1x8xf32>) -> tensor<1x8xf32>
    %89 = "stablehlo.sine"(%87) : (tensor<1x8xf32>) -> tensor<1x8xf32>
    %90 = "stablehlo.broadcast_in_dim"(%88) {broadcast_dimensions = array<i64: 2, 3>} : (tensor<1x8xf32>) -> tensor<1x4x1x8xf32>
    %91 = "stablehlo.broadcast_in_dim"(%89) {broadcast_dimensions = array<i64: 2, 3>} : (tensor<1x8xf32>) -> tensor<1x4x1x8xf32>
    %92 = "stablehlo.slice"(%35) {start_indices = array<i64: 0, 0, 0, 0>, limit_indices = array<i64: 1, 4, 1, 16>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x4x1x16xf32>) -> tensor<1x4x1x16xf32>
    %93 = "stablehlo.slice"(%92) {start_indices = array<i64: 0, 0, 0, 0>, limit_indices = array<i64: 1, 4, 1, 8>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x4x1x16xf32>) -> tensor<1x4x1x8xf32>
    %94 = "stablehlo.slice"(%92) {start_indices = array<i64: 0, 0, 0, 8>, limit_indices = array<i64: 1, 4, 1, 16>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x4x1x16xf32>) -> tensor<1x4x1x8xf32>
    %95 = "stablehlo.multiply"(%93, %90) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %96 = "stablehlo.multiply"(%94, %91) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %97 = "stablehlo.subtract"(%95, %96) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %98 = "stablehlo.multiply"(%93, %91) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %99 = "stablehlo.multiply"(%94, %90) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %100 = "stablehlo.add"(%98, %99) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %101 = "stablehlo.concatenate"(%97, %100) {dimension = 3 : i64} : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x16xf32>
    %102 = "stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<1xi32>
    %103 = "stablehlo.broadcast_in_dim"(%offset) {broadcast_dimensions = array<i64>} : (tensor<i32>) -> tensor<1xi32>
    %104 = "stablehlo.add"(%102, %103) : (tensor<1xi32>, tensor<1xi32>) -> tensor<1xi32>
    %105 = "stablehlo.convert"(%104) : (tensor<1xi32>) -> tensor<1xf32>
    %106 = "stablehlo.broadcast_in_dim"(%105) {broadcast_dimensions = array<i64: 0>} : (tensor<1xf32>) -> tensor<1x8xf32>
    %107 = "stablehlo.constant"() {value = dense<[1.0e0, 3.1622776e-1, 1.0e-1, 3.162278e-2, 1.0e-2, 3.1622779e-3, 1.0e-3, 3.162278e-4]> : tensor<8xf32>} : () -> tensor<8xf32>
    %108 = "stablehlo.broadcast_in_dim"(%107) {broadcast_dimensions = array<i64: 1>} : (tensor<8xf32>) -> tensor<1x8xf32>
    %109 = "stablehlo.multiply"(%106, %108) : (tensor<1x8xf32>, tensor<1x8xf32>) -> tensor<1x8xf32>
    %110 = "stablehlo.cosine"(%109) : (tensor<1x8xf32>) -> tensor<1x8xf32>
    %111 = "stablehlo.sine"(%109) : (tensor<1x8xf32>) -> tensor<1x8xf32>
    %112 = "stablehlo.broadcast_in_dim"(%110) {broadcast_dimensions = array<i64: 2, 3>} : (tensor<1x8xf32>) -> tensor<1x2x1x8xf32>
    %113 = "stablehlo.broadcast_in_dim"(%111) {broadcast_dimensions = array<i64: 2, 3>} : (tensor<1x8xf32>) -> tensor<1x2x1x8xf32>
    %114 = "stablehlo.slice"(%57) {start_indices = array<i64: 0, 0, 0, 0>, limit_indices = array<i64: 1, 2, 1, 16>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x2x1x16xf32>) -> tensor<1x2x1x16xf32>
    %115 = "stablehlo.slice"(%114) {start_indices = array<i64: 0, 0, 0, 0>, limit_indices = array<i64: 1, 2, 1, 8>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x2x1x16xf32>) -> tensor<1x2x1x8xf32>
    %116 = "stablehlo.slice"(%114) {start_indices = array<i64: 0, 0, 0, 8>, limit_indices = array<i64: 1, 2, 1, 16>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x2x1x16xf32>) -> tensor<1x2x1x8xf32>
    %117 = "stablehlo.multiply"(%115, %112) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %118 = "stablehlo.multiply"(%116, %113) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %119 = "stablehlo.subtract"(%117, %118) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %120 = "stablehlo.multiply"(%115, %113) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %121 = "stablehlo.multiply"(%116, %112) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %122 = "stablehlo.add"(%120, %121) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %123 = "stablehlo.concatenate"(%119, %122) {dimension = 3 : i64} : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x16xf32>
    %124 = "stablehlo.constant"() {value = dense<0> : tensor<i32>} : () -> tensor<i32>
    %125 = "stablehlo.dynamic_update_slice"(%cache_k, %123, %124, %124, %offset, %124) : (tensor<1x2x32x16xf32>, tensor<1x2x1x16xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x32x16xf32>
    %126 = "stablehlo.constant"() {value = dense<0> : tensor<i32>} : () -> tensor<i32>
    %127 = "stablehlo.dynamic_update_slice"(%cache_v, %79, %126, %126, %offset, %126) : (tensor<1x2x32x16xf32>, tensor<1x2x1x16xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x32x16xf32>
    %128 = "stablehlo.reshape"(%101) : (tensor<1x4x1x16xf32>) -> tensor<1x2x2x16xf32>
    %129 = "stablehlo.dot_general"(%128, %125) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [3]>} : (tensor<1x2x2x16xf32>, tensor<1x2x32x16xf32>) -> tensor<1x2x2x32xf32>
    %130 = "stablehlo.constant"() {value = dense<2.5e-1> : tensor<1x2x2x32xf32>} : () -> tensor<1x2x2x32xf32>
    %131 = "stablehlo.multiply"(%129, %130) : (tensor<1x2x2x32xf32>, tensor<1x2x2x32xf32>) -> tensor<1x2x2x32xf32>
    %132 = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<1x2x32xi32>
    %133 = "stablehlo.constant"() {value = dense<1> : tensor<1x2x32xi32>} : () -> tensor<1x2x32xi32>
    %134 = "stablehlo.divide"(%132, %133) : (tensor<1x2x32xi32>, tensor<1x2x32xi32>) -> tensor<1x2x32xi32>
    %135 = "stablehlo.multiply"(%134, %133) : (tensor<1x2x32xi32>, tensor<1x2x32xi32>) -> tensor<1x2x32xi32>
    %136 = "stablehlo.subtract"(%132, %135) : (tensor<1x2x32xi32>, tensor<1x2x32xi32>) -> tensor<1x2x32xi32>
    %137 = "stablehlo.broadcast_in_dim"(%offset) {broadcast_dimensions = array<i64>} : (tensor<i32>) -> tensor<1x2x32xi32>
    %138 = "stablehlo.add"(%136, %137) : (tensor<1x2x32xi32>, tensor<1x2x32xi32>) -> tensor<1x2x32xi32>
    %139 = "stablehlo.iota"() {iota_dimension = 2 : i64} : () -> tensor<1x2x32xi32>
    %140 = "stablehlo.compare"(%139, %138) {comparison_direction = #stablehlo<comparison_direction LE>} : (tensor<1x2x32xi32>, tensor<1x2x32xi32>) -> tensor<1x2x32xi1>
    %141 = "stablehlo.broadcast_in_dim"(%140) {broadcast_dimensions = array<i64: 0, 2, 3>} : (tensor<1x2x32xi1>) -> tensor<1x2x2x32xi1>
    %142 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<1x2x2x32xf32>} : () -> tensor<1x2x2x32xf32>
    %143 = "stablehlo.select"(%141, %131, %142) : (tensor<1x2x2x32xi1>, tensor<1x2x2x32xf32>, tensor<1x2x2x32xf32>) -> tensor<1x2x2x32xf32>
    %144 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %145 = "stablehlo.reduce"(%143, %144) ({
    ^bb0(%-acc: tensor<f32>, %-elt: tensor<f32>):
      %-folded = "stablehlo.maximum"(%-acc, %-elt) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%-folded) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 3>} : (tensor<1x2x2x32xf32>, tensor<f32>) -> tensor<1x2x2xf32>
    %146 = "stablehlo.broadcast_in_dim"(%145) {broadcast_dimensions = array<i64: 0, 1, 2>} : (tensor<1x2x2xf32>) -> tensor<1x2x2x32xf32>
    %147 = "stablehlo.subtract"(%143, %146) : (tensor<1x2x2x32xf32>, tensor<1x2x2x32xf32>) -> tensor<1x2x2x32xf32>
    %148 = "stablehlo.exponential"(%147) : (tensor<1x2x2x32xf32>) -> tensor<1x2x2x32xf32>
    %149 = "stablehlo.constant"() {value = dense<0.0e0> : tensor<f32>} : () -> tensor<f32>
    %150 = "stablehlo.reduce"(%148, %149) ({
    ^bb0(%-acc: tensor<f32>, %-elt: tensor<f32>):
      %-folded = "stablehlo.add"(%-acc, %-elt) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%-folded) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 3>} : (tensor<1x2x2x32xf32>, tensor<f32>) -> tensor<1x2x2xf32>
    %151 = "stablehlo.broadcast_in_dim"(%150) {broadcast_dimensions = array<i64: 0, 1, 2>} : (tensor<1x2x2xf32>) -> tensor<1x2x2x32xf32>
    %152 = "stablehlo.divide"(%148, %151) : (tensor<1x2x2x32xf32>, tensor<1x2x2x32xf32>) -> tensor<1x2x2x32xf32>
    %153 = "stablehlo.dot_general"(%152, %127) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]>} : (tensor<1x2x2x32xf32>, tensor<1x2x32x16xf32>) -> tensor<1x2x2x16xf32>
    %154 = "stablehlo.reshape"(%153) : (tensor<1x2x2x16xf32>) -> tensor<1x4x1x16xf32>
    %155 = "stablehlo.transpose"(%154) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<1x4x1x16xf32>) -> tensor<1x1x4x16xf32>
    %156 = "stablehlo.reshape"(%155) : (tensor<1x1x4x16xf32>) -> tensor<1x1x64xf32>
    %157 = util.global.load @"model.layers.0.self_attn.o_proj.weight" : tensor<64x8xi32>
    %158 = util.global.load @"model.layers.0.self_attn.o_proj.scales" : tensor<64x2xbf16>
    %159 = util.global.load @"model.layers.0.self_attn.o_proj.biases" : tensor<64x2xbf16>
    %160 = "stablehlo.broadcast_in_dim"(%157) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<64x8xi32>) -> tensor<64x8x8xi32>
    %161 = "stablehlo.constant"() {value = dense<[0, 4, 8, 12, 16, 20, 24, 28]> : tensor<8xi32>} : () -> tensor<8xi32>
    %162 = "stablehlo.broadcast_in_dim"(%161) {broadcast_dimensions = array<i64: 2>} : (tensor<8xi32>) -> tensor<64x8x8xi32>
    %163 = "stablehlo.shift_right_logical"(%160, %162) : (tensor<64x8x8xi32>, tensor<64x8x8xi32>) -> tensor<64x8x8xi32>
    %164 = "stablehlo.constant"() {value = dense<15> : tensor<64x8x8xi32>} : () -> tensor<64x8x8xi32>
    %165 = "stablehlo.and"(%163, %164) : (tensor<64x8x8xi32>, tensor<64x8x8xi32>) -> tensor<64x8x8xi32>
    %166 = "stablehlo.convert"(%165) : (tensor<64x8x8xi32>) -> tensor<64x8x8xf32>
    %167 = "stablehlo.reshape"(%166) : (tensor<64x8x8xf32>) -> tensor<64x2x32xf32>
    %168 = "stablehlo.convert"(%158) : (tensor<64x2xbf16>) -> tensor<64x2xf32>
    %169 = "stablehlo.convert"(%159) : (tensor<64x2xbf16>) -> tensor<64x2xf32>
    %170 = "stablehlo.broadcast_in_dim"(%168) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<64x2xf32>) -> tensor<64x2x32xf32>
    %171 = "stablehlo.broadcast_in_dim"(%169) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<64x2xf32>) -> tensor<64x2x32xf32>
    %172 = "stablehlo.multiply"(%167, %170) : (tensor<64x2x32xf32>, tensor<64x2x32xf32>) -> tensor<64x2x32xf32>
    %173 = "stablehlo.add"(%172, %171) : (tensor<64x2x32xf32>, tensor<64x2x32xf32>) -> tensor<64x2x32xf32>
    %174 = "stablehlo.reshape"(%156) : (tensor<1x1x64xf32>) -> tensor<1x1x2x32xf32>
    %175 = "stablehlo.dot_general"(%173, %174) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1, 2], rhs_contracting_dimensions = [2, 3]>} : (tensor<64x2x32xf32>, tensor<1x1x2x32xf32>) -> tensor<64x1x1xf32>
    %176 = "stablehlo.reshape"(%175) : (tensor<64x1x1xf32>) -> tensor<1x1x64xf32>
    %177 = "stablehlo.add"(%x, %176) : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    func.return %177, %125, %127 : tensor<1x1x64xf32>, tensor<1x2x32x16xf32>, tensor<1x2x32x16xf32>
  }
}

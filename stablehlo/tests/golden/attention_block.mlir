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
    ^bb0(%acc: tensor<f32>, %elt: tensor<f32>):
      %folded = "stablehlo.add"(%acc, %elt) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%folded) : (tensor<f32>) -> ()
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
    %32 = "stablehlo.dot_general"(%31, %30) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [2, 3], rhs_contracting_dimensions = [1, 2]>} : (tensor<1x1x2x32xf32>, tensor<64x2x32xf32>) -> tensor<1x1x64xf32>
    %33 = "stablehlo.reshape"(%32) : (tensor<1x1x64xf32>) -> tensor<1x1x4x16xf32>
    %34 = "stablehlo.transpose"(%33) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<1x1x4x16xf32>) -> tensor<1x4x1x16xf32>
    %35 = util.global.load @"model.layers.0.self_attn.k_proj.weight" : tensor<32x8xi32>
    %36 = util.global.load @"model.layers.0.self_attn.k_proj.scales" : tensor<32x2xbf16>
    %37 = util.global.load @"model.layers.0.self_attn.k_proj.biases" : tensor<32x2xbf16>
    %38 = "stablehlo.broadcast_in_dim"(%35) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x8xi32>) -> tensor<32x8x8xi32>
    %39 = "stablehlo.constant"() {value = dense<[0, 4, 8, 12, 16, 20, 24, 28]> : tensor<8xi32>} : () -> tensor<8xi32>
    %40 = "stablehlo.broadcast_in_dim"(%39) {broadcast_dimensions = array<i64: 2>} : (tensor<8xi32>) -> tensor<32x8x8xi32>
    %41 = "stablehlo.shift_right_logical"(%38, %40) : (tensor<32x8x8xi32>, tensor<32x8x8xi32>) -> tensor<32x8x8xi32>
    %42 = "stablehlo.constant"() {value = dense<15> : tensor<32x8x8xi32>} : () -> tensor<32x8x8xi32>
    %43 = "stablehlo.and"(%41, %42) : (tensor<32x8x8xi32>, tensor<32x8x8xi32>) -> tensor<32x8x8xi32>
    %44 = "stablehlo.convert"(%43) : (tensor<32x8x8xi32>) -> tensor<32x8x8xf32>
    %45 = "stablehlo.reshape"(%44) : (tensor<32x8x8xf32>) -> tensor<32x2x32xf32>
    %46 = "stablehlo.convert"(%36) : (tensor<32x2xbf16>) -> tensor<32x2xf32>
    %47 = "stablehlo.convert"(%37) : (tensor<32x2xbf16>) -> tensor<32x2xf32>
    %48 = "stablehlo.broadcast_in_dim"(%46) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x2xf32>) -> tensor<32x2x32xf32>
    %49 = "stablehlo.broadcast_in_dim"(%47) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x2xf32>) -> tensor<32x2x32xf32>
    %50 = "stablehlo.multiply"(%45, %48) : (tensor<32x2x32xf32>, tensor<32x2x32xf32>) -> tensor<32x2x32xf32>
    %51 = "stablehlo.add"(%50, %49) : (tensor<32x2x32xf32>, tensor<32x2x32xf32>) -> tensor<32x2x32xf32>
    %52 = "stablehlo.reshape"(%13) : (tensor<1x1x64xf32>) -> tensor<1x1x2x32xf32>
    %53 = "stablehlo.dot_general"(%52, %51) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [2, 3], rhs_contracting_dimensions = [1, 2]>} : (tensor<1x1x2x32xf32>, tensor<32x2x32xf32>) -> tensor<1x1x32xf32>
    %54 = "stablehlo.reshape"(%53) : (tensor<1x1x32xf32>) -> tensor<1x1x2x16xf32>
    %55 = "stablehlo.transpose"(%54) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<1x1x2x16xf32>) -> tensor<1x2x1x16xf32>
    %56 = util.global.load @"model.layers.0.self_attn.v_proj.weight" : tensor<32x8xi32>
    %57 = util.global.load @"model.layers.0.self_attn.v_proj.scales" : tensor<32x2xbf16>
    %58 = util.global.load @"model.layers.0.self_attn.v_proj.biases" : tensor<32x2xbf16>
    %59 = "stablehlo.broadcast_in_dim"(%56) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x8xi32>) -> tensor<32x8x8xi32>
    %60 = "stablehlo.constant"() {value = dense<[0, 4, 8, 12, 16, 20, 24, 28]> : tensor<8xi32>} : () -> tensor<8xi32>
    %61 = "stablehlo.broadcast_in_dim"(%60) {broadcast_dimensions = array<i64: 2>} : (tensor<8xi32>) -> tensor<32x8x8xi32>
    %62 = "stablehlo.shift_right_logical"(%59, %61) : (tensor<32x8x8xi32>, tensor<32x8x8xi32>) -> tensor<32x8x8xi32>
    %63 = "stablehlo.constant"() {value = dense<15> : tensor<32x8x8xi32>} : () -> tensor<32x8x8xi32>
    %64 = "stablehlo.and"(%62, %63) : (tensor<32x8x8xi32>, tensor<32x8x8xi32>) -> tensor<32x8x8xi32>
    %65 = "stablehlo.convert"(%64) : (tensor<32x8x8xi32>) -> tensor<32x8x8xf32>
    %66 = "stablehlo.reshape"(%65) : (tensor<32x8x8xf32>) -> tensor<32x2x32xf32>
    %67 = "stablehlo.convert"(%57) : (tensor<32x2xbf16>) -> tensor<32x2xf32>
    %68 = "stablehlo.convert"(%58) : (tensor<32x2xbf16>) -> tensor<32x2xf32>
    %69 = "stablehlo.broadcast_in_dim"(%67) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x2xf32>) -> tensor<32x2x32xf32>
    %70 = "stablehlo.broadcast_in_dim"(%68) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<32x2xf32>) -> tensor<32x2x32xf32>
    %71 = "stablehlo.multiply"(%66, %69) : (tensor<32x2x32xf32>, tensor<32x2x32xf32>) -> tensor<32x2x32xf32>
    %72 = "stablehlo.add"(%71, %70) : (tensor<32x2x32xf32>, tensor<32x2x32xf32>) -> tensor<32x2x32xf32>
    %73 = "stablehlo.reshape"(%13) : (tensor<1x1x64xf32>) -> tensor<1x1x2x32xf32>
    %74 = "stablehlo.dot_general"(%73, %72) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [2, 3], rhs_contracting_dimensions = [1, 2]>} : (tensor<1x1x2x32xf32>, tensor<32x2x32xf32>) -> tensor<1x1x32xf32>
    %75 = "stablehlo.reshape"(%74) : (tensor<1x1x32xf32>) -> tensor<1x1x2x16xf32>
    %76 = "stablehlo.transpose"(%75) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<1x1x2x16xf32>) -> tensor<1x2x1x16xf32>
    %77 = "stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<1xi32>
    %78 = "stablehlo.broadcast_in_dim"(%offset) {broadcast_dimensions = array<i64>} : (tensor<i32>) -> tensor<1xi32>
    %79 = "stablehlo.add"(%77, %78) : (tensor<1xi32>, tensor<1xi32>) -> tensor<1xi32>
    %80 = "stablehlo.convert"(%79) : (tensor<1xi32>) -> tensor<1xf32>
    %81 = "stablehlo.broadcast_in_dim"(%80) {broadcast_dimensions = array<i64: 0>} : (tensor<1xf32>) -> tensor<1x8xf32>
    %82 = "stablehlo.constant"() {value = dense<[1.0e0, 3.1622776e-1, 1.0e-1, 3.162278e-2, 1.0e-2, 3.1622779e-3, 1.0e-3, 3.162278e-4]> : tensor<8xf32>} : () -> tensor<8xf32>
    %83 = "stablehlo.broadcast_in_dim"(%82) {broadcast_dimensions = array<i64: 1>} : (tensor<8xf32>) -> tensor<1x8xf32>
    %84 = "stablehlo.multiply"(%81, %83) : (tensor<1x8xf32>, tensor<1x8xf32>) -> tensor<1x8xf32>
    %85 = "stablehlo.cosine"(%84) : (tensor<1x8xf32>) -> tensor<1x8xf32>
    %86 = "stablehlo.sine"(%84) : (tensor<1x8xf32>) -> tensor<1x8xf32>
    %87 = "stablehlo.broadcast_in_dim"(%85) {broadcast_dimensions = array<i64: 2, 3>} : (tensor<1x8xf32>) -> tensor<1x4x1x8xf32>
    %88 = "stablehlo.broadcast_in_dim"(%86) {broadcast_dimensions = array<i64: 2, 3>} : (tensor<1x8xf32>) -> tensor<1x4x1x8xf32>
    %89 = "stablehlo.slice"(%34) {start_indices = array<i64: 0, 0, 0, 0>, limit_indices = array<i64: 1, 4, 1, 16>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x4x1x16xf32>) -> tensor<1x4x1x16xf32>
    %90 = "stablehlo.slice"(%89) {start_indices = array<i64: 0, 0, 0, 0>, limit_indices = array<i64: 1, 4, 1, 8>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x4x1x16xf32>) -> tensor<1x4x1x8xf32>
    %91 = "stablehlo.slice"(%89) {start_indices = array<i64: 0, 0, 0, 8>, limit_indices = array<i64: 1, 4, 1, 16>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x4x1x16xf32>) -> tensor<1x4x1x8xf32>
    %92 = "stablehlo.multiply"(%90, %87) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %93 = "stablehlo.multiply"(%91, %88) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %94 = "stablehlo.subtract"(%92, %93) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %95 = "stablehlo.multiply"(%90, %88) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %96 = "stablehlo.multiply"(%91, %87) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %97 = "stablehlo.add"(%95, %96) : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32>
    %98 = "stablehlo.concatenate"(%94, %97) {dimension = 3 : i64} : (tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x1x16xf32>
    %99 = "stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<1xi32>
    %100 = "stablehlo.broadcast_in_dim"(%offset) {broadcast_dimensions = array<i64>} : (tensor<i32>) -> tensor<1xi32>
    %101 = "stablehlo.add"(%99, %100) : (tensor<1xi32>, tensor<1xi32>) -> tensor<1xi32>
    %102 = "stablehlo.convert"(%101) : (tensor<1xi32>) -> tensor<1xf32>
    %103 = "stablehlo.broadcast_in_dim"(%102) {broadcast_dimensions = array<i64: 0>} : (tensor<1xf32>) -> tensor<1x8xf32>
    %104 = "stablehlo.constant"() {value = dense<[1.0e0, 3.1622776e-1, 1.0e-1, 3.162278e-2, 1.0e-2, 3.1622779e-3, 1.0e-3, 3.162278e-4]> : tensor<8xf32>} : () -> tensor<8xf32>
    %105 = "stablehlo.broadcast_in_dim"(%104) {broadcast_dimensions = array<i64: 1>} : (tensor<8xf32>) -> tensor<1x8xf32>
    %106 = "stablehlo.multiply"(%103, %105) : (tensor<1x8xf32>, tensor<1x8xf32>) -> tensor<1x8xf32>
    %107 = "stablehlo.cosine"(%106) : (tensor<1x8xf32>) -> tensor<1x8xf32>
    %108 = "stablehlo.sine"(%106) : (tensor<1x8xf32>) -> tensor<1x8xf32>
    %109 = "stablehlo.broadcast_in_dim"(%107) {broadcast_dimensions = array<i64: 2, 3>} : (tensor<1x8xf32>) -> tensor<1x2x1x8xf32>
    %110 = "stablehlo.broadcast_in_dim"(%108) {broadcast_dimensions = array<i64: 2, 3>} : (tensor<1x8xf32>) -> tensor<1x2x1x8xf32>
    %111 = "stablehlo.slice"(%55) {start_indices = array<i64: 0, 0, 0, 0>, limit_indices = array<i64: 1, 2, 1, 16>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x2x1x16xf32>) -> tensor<1x2x1x16xf32>
    %112 = "stablehlo.slice"(%111) {start_indices = array<i64: 0, 0, 0, 0>, limit_indices = array<i64: 1, 2, 1, 8>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x2x1x16xf32>) -> tensor<1x2x1x8xf32>
    %113 = "stablehlo.slice"(%111) {start_indices = array<i64: 0, 0, 0, 8>, limit_indices = array<i64: 1, 2, 1, 16>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x2x1x16xf32>) -> tensor<1x2x1x8xf32>
    %114 = "stablehlo.multiply"(%112, %109) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %115 = "stablehlo.multiply"(%113, %110) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %116 = "stablehlo.subtract"(%114, %115) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %117 = "stablehlo.multiply"(%112, %110) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %118 = "stablehlo.multiply"(%113, %109) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %119 = "stablehlo.add"(%117, %118) : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x8xf32>
    %120 = "stablehlo.concatenate"(%116, %119) {dimension = 3 : i64} : (tensor<1x2x1x8xf32>, tensor<1x2x1x8xf32>) -> tensor<1x2x1x16xf32>
    %121 = "stablehlo.constant"() {value = dense<0> : tensor<i32>} : () -> tensor<i32>
    %122 = "stablehlo.dynamic_update_slice"(%cache_k, %120, %121, %121, %offset, %121) : (tensor<1x2x32x16xf32>, tensor<1x2x1x16xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x32x16xf32>
    %123 = "stablehlo.dynamic_update_slice"(%cache_v, %76, %121, %121, %offset, %121) : (tensor<1x2x32x16xf32>, tensor<1x2x1x16xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x32x16xf32>
    %124 = "stablehlo.reshape"(%98) : (tensor<1x4x1x16xf32>) -> tensor<1x2x2x16xf32>
    %125 = "stablehlo.dot_general"(%124, %122) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [3]>} : (tensor<1x2x2x16xf32>, tensor<1x2x32x16xf32>) -> tensor<1x2x2x32xf32>
    %126 = "stablehlo.constant"() {value = dense<2.5e-1> : tensor<1x2x2x32xf32>} : () -> tensor<1x2x2x32xf32>
    %127 = "stablehlo.multiply"(%125, %126) : (tensor<1x2x2x32xf32>, tensor<1x2x2x32xf32>) -> tensor<1x2x2x32xf32>
    %128 = "stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<2x32xi32>
    %129 = "stablehlo.constant"() {value = dense<1> : tensor<2x32xi32>} : () -> tensor<2x32xi32>
    %130 = "stablehlo.divide"(%128, %129) : (tensor<2x32xi32>, tensor<2x32xi32>) -> tensor<2x32xi32>
    %131 = "stablehlo.multiply"(%130, %129) : (tensor<2x32xi32>, tensor<2x32xi32>) -> tensor<2x32xi32>
    %132 = "stablehlo.subtract"(%128, %131) : (tensor<2x32xi32>, tensor<2x32xi32>) -> tensor<2x32xi32>
    %133 = "stablehlo.broadcast_in_dim"(%offset) {broadcast_dimensions = array<i64>} : (tensor<i32>) -> tensor<2x32xi32>
    %134 = "stablehlo.add"(%132, %133) : (tensor<2x32xi32>, tensor<2x32xi32>) -> tensor<2x32xi32>
    %135 = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<2x32xi32>
    %136 = "stablehlo.compare"(%135, %134) {comparison_direction = #stablehlo<comparison_direction LE>} : (tensor<2x32xi32>, tensor<2x32xi32>) -> tensor<2x32xi1>
    %137 = "stablehlo.broadcast_in_dim"(%136) {broadcast_dimensions = array<i64: 2, 3>} : (tensor<2x32xi1>) -> tensor<1x2x2x32xi1>
    %138 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<1x2x2x32xf32>} : () -> tensor<1x2x2x32xf32>
    %139 = "stablehlo.select"(%137, %127, %138) : (tensor<1x2x2x32xi1>, tensor<1x2x2x32xf32>, tensor<1x2x2x32xf32>) -> tensor<1x2x2x32xf32>
    %140 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %141 = "stablehlo.reduce"(%139, %140) ({
    ^bb0(%acc: tensor<f32>, %elt: tensor<f32>):
      %folded = "stablehlo.maximum"(%acc, %elt) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%folded) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 3>} : (tensor<1x2x2x32xf32>, tensor<f32>) -> tensor<1x2x2xf32>
    %142 = "stablehlo.broadcast_in_dim"(%141) {broadcast_dimensions = array<i64: 0, 1, 2>} : (tensor<1x2x2xf32>) -> tensor<1x2x2x32xf32>
    %143 = "stablehlo.subtract"(%139, %142) : (tensor<1x2x2x32xf32>, tensor<1x2x2x32xf32>) -> tensor<1x2x2x32xf32>
    %144 = "stablehlo.exponential"(%143) : (tensor<1x2x2x32xf32>) -> tensor<1x2x2x32xf32>
    %145 = "stablehlo.constant"() {value = dense<0.0e0> : tensor<f32>} : () -> tensor<f32>
    %146 = "stablehlo.reduce"(%144, %145) ({
    ^bb0(%acc: tensor<f32>, %elt: tensor<f32>):
      %folded = "stablehlo.add"(%acc, %elt) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%folded) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 3>} : (tensor<1x2x2x32xf32>, tensor<f32>) -> tensor<1x2x2xf32>
    %147 = "stablehlo.broadcast_in_dim"(%146) {broadcast_dimensions = array<i64: 0, 1, 2>} : (tensor<1x2x2xf32>) -> tensor<1x2x2x32xf32>
    %148 = "stablehlo.divide"(%144, %147) : (tensor<1x2x2x32xf32>, tensor<1x2x2x32xf32>) -> tensor<1x2x2x32xf32>
    %149 = "stablehlo.dot_general"(%148, %123) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]>} : (tensor<1x2x2x32xf32>, tensor<1x2x32x16xf32>) -> tensor<1x2x2x16xf32>
    %150 = "stablehlo.reshape"(%149) : (tensor<1x2x2x16xf32>) -> tensor<1x4x1x16xf32>
    %151 = "stablehlo.transpose"(%150) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<1x4x1x16xf32>) -> tensor<1x1x4x16xf32>
    %152 = "stablehlo.reshape"(%151) : (tensor<1x1x4x16xf32>) -> tensor<1x1x64xf32>
    %153 = util.global.load @"model.layers.0.self_attn.o_proj.weight" : tensor<64x8xi32>
    %154 = util.global.load @"model.layers.0.self_attn.o_proj.scales" : tensor<64x2xbf16>
    %155 = util.global.load @"model.layers.0.self_attn.o_proj.biases" : tensor<64x2xbf16>
    %156 = "stablehlo.broadcast_in_dim"(%153) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<64x8xi32>) -> tensor<64x8x8xi32>
    %157 = "stablehlo.constant"() {value = dense<[0, 4, 8, 12, 16, 20, 24, 28]> : tensor<8xi32>} : () -> tensor<8xi32>
    %158 = "stablehlo.broadcast_in_dim"(%157) {broadcast_dimensions = array<i64: 2>} : (tensor<8xi32>) -> tensor<64x8x8xi32>
    %159 = "stablehlo.shift_right_logical"(%156, %158) : (tensor<64x8x8xi32>, tensor<64x8x8xi32>) -> tensor<64x8x8xi32>
    %160 = "stablehlo.constant"() {value = dense<15> : tensor<64x8x8xi32>} : () -> tensor<64x8x8xi32>
    %161 = "stablehlo.and"(%159, %160) : (tensor<64x8x8xi32>, tensor<64x8x8xi32>) -> tensor<64x8x8xi32>
    %162 = "stablehlo.convert"(%161) : (tensor<64x8x8xi32>) -> tensor<64x8x8xf32>
    %163 = "stablehlo.reshape"(%162) : (tensor<64x8x8xf32>) -> tensor<64x2x32xf32>
    %164 = "stablehlo.convert"(%154) : (tensor<64x2xbf16>) -> tensor<64x2xf32>
    %165 = "stablehlo.convert"(%155) : (tensor<64x2xbf16>) -> tensor<64x2xf32>
    %166 = "stablehlo.broadcast_in_dim"(%164) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<64x2xf32>) -> tensor<64x2x32xf32>
    %167 = "stablehlo.broadcast_in_dim"(%165) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<64x2xf32>) -> tensor<64x2x32xf32>
    %168 = "stablehlo.multiply"(%163, %166) : (tensor<64x2x32xf32>, tensor<64x2x32xf32>) -> tensor<64x2x32xf32>
    %169 = "stablehlo.add"(%168, %167) : (tensor<64x2x32xf32>, tensor<64x2x32xf32>) -> tensor<64x2x32xf32>
    %170 = "stablehlo.reshape"(%152) : (tensor<1x1x64xf32>) -> tensor<1x1x2x32xf32>
    %171 = "stablehlo.dot_general"(%170, %169) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [2, 3], rhs_contracting_dimensions = [1, 2]>} : (tensor<1x1x2x32xf32>, tensor<64x2x32xf32>) -> tensor<1x1x64xf32>
    %172 = "stablehlo.add"(%x, %171) : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    func.return %172, %122, %123 : tensor<1x1x64xf32>, tensor<1x2x32x16xf32>, tensor<1x2x32x16xf32>
  }
}

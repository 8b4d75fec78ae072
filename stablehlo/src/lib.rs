//! `mlxcel-stablehlo`: emits model graphs as StableHLO and drives
//! `iree-compile` (the IREE backend issue builds it).

//! `mlxcel-compiler`: turns a source model into a `.mlxb` bundle (issue [3]
//! builds it).

//! `mlxcel-runtime`: opens a bundle and generates tokens (issue [4] builds it).

//! `mlxcel-surgery`: weight edits described in YAML and applied at compile
//! time (issue [5] builds it).

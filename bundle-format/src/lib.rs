//! `mlxcel-bundle`: the `.mlxb` bundle format (issue [2] builds it: the
//! normative spec, the streaming writer and the validated mmap reader).

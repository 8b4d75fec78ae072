//! The `rows16` layout (docs/bundle-format.md §4.1): a matrix whose rows come
//! in blocks of 16, each block stored transposed.
//!
//! A tensor of `rows` × `cols` elements (the last dimension is `cols`; for
//! packed quantized codes the elements are the bytes of each row) is stored
//! as `[rows / 16, cols, 16]`: element `(16 t + j, c)` sits at
//! `(t · cols + c) · 16 + j`. For a 4- or 8-bit quantized weight the codes of
//! 16 rows for one input (8-bit) or one pair of inputs (4-bit) are then 16
//! consecutive bytes, and the 16 rows' scales (and biases) for one group are
//! 16 consecutive values: the order mlxcel's CPU kernels read, so that one
//! load serves 16 outputs for every sequence of a batch. Shapes and byte
//! lengths do not change; only the order of the elements does.

use thiserror::Error;

/// The layout tag of [`from_row_major`]'s arrangement.
pub const LAYOUT_ROWS16: &str = "rows16";

/// Rows per transposed block.
pub const BLOCK_ROWS: usize = 16;

/// Why a buffer cannot be rearranged.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Rows16Error {
    /// The element size or row length is zero.
    #[error("rows16: elements of {elem} bytes in rows of {cols} elements cannot form blocks")]
    Empty {
        /// Bytes per element.
        elem: usize,
        /// Elements per row.
        cols: usize,
    },
    /// The buffer is not a whole number of 16-row blocks.
    #[error("rows16: {len} bytes are not whole blocks of 16 rows of {cols} elements of {elem} bytes")]
    NotWholeBlocks {
        /// Bytes given.
        len: usize,
        /// Elements per row.
        cols: usize,
        /// Bytes per element.
        elem: usize,
    },
}

fn block_bytes(len: usize, cols: usize, elem: usize) -> Result<usize, Rows16Error> {
    if elem == 0 || cols == 0 {
        return Err(Rows16Error::Empty { elem, cols });
    }
    let block = BLOCK_ROWS.checked_mul(cols).and_then(|n| n.checked_mul(elem)).ok_or(Rows16Error::NotWholeBlocks {
        len,
        cols,
        elem,
    })?;
    if !len.is_multiple_of(block) {
        return Err(Rows16Error::NotWholeBlocks { len, cols, elem });
    }
    Ok(block)
}

/// Moves each element of every 16-row block of `src` from `at(j, c)` to `to(j, c)`.
fn permute(
    src: &[u8],
    cols: usize,
    elem: usize,
    at: impl Fn(usize, usize) -> usize,
    to: impl Fn(usize, usize) -> usize,
) -> Result<Vec<u8>, Rows16Error> {
    let block = block_bytes(src.len(), cols, elem)?;
    let mut out = vec![0u8; src.len()];
    for (s, d) in src.chunks_exact(block).zip(out.chunks_exact_mut(block)) {
        for j in 0..BLOCK_ROWS {
            for c in 0..cols {
                let (from, into) = (at(j, c) * elem, to(j, c) * elem);
                d[into..into + elem].copy_from_slice(&s[from..from + elem]);
            }
        }
    }
    Ok(out)
}

/// The `rows16` arrangement of row-major `src`: whole blocks of 16 rows of
/// `cols` elements of `elem` bytes each (any number of blocks, so a large
/// tensor can be rearranged block run by block run as it streams).
pub fn from_row_major(src: &[u8], cols: usize, elem: usize) -> Result<Vec<u8>, Rows16Error> {
    permute(src, cols, elem, |j, c| j * cols + c, |j, c| c * BLOCK_ROWS + j)
}

/// The row-major arrangement of `rows16` `src` (the inverse of [`from_row_major`]).
pub fn to_row_major(src: &[u8], cols: usize, elem: usize) -> Result<Vec<u8>, Rows16Error> {
    permute(src, cols, elem, |j, c| c * BLOCK_ROWS + j, |j, c| j * cols + c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_positions_follow_the_spec() {
        // 32 rows of 3 two-byte elements: element (r, c) holds r * 3 + c.
        let (rows, cols) = (32usize, 3usize);
        let src: Vec<u8> = (0..rows * cols).flat_map(|v| (v as u16).to_le_bytes()).collect();
        let out = from_row_major(&src, cols, 2).unwrap();
        for r in 0..rows {
            for c in 0..cols {
                let (t, j) = (r / 16, r % 16);
                let at = ((t * cols + c) * 16 + j) * 2;
                assert_eq!(u16::from_le_bytes([out[at], out[at + 1]]) as usize, r * cols + c);
            }
        }
        assert_eq!(to_row_major(&out, cols, 2).unwrap(), src);
    }

    #[test]
    fn refuses_partial_blocks() {
        assert_eq!(
            from_row_major(&[0u8; 15 * 4], 4, 1),
            Err(Rows16Error::NotWholeBlocks { len: 60, cols: 4, elem: 1 })
        );
        assert_eq!(from_row_major(&[], 0, 1), Err(Rows16Error::Empty { elem: 1, cols: 0 }));
        assert_eq!(
            to_row_major(&[0u8; 16 * 4 * 2 + 1], 4, 2).unwrap_err().to_string(),
            "rows16: 129 bytes are not whole blocks of 16 rows of 4 elements of 2 bytes"
        );
    }
}

//! Zero-copy arrays over `Bytes` (`Array::from_shared_bytes`): they read the
//! source memory in place, keep it alive exactly as long as MLX uses it, never
//! write into it, and fall back to a copy when borrowing is impossible.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use common::*;
use mlxcel_mlx::{Array, Dtype, device, memory};

/// A `Bytes` owner that counts its drops. Its words are 4-byte aligned.
struct Tracked {
    words: Vec<u32>,
    drops: Arc<AtomicUsize>,
}

impl AsRef<[u8]> for Tracked {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.words)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// The data offset in [`tracked_f32`]'s buffers.
const OFFSET: usize = 16;

/// 16 bytes of `filler`, then `values` as f32 (4-byte aligned), owned by a
/// [`Tracked`]; returns the buffer and the owner's drop counter.
fn tracked_f32(values: &[f32], filler: u8) -> (Bytes, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut words = vec![u32::from_ne_bytes([filler; 4]); OFFSET / 4];
    words.extend(values.iter().map(|v| v.to_bits()));
    (Bytes::from_owner(Tracked { words, drops: Arc::clone(&drops) }), drops)
}

/// Whether this build borrows at all (the CPU build must: otherwise every
/// other expectation here would be vacuous).
fn borrows() -> bool {
    init();
    #[cfg(not(feature = "cuda"))]
    assert!(memory::can_borrow(), "the CPU build's allocator must allow borrowing");
    memory::can_borrow()
}

#[test]
fn borrowed_array_reads_the_source_memory_in_place() {
    let borrows = borrows();
    let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    let (bytes, _) = tracked_f32(&values, 0);
    let a = Array::from_shared_bytes(&bytes, OFFSET, &[4, 6], Dtype::F32).unwrap();
    assert_eq!(a.is_borrowed(), borrows);
    let source = bytes[OFFSET..].as_ptr().addr();
    assert_eq!(a.data_address().unwrap() == source, borrows);
    assert_eq!(a.shape(), vec![4, 6]);
    assert_eq!(a.to_vec::<f32>().unwrap(), values);
    // Ops read it like any array.
    let sum = a.sum(&[1], false).unwrap().to_vec::<f32>().unwrap();
    let expected: Vec<f32> = values.chunks(6).map(|r| r.iter().sum()).collect();
    assert_eq!(sum, expected);
    let t = a.transpose(&[1, 0]).unwrap().matmul(&a).unwrap();
    assert_eq!(t.shape(), vec![6, 6]);
    let first = values.chunks(6).map(|r| r[0] * r[0]).sum::<f32>();
    assert_eq!(t.to_vec::<f32>().unwrap()[0], first);
}

#[test]
fn owner_lives_exactly_as_long_as_an_array_uses_it() {
    let borrows = borrows();
    let values: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let (bytes, drops) = tracked_f32(&values, 0);
    let a = Array::from_shared_bytes(&bytes, OFFSET, &[12], Dtype::F32).unwrap();
    drop(bytes);
    // A copy owns its memory: the source goes with the caller's last handle.
    if !borrows {
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        return;
    }
    assert_eq!(drops.load(Ordering::SeqCst), 0, "the array keeps the bytes alive");

    // A clone, then a reshape that shares the buffer once evaluated.
    let clone = a.clone();
    drop(a);
    let view = clone.reshape(&[3, 4]).unwrap();
    view.eval().unwrap();
    assert!(view.is_borrowed());
    drop(clone);
    assert_eq!(drops.load(Ordering::SeqCst), 0, "the reshape shares the buffer");
    assert_eq!(view.to_vec::<f32>().unwrap(), values);

    // An op not yet evaluated holds its input.
    let plus = view.add_scalar(1.0).unwrap();
    drop(view);
    assert_eq!(drops.load(Ordering::SeqCst), 0, "the pending op holds the view");
    plus.eval().unwrap();
    // Evaluation detaches `plus` from its inputs; the CPU stream's task drops
    // its hold on the input buffers once it has run.
    device::synchronize().unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1, "dropped once, when the last user is gone");
    assert!(!plus.is_borrowed());
    let expected: Vec<f32> = values.iter().map(|v| v + 1.0).collect();
    assert_eq!(plus.to_vec::<f32>().unwrap(), expected);
    drop(plus);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn borrowed_memory_is_never_written() {
    let borrows = borrows();
    let values: Vec<f32> = (0..16).map(|i| i as f32 - 4.0).collect();
    let (bytes, drops) = tracked_f32(&values, 0);
    let before = bytes.to_vec();
    // A temporary is the op's only user: an owned buffer would be donated
    // (the output written in place); a borrowed one must not be.
    let out = Array::from_shared_bytes(&bytes, OFFSET, &[16], Dtype::F32).unwrap().multiply_scalar(2.0).unwrap();
    let expected: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
    assert_eq!(out.to_vec::<f32>().unwrap(), expected);
    assert_ne!(out.data_address().unwrap(), bytes[OFFSET..].as_ptr().addr());
    let update = Array::from_slice(&[100.0f32, 200.0], &[2]).unwrap();
    let updated = Array::from_shared_bytes(&bytes, OFFSET, &[16], Dtype::F32)
        .unwrap()
        .slice_update(&update, &[0], &[2], &[1])
        .unwrap();
    assert_eq!(updated.to_vec::<f32>().unwrap()[..3], [100.0, 200.0, values[2]]);
    let unary = Array::from_shared_bytes(&bytes, OFFSET, &[16], Dtype::F32).unwrap().negative().unwrap();
    assert_eq!(unary.to_vec::<f32>().unwrap()[5], -values[5]);
    device::synchronize().unwrap();
    assert_eq!(bytes.to_vec(), before, "MLX wrote into borrowed memory");
    drop((out, updated, unary, bytes));
    device::synchronize().unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    let _ = borrows;
}

#[test]
fn contiguous_copy_or_share_is_right_whatever_the_size_word_holds() {
    let borrows = borrows();
    let values: Vec<f32> = (0..8).map(|i| i as f32 * 3.0).collect();
    // MLX's Contiguous reads the word before the data as the buffer size:
    // zero makes it share the buffer, all ones makes it copy.
    for header in [0x00, 0xff] {
        let (bytes, drops) = tracked_f32(&values, header);
        let a = Array::from_shared_bytes(&bytes, OFFSET, &[2, 4], Dtype::F32).unwrap();
        let c = a.contiguous().unwrap();
        c.eval().unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), values, "header byte {header:#x}");
        let shared = c.data_address().unwrap() == bytes[OFFSET..].as_ptr().addr();
        assert_eq!(shared, borrows && header == 0, "header byte {header:#x}");
        assert_eq!(c.is_borrowed(), shared);
        drop((a, bytes));
        device::synchronize().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), usize::from(!shared), "header byte {header:#x}");
        drop(c);
        device::synchronize().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1, "header byte {header:#x}");
    }
}

#[test]
fn unborrowable_input_is_copied_and_still_right() {
    let borrows = borrows();
    let values: Vec<f32> = (0..6).map(|i| i as f32 + 0.25).collect();
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();

    // Misaligned for f32: one byte past a 4-byte boundary.
    let misaligned = [vec![0u8; OFFSET + 1], raw.clone(), vec![0u8; 3]].concat();
    let misaligned = Bytes::from_owner(Tracked {
        words: bytemuck::pod_collect_to_vec(&misaligned),
        drops: Arc::new(AtomicUsize::new(0)),
    });
    let a = Array::from_shared_bytes(&misaligned, OFFSET + 1, &[2, 3], Dtype::F32).unwrap();
    assert!(!a.is_borrowed(), "misaligned data is copied");
    assert_ne!(a.data_address().unwrap(), misaligned[OFFSET + 1..].as_ptr().addr());
    assert_eq!(a.to_vec::<f32>().unwrap(), values);

    // No room for the size word before the data.
    let bytes = Bytes::from(raw.clone());
    let a = Array::from_shared_bytes(&bytes, 0, &[6], Dtype::F32).unwrap();
    assert!(!a.is_borrowed(), "data at offset 0 is copied");
    assert_eq!(a.to_vec::<f32>().unwrap(), values);

    // Empty.
    let e = Array::from_shared_bytes(&bytes, 8, &[0, 3], Dtype::F32).unwrap();
    assert!(!e.is_borrowed());
    assert_eq!(e.shape(), vec![0, 3]);

    // Single bytes need no alignment: an odd offset still borrows.
    let bytes = Bytes::from((0u8..64).collect::<Vec<u8>>());
    let a = Array::from_shared_bytes(&bytes, 9, &[5], Dtype::U8).unwrap();
    assert_eq!(a.is_borrowed(), borrows);
    assert_eq!(a.to_vec::<u8>().unwrap(), vec![9, 10, 11, 12, 13]);
}

#[test]
fn out_of_range_or_bad_shapes_are_errors() {
    init();
    let bytes = Bytes::from(vec![0u8; 64]);
    assert!(Array::from_shared_bytes(&bytes, 16, &[13], Dtype::F32).is_err(), "runs past the end");
    assert!(Array::from_shared_bytes(&bytes, 65, &[0], Dtype::F32).is_err(), "starts past the end");
    assert!(Array::from_shared_bytes(&bytes, usize::MAX, &[1], Dtype::U8).is_err(), "offset overflows");
    assert!(Array::from_shared_bytes(&bytes, 16, &[-1], Dtype::F32).is_err(), "negative dimension");
    assert!(Array::from_shared_bytes(&bytes, 16, &[i32::MAX; 4], Dtype::F64).is_err(), "size overflows");
    let fits = Array::from_shared_bytes(&bytes, 16, &[12], Dtype::F32).unwrap();
    assert_eq!(fits.to_vec::<f32>().unwrap(), vec![0.0; 12]);
}

//! The archived manifest layout is normative (docs/bundle-format.md, "Manifest
//! records"): these assertions fail when a change to the manifest types would
//! silently change the file format. Update the spec, and the format version,
//! together with them.

use std::mem::{align_of, offset_of, size_of};

use mlxcel_bundle::manifest::*;
use rkyv::option::ArchivedOption;
use rkyv::string::ArchivedString;
use rkyv::vec::ArchivedVec;

macro_rules! layout {
    ($t:ty, size $size:expr, align $align:expr; $($field:ident @ $at:expr),* $(,)?) => {{
        assert_eq!(size_of::<$t>(), $size, "size of {}", stringify!($t));
        assert_eq!(align_of::<$t>(), $align, "align of {}", stringify!($t));
        $( assert_eq!(offset_of!($t, $field), $at, "{}.{}", stringify!($t), stringify!($field)); )*
    }};
}

#[test]
fn building_blocks_match_the_spec() {
    assert_eq!((size_of::<ArchivedString>(), align_of::<ArchivedString>()), (8, 4));
    assert_eq!((size_of::<ArchivedVec<u8>>(), align_of::<ArchivedVec<u8>>()), (8, 4));
    assert_eq!((size_of::<ArchivedOption<ArchivedString>>(), align_of::<ArchivedOption<ArchivedString>>()), (12, 4));
    assert_eq!((size_of::<rkyv::Archived<u64>>(), align_of::<rkyv::Archived<u64>>()), (8, 8));
    assert_eq!((size_of::<rkyv::Archived<u32>>(), align_of::<rkyv::Archived<u32>>()), (4, 4));
}

#[test]
fn manifest_records_match_the_spec() {
    layout!(ArchivedManifest, size 184, align 4;
        model @ 0, tokenizer @ 24, tensors @ 48, sections @ 56, provenance @ 64, metadata @ 168, extensions @ 176);
    layout!(ArchivedModelInfo, size 24, align 4; architecture @ 0, name @ 8, config_json @ 16);
    layout!(ArchivedTokenizerInfo, size 24, align 4; chat_template @ 0, generation_defaults_json @ 12);
    layout!(ArchivedTensorEntry, size 128, align 8;
        name @ 0, dtype @ 8, shape @ 16, offset @ 24, length @ 32, blake3 @ 40, layout @ 72, quantization @ 80,
        properties @ 120);
    layout!(ArchivedQuantization, size 36, align 4; mode @ 0, bits @ 8, group_size @ 12, scales @ 16, biases @ 24);
    layout!(ArchivedSectionEntry, size 80, align 8;
        kind @ 0, key @ 8, target @ 16, offset @ 24, length @ 32, blake3 @ 40, properties @ 72);
    layout!(ArchivedProvenance, size 104, align 4;
        compiler_version @ 0, mlx_version @ 8, source_files @ 16, compile_options_json @ 24,
        quantization_recipe_json @ 32, surgery @ 44, repacks @ 96);
    layout!(ArchivedSourceFile, size 24, align 8; name @ 0, size @ 8, digest @ 16);
    layout!(ArchivedSurgeryRecord, size 48, align 4; yaml @ 0, blake3 @ 8, operations @ 40);
    layout!(ArchivedSurgeryOperation, size 20, align 4; description @ 0, matched_tensors @ 8);
    layout!(ArchivedRepackRecord, size 32, align 4; transform @ 0, layout @ 8, tensors @ 16, params_json @ 24);
    layout!(ArchivedKeyValue, size 16, align 4; key @ 0, value @ 8);
    layout!(ArchivedExtension, size 20, align 4; name @ 0, required @ 8, payload @ 12);
    assert_eq!(size_of::<ArchivedOption<ArchivedQuantization>>(), 40);
    assert_eq!(size_of::<ArchivedOption<ArchivedSurgeryRecord>>(), 52);
    assert_eq!(size_of::<ArchivedOption<ArchivedVec<ArchivedString>>>(), 12);
}

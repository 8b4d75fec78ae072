//! What both targets do with a bundle that opened: read everything a
//! runtime would, then verify every byte. Nothing here may panic.

use mlxcel_bundle::Bundle;

pub fn exercise(bundle: &Bundle) {
    for t in bundle.tensors() {
        let _ = (t.data().len(), t.shape(), t.quantization(), t.layout(), t.property("x"));
        let _ = bundle.tensor(t.name()).map(|again| again.data().len());
    }
    for s in bundle.sections() {
        let _ = (s.data().len(), s.property("x"));
    }
    let _ = (bundle.tokenizer_json(), bundle.chat_template(), bundle.config_json(), bundle.metadata("x"));
    let _ = bundle.to_manifest();
    let _ = bundle.verify(|_| {});
}

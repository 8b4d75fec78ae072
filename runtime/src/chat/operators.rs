//! Operators that pay for the containers they touch.
//!
//! minijinja's VM runs `~`, `+`, `*`, the comparisons and `in` itself,
//! where no formatter, filter or callback of ours is reached: `x ~ ''`
//! formats all of `x` before any fuel is charged, `[0] * n` and `a + b`
//! build lazy sequences that cost nothing until something walks them, and
//! `a == b` recurses through nested containers. [`rewrite`] turns each of
//! those instructions of a compiled template into a call of one of the
//! filters [`install`] registers, which pays for the operands' items
//! ([`super::fuel::charge_items`]), builds any sequence the operator makes
//! item by item on the render's fuel, and leaves the arithmetic itself to
//! minijinja (the same expression, evaluated by a plain environment).
//!
//! The rewrite uses minijinja's `unstable_machinery` API, so the crate is
//! pinned to one version (runtime/Cargo.toml).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use minijinja::machinery::{Instruction, Instructions};
use minijinja::value::ValueKind;
use minijinja::{Environment, Error, Expression, State, Value, context};

use super::fuel::{BUILTINS, charge_items};

/// Each rewritten instruction: the filter that replaces it and the
/// expression that computes it once the operands are paid for.
const OPERATORS: &[(&str, &str)] = &[
    ("__mlxcel_concat", "a ~ b"),
    ("__mlxcel_add", "a + b"),
    ("__mlxcel_mul", "a * b"),
    ("__mlxcel_eq", "a == b"),
    ("__mlxcel_ne", "a != b"),
    ("__mlxcel_lt", "a < b"),
    ("__mlxcel_lte", "a <= b"),
    ("__mlxcel_gt", "a > b"),
    ("__mlxcel_gte", "a >= b"),
    ("__mlxcel_in", "a in b"),
];

/// The filter that replaces `instruction`, if it is one of [`OPERATORS`].
fn replacement(instruction: &Instruction<'_>) -> Option<&'static str> {
    let index = match instruction {
        Instruction::StringConcat => 0,
        Instruction::Add => 1,
        Instruction::Mul => 2,
        Instruction::Eq => 3,
        Instruction::Ne => 4,
        Instruction::Lt => 5,
        Instruction::Lte => 6,
        Instruction::Gt => 7,
        Instruction::Gte => 8,
        Instruction::In => 9,
        _ => return None,
    };
    Some(OPERATORS[index].0)
}

/// [`OPERATORS`]' expressions, compiled once in the environment without
/// fuel (the caller has paid).
static EXPRESSIONS: LazyLock<BTreeMap<&'static str, Expression<'static, 'static>>> = LazyLock::new(|| {
    OPERATORS
        .iter()
        .map(|&(name, source)| (name, BUILTINS.compile_expression(source).expect("operator expressions compile")))
        .collect()
});

/// A copy of `instructions` (same indices, lines and spans, so jumps and
/// error positions stay right) with every operator of [`OPERATORS`]
/// replaced by a two-argument call of its filter. A binary operator pops
/// its operands in the order they were pushed, as a filter's arguments are.
pub(super) fn rewrite<'source>(instructions: &Instructions<'source>) -> Instructions<'source> {
    let mut out = Instructions::new(instructions.name(), instructions.source());
    let mut index = 0;
    while let Some(instruction) = instructions.get(index) {
        let instruction = match replacement(instruction) {
            // `!0`: no cache slot, so the lookup cannot collide with the
            // slots the code generator gave the template's own filters.
            Some(filter) => Instruction::ApplyFilter(filter, Some(2), !0),
            None => instruction.clone(),
        };
        match (instructions.get_span(index), instructions.get_line(index)) {
            (Some(span), _) => out.add_with_span(instruction, span),
            (None, Some(line)) => out.add_with_line(instruction, line.try_into().unwrap_or(u16::MAX)),
            (None, None) => out.add(instruction),
        };
        index += 1;
    }
    out
}

/// Registers the operator filters in `env`.
pub(super) fn install(env: &mut Environment<'static>) {
    for &(name, _) in OPERATORS {
        env.add_filter(name, move |state: &State, a: Value, b: Value| -> Result<Value, Error> {
            charge_items(state, &a)?;
            charge_items(state, &b)?;
            if name == "__mlxcel_mul" {
                charge_repeated_text(state, &a, &b)?;
            }
            let result = EXPRESSIONS[name].eval(context! { a => a, b => b }).map_err(|e| {
                e.detail().map_or_else(|| Error::from(e.kind()), |d| Error::new(e.kind(), d.to_owned()))
            })?;
            materialize(state, result)
        });
    }
}

/// Pays for the text `'ab' * n` will make before it is made (minijinja's
/// own check of it needs the fuel the plain environment does not have).
fn charge_repeated_text(state: &State, a: &Value, b: &Value) -> Result<(), Error> {
    let (text, count) = if a.as_str().is_some() { (a, b) } else { (b, a) };
    if let (Some(text), Ok(count)) = (text.as_str(), i64::try_from(count.clone())) {
        let bytes = (text.len() as u64).saturating_mul(count.max(0) as u64);
        state.consume_fuel(bytes / 64)?;
    }
    Ok(())
}

/// A lazy sequence (what `+` and `*` make of sequences) built into a list
/// item by item, each item paid for; anything else as it is.
fn materialize(state: &State, value: Value) -> Result<Value, Error> {
    if value.kind() != ValueKind::Iterable || value.len().is_none() {
        return Ok(value);
    }
    let mut items = Vec::new();
    for item in value.try_iter()? {
        state.consume_fuel(1)?;
        items.push(item);
    }
    Ok(Value::from(items))
}

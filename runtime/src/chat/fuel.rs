//! Fuel for the work minijinja does not charge: walking a container to
//! format, serialize, compare or hash it.
//!
//! minijinja charges a container for its top level when it is built and
//! for its text only after it has written it. A lazily repeated sequence
//! (`[0] * 100000000`) costs one instruction, and a shared one doubles per
//! instruction (`[a, a]`), so a few bytes of template could make `{{ x }}`,
//! `x | tojson` or `x | string` walk 10^8 items, or 2^60. Before any of
//! those runs, [`charge_items`] walks the value once and pays one fuel per
//! item it reaches, so the walk ends where the render's fuel does and the
//! work that follows is bounded by what was paid for.
//!
//! Operators run inside minijinja's VM, where no formatter, filter or
//! callback is reached (`x ~ ''`, `a == b`): operators.rs makes those pay
//! with [`charge_items`] too.

use std::sync::LazyLock;

use minijinja::value::{Rest, ValueKind};
use minijinja::{Environment, Error, Output, State, Value};

/// Fuel per item walked: what one instruction costs, so a walk of `n`
/// items costs what a loop over them would.
const FUEL_PER_ITEM: u64 = 1;

/// The built-in filters that format, serialize, compare or hash their
/// input as a whole; each is replaced by one that pays for its arguments'
/// items first. (Filters that iterate, such as `map`, `select` or `list`,
/// are charged per item by minijinja and stay as they are.)
const WHOLE_VALUE_FILTERS: &[&str] = &[
    "string",
    "tojson",
    "pprint",
    "join",
    "upper",
    "lower",
    "title",
    "capitalize",
    "trim",
    "escape",
    "e",
    "safe",
    "indent",
    "replace",
    "format",
    "urlencode",
    "unique",
    "sort",
    "dictsort",
    "min",
    "max",
    "truncate",
    "striptags",
    "wordcount",
    "wordwrap",
];

/// minijinja's defaults and the contrib filters, unwrapped and without
/// fuel: what a charged filter or operator calls once its arguments are
/// paid for.
pub(super) static BUILTINS: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    minijinja_contrib::add_to_environment(&mut env);
    env
});

/// Pays [`FUEL_PER_ITEM`] for every item reachable from `value` (the keys
/// and values of maps, the items of sequences and of iterables whose length
/// is known: the ones minijinja's formatter walks). Iterative, so a deeply
/// nested value cannot overflow the stack.
pub(super) fn charge_items(state: &State, value: &Value) -> Result<(), Error> {
    let mut open = Vec::new();
    let mut reached = vec![value.clone()];
    loop {
        for value in reached.drain(..) {
            let walked = match value.kind() {
                ValueKind::Map => true,
                ValueKind::Seq | ValueKind::Iterable => value.len().is_some(),
                _ => false,
            };
            if walked && let Ok(items) = value.try_iter() {
                open.push((value, items));
            }
        }
        let Some((container, items)) = open.last_mut() else { return Ok(()) };
        match items.next() {
            None => {
                open.pop();
            }
            Some(item) => {
                state.consume_fuel(FUEL_PER_ITEM)?;
                if container.kind() == ValueKind::Map
                    && let Ok(value) = container.get_item(&item)
                {
                    reached.push(value);
                }
                reached.push(item);
            }
        }
    }
}

/// Installs the charging formatter, filters and method callback in `env`.
pub(super) fn install(env: &mut Environment<'static>) {
    env.set_formatter(|out: &mut Output, state: &mut State, value: &Value| {
        charge_items(state, value)?;
        minijinja::escape_formatter(out, state, value)
    });
    for &name in WHOLE_VALUE_FILTERS {
        env.add_filter(name, move |state: &State, args: Rest<Value>| -> Result<Value, Error> {
            for arg in args.iter() {
                charge_items(state, arg)?;
            }
            BUILTINS.empty_state().apply_filter(name, &args)
        });
    }
    env.set_unknown_method_callback(|state: &mut State, value: &Value, method: &str, args: &[Value]| {
        for value in std::iter::once(value).chain(args) {
            charge_items(state, value)?;
        }
        minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
    });
}

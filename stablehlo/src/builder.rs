//! A typed builder of StableHLO modules, printed as MLIR text.
//!
//! Every op checks its operands' shapes and element types and computes its
//! result type, so a graph that builds is one `iree-compile` accepts; a
//! mistake is an [`Error::Shape`] naming the op, not a diagnostic from a
//! compiler run later. Ops are printed in MLIR's generic form
//! (`"stablehlo.add"(%0, %1) : (...) -> ...`), which every StableHLO version
//! parses the same way.
//!
//! Weights are never constants: [`Function::parameter`] loads a module
//! global bound to an IREE named parameter (`#stream.parameter.named<"model"::NAME>`)
//! whose name is the bundle tensor's, so the runtime supplies the bundle's
//! bytes at load and the weights stay in the bundle once.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::error::{Error, Result, shape};
use crate::types::{ElementType, TensorType};

/// The parameter scope the emitted globals name (`"model"::NAME`); the
/// runtime registers the bundle's tensors under it.
pub const PARAMETER_SCOPE: &str = "model";

/// A value of a function being built: an argument or an op's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    name: String,
    ty: TensorType,
}

impl Value {
    /// The value's type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The value's shape.
    pub fn shape(&self) -> &[i64] {
        &self.ty.shape
    }

    /// The value's element type.
    pub fn element(&self) -> ElementType {
        self.ty.element
    }
}

/// How [`Function::compare`] compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparison {
    /// `a == b`
    Eq,
    /// `a != b`
    Ne,
    /// `a < b`
    Lt,
    /// `a <= b`
    Le,
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
}

/// What [`Function::reduce`] folds with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// The sum (starting from zero).
    Sum,
    /// The maximum (starting from minus infinity).
    Max,
}

/// A StableHLO module: functions and the parameters they load.
#[derive(Default)]
pub struct Module {
    name: String,
    parameters: Parameters,
    functions: Vec<String>,
    function_names: Vec<String>,
}

impl Module {
    /// An empty module called `name` (`module @name`).
    pub fn new(name: &str) -> Module {
        Module { name: name.to_string(), ..Module::default() }
    }

    /// A function called `name` taking `args` (their names are for reading
    /// the text only). Build its body, then [`Function::finish`] it into
    /// this module.
    pub fn function(&self, name: &str, args: &[(&str, TensorType)]) -> Function {
        // Names as given where MLIR accepts them, made unique (a repeated
        // name gets its position appended).
        let mut seen = std::collections::HashSet::new();
        let args: Vec<Value> = args
            .iter()
            .enumerate()
            .map(|(i, (n, ty))| {
                let mut name = sanitize(n);
                if !seen.insert(name.clone()) {
                    name = format!("{name}_{i}");
                    seen.insert(name.clone());
                }
                Value { name: format!("%{name}"), ty: ty.clone() }
            })
            .collect();
        let outputs = vec![None; args.len()];
        Function {
            name: name.to_string(),
            args,
            outputs,
            body: String::new(),
            next: 0,
            parameters: Parameters::default(),
        }
    }

    /// The parameters the module's functions load, with their types, in
    /// first-use order.
    pub fn parameters(&self) -> &[(String, TensorType)] {
        &self.parameters.list
    }

    /// The module as MLIR text.
    pub fn to_mlir(&self) -> String {
        let mut out = format!("module @{} {{\n", sanitize(&self.name));
        for (name, ty) in &self.parameters.list {
            let _ = writeln!(
                out,
                "  util.global private @{} = #stream.parameter.named<\"{PARAMETER_SCOPE}\"::{}> : {ty}",
                quoted(name),
                quoted(name)
            );
        }
        for f in &self.functions {
            out.push_str(f);
        }
        out.push_str("}\n");
        out
    }
}

/// Parameter names and their types, in first-use order: a module's globals,
/// or the parameters one function loads.
#[derive(Default)]
struct Parameters {
    list: Vec<(String, TensorType)>,
    index: HashMap<String, usize>,
}

impl Parameters {
    /// Adds `name` of type `ty`, unless it is there: then `ty` must be its type.
    fn declare(&mut self, name: &str, ty: &TensorType) -> Result<()> {
        match self.index.get(name) {
            Some(&i) if self.list[i].1 != *ty => Err(Error::ParameterType {
                name: name.to_string(),
                first: self.list[i].1.to_string(),
                second: ty.to_string(),
            }),
            Some(_) => Ok(()),
            None => {
                self.index.insert(name.to_string(), self.list.len());
                self.list.push((name.to_string(), ty.clone()));
                Ok(())
            }
        }
    }
}

/// A function being built (see [`Module::function`]).
pub struct Function {
    name: String,
    args: Vec<Value>,
    /// Per argument: the result written into its storage (see [`Function::write_result_into`]).
    outputs: Vec<Option<usize>>,
    body: String,
    next: usize,
    parameters: Parameters,
}

impl Function {
    /// The function's arguments, in order.
    pub fn args(&self) -> &[Value] {
        &self.args
    }

    /// The argument at `index` (panics past the last, like indexing [`Function::args`]).
    pub fn arg(&self, index: usize) -> Value {
        self.args[index].clone()
    }

    /// Result `result` is written into argument `arg`'s storage instead of a
    /// buffer IREE allocates (`iree.abi.output`): a KV cache passed in is
    /// updated where it lies, not copied into a new cache every step. The
    /// caller's buffer then holds the result after the call; the two must
    /// have one type (checked by [`Function::finish`]).
    pub fn write_result_into(&mut self, arg: usize, result: usize) -> Result<()> {
        let taken = self.outputs.contains(&Some(result));
        match self.outputs.get_mut(arg) {
            Some(slot @ None) if !taken => {
                *slot = Some(result);
                Ok(())
            }
            _ => Err(shape(
                "func",
                format!("result {result} written into argument {arg} (of {}; each once)", self.args.len()),
            )),
        }
    }

    /// Ends the function returning `results` and adds it to `module`.
    pub fn finish(self, module: &mut Module, results: &[&Value]) -> Result<()> {
        let symbol = sanitize(&self.name);
        if module.function_names.contains(&symbol) {
            return Err(shape("func", format!("a second function @{symbol} in module @{}", sanitize(&module.name))));
        }
        for (arg, result) in self.outputs.iter().enumerate().filter_map(|(a, r)| r.map(|r| (a, r))) {
            if results.get(result).is_none_or(|r| r.ty != self.args[arg].ty) {
                return Err(shape(
                    "func",
                    format!(
                        "result {result} written into argument {arg} {}: {}",
                        self.args[arg].ty,
                        results.get(result).map_or("no such result".to_string(), |r| r.ty.to_string())
                    ),
                ));
            }
        }
        for (name, ty) in &self.parameters.list {
            module.parameters.declare(name, ty)?;
        }
        let args: Vec<String> = self
            .args
            .iter()
            .zip(&self.outputs)
            .map(|(a, out)| match out {
                Some(r) => format!("{}: {} {{iree.abi.output = {r} : index}}", a.name, a.ty),
                None => format!("{}: {}", a.name, a.ty),
            })
            .collect();
        let types: Vec<String> = results.iter().map(|r| r.ty.to_string()).collect();
        let names: Vec<&str> = results.iter().map(|r| r.name.as_str()).collect();
        let mut text =
            format!("  func.func @{}({}) -> ({}) {{\n", sanitize(&self.name), args.join(", "), types.join(", "));
        text.push_str(&self.body);
        let _ = writeln!(text, "    func.return {} : {}", names.join(", "), types.join(", "));
        text.push_str("  }\n");
        module.functions.push(text);
        module.function_names.push(symbol);
        Ok(())
    }

    /// The bundle tensor `name` of type `ty`, loaded from its parameter.
    pub fn parameter(&mut self, name: &str, ty: TensorType) -> Result<Value> {
        self.parameters.declare(name, &ty)?;
        let v = self.fresh(ty);
        let _ = writeln!(self.body, "    {} = util.global.load @{} : {}", v.name, quoted(name), v.ty);
        Ok(v)
    }

    fn fresh(&mut self, ty: TensorType) -> Value {
        let v = Value { name: format!("%{}", self.next), ty };
        self.next += 1;
        v
    }

    /// Prints `result = "stablehlo.OP"(operands) {attrs} : (types) -> type`.
    fn op(&mut self, op: &str, operands: &[&Value], attrs: &str, result: TensorType) -> Value {
        let v = self.fresh(result);
        let names: Vec<&str> = operands.iter().map(|o| o.name.as_str()).collect();
        let types: Vec<String> = operands.iter().map(|o| o.ty.to_string()).collect();
        let attrs = if attrs.is_empty() { String::new() } else { format!(" {{{attrs}}}") };
        let _ = writeln!(
            self.body,
            "    {} = \"stablehlo.{op}\"({}){attrs} : ({}) -> {}",
            v.name,
            names.join(", "),
            types.join(", "),
            v.ty
        );
        v
    }

    // ------------------------------------------------------------ constants

    /// A tensor of type `ty` whose every element is `value`.
    pub fn splat(&mut self, value: f64, ty: TensorType) -> Value {
        let attrs = format!("value = dense<{}> : {ty}", ty.element.literal(value));
        self.op("constant", &[], &attrs, ty)
    }

    /// A scalar constant.
    pub fn scalar(&mut self, value: f64, element: ElementType) -> Value {
        self.splat(value, TensorType::scalar(element))
    }

    /// A 1-D integer constant holding `values`.
    pub fn ints(&mut self, values: &[i64], element: ElementType) -> Result<Value> {
        if element.is_float() || values.is_empty() {
            return Err(shape("constant", format!("ints of {} ({} values)", element.mlir(), values.len())));
        }
        let ty = TensorType::new(&[values.len() as i64], element);
        let list: Vec<String> = values.iter().map(i64::to_string).collect();
        let attrs = format!("value = dense<[{}]> : {ty}", list.join(", "));
        Ok(self.op("constant", &[], &attrs, ty))
    }

    /// A 1-D f32 constant holding `values`.
    pub fn floats(&mut self, values: &[f32]) -> Result<Value> {
        if values.is_empty() {
            return Err(shape("constant", "no values"));
        }
        let ty = TensorType::new(&[values.len() as i64], ElementType::F32);
        let list: Vec<String> = values.iter().map(|&v| ElementType::F32.literal(f64::from(v))).collect();
        let attrs = format!("value = dense<[{}]> : {ty}", list.join(", "));
        Ok(self.op("constant", &[], &attrs, ty))
    }

    /// `0, 1, 2, ...` along axis `dim` of a tensor of type `ty`.
    pub fn iota(&mut self, ty: TensorType, dim: usize) -> Result<Value> {
        if dim >= ty.rank() {
            return Err(shape("iota", format!("axis {dim} of {ty}")));
        }
        Ok(self.op("iota", &[], &format!("iota_dimension = {dim} : i64"), ty))
    }

    // ---------------------------------------------------------- elementwise

    fn same_types(op: &'static str, a: &Value, b: &Value) -> Result<()> {
        if a.ty != b.ty {
            return Err(shape(op, format!("operands {} and {} differ (broadcast first)", a.ty, b.ty)));
        }
        Ok(())
    }

    fn binary(&mut self, op: &'static str, a: &Value, b: &Value) -> Result<Value> {
        Self::same_types(op, a, b)?;
        Ok(self.op(op, &[a, b], "", a.ty.clone()))
    }

    /// `a + b`, elementwise.
    pub fn add(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary("add", a, b)
    }

    /// `a - b`, elementwise.
    pub fn subtract(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary("subtract", a, b)
    }

    /// `a * b`, elementwise.
    pub fn multiply(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary("multiply", a, b)
    }

    /// `a / b`, elementwise.
    pub fn divide(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary("divide", a, b)
    }

    /// `max(a, b)`, elementwise.
    pub fn maximum(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary("maximum", a, b)
    }

    /// `min(a, b)`, elementwise.
    pub fn minimum(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary("minimum", a, b)
    }

    /// `a & b` of integers, elementwise.
    pub fn and(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary("and", a, b)
    }

    /// `a | b` of integers, elementwise.
    pub fn or(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary("or", a, b)
    }

    /// `a >> b` of integers, shifting in zeros, elementwise (zero when `b`
    /// is the bit width or more, as StableHLO defines it).
    pub fn shift_right_logical(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary("shift_right_logical", a, b)
    }

    /// `a << b` of integers, elementwise (zero when `b` is the bit width or more).
    pub fn shift_left(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary("shift_left", a, b)
    }

    fn unary(&mut self, op: &'static str, x: &Value) -> Result<Value> {
        if !x.element().is_float() {
            return Err(shape(op, format!("needs a float operand, got {}", x.ty)));
        }
        Ok(self.op(op, &[x], "", x.ty.clone()))
    }

    /// `e^x`, elementwise.
    pub fn exp(&mut self, x: &Value) -> Result<Value> {
        self.unary("exponential", x)
    }

    /// `1/sqrt(x)`, elementwise.
    pub fn rsqrt(&mut self, x: &Value) -> Result<Value> {
        self.unary("rsqrt", x)
    }

    /// `tanh(x)`, elementwise.
    pub fn tanh(&mut self, x: &Value) -> Result<Value> {
        self.unary("tanh", x)
    }

    /// `1/(1 + e^-x)`, elementwise.
    pub fn logistic(&mut self, x: &Value) -> Result<Value> {
        self.unary("logistic", x)
    }

    /// `cos(x)`, elementwise.
    pub fn cosine(&mut self, x: &Value) -> Result<Value> {
        self.unary("cosine", x)
    }

    /// `sin(x)`, elementwise.
    pub fn sine(&mut self, x: &Value) -> Result<Value> {
        self.unary("sine", x)
    }

    /// `-x`, elementwise.
    pub fn negate(&mut self, x: &Value) -> Result<Value> {
        self.unary("negate", x)
    }

    /// `x` converted to `element`.
    pub fn convert(&mut self, x: &Value, element: ElementType) -> Value {
        if x.element() == element {
            return x.clone();
        }
        self.op("convert", &[x], "", x.ty.with_element(element))
    }

    /// `a <dir> b`, elementwise, as booleans.
    pub fn compare(&mut self, a: &Value, dir: Comparison, b: &Value) -> Result<Value> {
        Self::same_types("compare", a, b)?;
        let dir = match dir {
            Comparison::Eq => "EQ",
            Comparison::Ne => "NE",
            Comparison::Lt => "LT",
            Comparison::Le => "LE",
            Comparison::Gt => "GT",
            Comparison::Ge => "GE",
        };
        let attrs = format!("comparison_direction = #stablehlo<comparison_direction {dir}>");
        Ok(self.op("compare", &[a, b], &attrs, a.ty.with_element(ElementType::I1)))
    }

    /// `pred ? a : b`, elementwise.
    pub fn select(&mut self, pred: &Value, a: &Value, b: &Value) -> Result<Value> {
        Self::same_types("select", a, b)?;
        if pred.element() != ElementType::I1 || pred.shape() != a.shape() {
            return Err(shape("select", format!("predicate {} for operands {}", pred.ty, a.ty)));
        }
        Ok(self.op("select", &[pred, a, b], "", a.ty.clone()))
    }

    // ---------------------------------------------------------------- shape

    /// `x` placed into a tensor of `shape`: axis `i` of `x` becomes axis
    /// `dims[i]` of the result and is repeated along the others.
    pub fn broadcast_in_dim(&mut self, x: &Value, shape_to: &[i64], dims: &[usize]) -> Result<Value> {
        let ok = dims.len() == x.ty.rank()
            && dims.windows(2).all(|w| w[0] < w[1])
            && dims.iter().zip(x.shape()).all(|(&d, &n)| d < shape_to.len() && (n == 1 || n == shape_to[d]));
        if !ok {
            return Err(shape("broadcast_in_dim", format!("{} to {shape_to:?} along {dims:?}", x.ty)));
        }
        let attrs = format!("broadcast_dimensions = array<i64{}>", list(dims));
        Ok(self.op("broadcast_in_dim", &[x], &attrs, TensorType::new(shape_to, x.element())))
    }

    /// `x` broadcast to `shape` as NumPy does: trailing axes aligned, axes of
    /// size one repeated.
    pub fn broadcast_to(&mut self, x: &Value, shape_to: &[i64]) -> Result<Value> {
        if x.shape() == shape_to {
            return Ok(x.clone());
        }
        let rank = x.ty.rank();
        if rank > shape_to.len() {
            return Err(shape("broadcast", format!("{} to the smaller rank of {shape_to:?}", x.ty)));
        }
        let dims: Vec<usize> = (shape_to.len() - rank..shape_to.len()).collect();
        self.broadcast_in_dim(x, shape_to, &dims)
    }

    /// `x` with the same elements in `shape`.
    pub fn reshape(&mut self, x: &Value, shape_to: &[i64]) -> Result<Value> {
        let ty = TensorType::new(shape_to, x.element());
        if ty.elements() != x.ty.elements() || shape_to.iter().any(|&d| d < 0) {
            return Err(shape("reshape", format!("{} to {shape_to:?}", x.ty)));
        }
        if x.ty == ty {
            return Ok(x.clone());
        }
        Ok(self.op("reshape", &[x], "", ty))
    }

    /// `x` with its axes permuted: result axis `i` is axis `perm[i]` of `x`.
    pub fn transpose(&mut self, x: &Value, perm: &[usize]) -> Result<Value> {
        let mut seen = vec![false; x.ty.rank()];
        let ok =
            perm.len() == x.ty.rank() && perm.iter().all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
        if !ok {
            return Err(shape("transpose", format!("{} by {perm:?}", x.ty)));
        }
        let shape_to: Vec<i64> = perm.iter().map(|&p| x.shape()[p]).collect();
        let attrs = format!("permutation = array<i64{}>", list(perm));
        Ok(self.op("transpose", &[x], &attrs, TensorType::new(&shape_to, x.element())))
    }

    /// `x[start..limit]` along every axis (unit strides).
    pub fn slice(&mut self, x: &Value, start: &[i64], limit: &[i64]) -> Result<Value> {
        let r = x.ty.rank();
        let ok = start.len() == r
            && limit.len() == r
            && (0..r).all(|i| 0 <= start[i] && start[i] <= limit[i] && limit[i] <= x.shape()[i]);
        if !ok {
            return Err(shape("slice", format!("{} from {start:?} to {limit:?}", x.ty)));
        }
        let shape_to: Vec<i64> = (0..r).map(|i| limit[i] - start[i]).collect();
        let attrs = format!(
            "start_indices = array<i64{}>, limit_indices = array<i64{}>, strides = array<i64{}>",
            list(start),
            list(limit),
            list(&vec![1; r])
        );
        Ok(self.op("slice", &[x], &attrs, TensorType::new(&shape_to, x.element())))
    }

    /// `x[.., from..to, ..]` along one axis.
    pub fn slice_axis(&mut self, x: &Value, axis: usize, from: i64, to: i64) -> Result<Value> {
        if axis >= x.ty.rank() {
            return Err(shape("slice", format!("axis {axis} of {}", x.ty)));
        }
        let mut start = vec![0; x.ty.rank()];
        let mut limit = x.shape().to_vec();
        start[axis] = from;
        limit[axis] = to;
        self.slice(x, &start, &limit)
    }

    /// `xs` joined along `axis`.
    pub fn concatenate(&mut self, xs: &[&Value], axis: usize) -> Result<Value> {
        let first = xs.first().ok_or_else(|| shape("concatenate", "nothing to join"))?;
        let r = first.ty.rank();
        let ok = axis < r
            && xs.iter().all(|x| {
                x.element() == first.element()
                    && x.ty.rank() == r
                    && (0..r).all(|i| i == axis || x.shape()[i] == first.shape()[i])
            });
        if !ok {
            let types: Vec<String> = xs.iter().map(|x| x.ty.to_string()).collect();
            return Err(shape("concatenate", format!("{} along axis {axis}", types.join(", "))));
        }
        let mut shape_to = first.shape().to_vec();
        shape_to[axis] = xs.iter().map(|x| x.shape()[axis]).sum();
        Ok(self.op(
            "concatenate",
            xs,
            &format!("dimension = {axis} : i64"),
            TensorType::new(&shape_to, first.element()),
        ))
    }

    // ------------------------------------------------------------ contraction

    /// The general matrix product: the result's axes are the batch axes,
    /// then `lhs`'s free axes, then `rhs`'s.
    pub fn dot_general(
        &mut self,
        lhs: &Value,
        rhs: &Value,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
    ) -> Result<Value> {
        let (ls, rs) = (lhs.shape(), rhs.shape());
        let fits = |a: &[usize], b: &[usize]| {
            a.len() == b.len() && a.iter().zip(b).all(|(&i, &j)| i < ls.len() && j < rs.len() && ls[i] == rs[j])
        };
        if !fits(batch.0, batch.1) || !fits(contract.0, contract.1) || lhs.element() != rhs.element() {
            return Err(shape(
                "dot_general",
                format!("{} · {} with batch {batch:?}, contracting {contract:?}", lhs.ty, rhs.ty),
            ));
        }
        let free = |s: &[i64], used: [&[usize]; 2]| -> Vec<i64> {
            (0..s.len()).filter(|i| !used[0].contains(i) && !used[1].contains(i)).map(|i| s[i]).collect()
        };
        let mut shape_to: Vec<i64> = batch.0.iter().map(|&i| ls[i]).collect();
        shape_to.extend(free(ls, [batch.0, contract.0]));
        shape_to.extend(free(rs, [batch.1, contract.1]));
        let attrs = format!(
            "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [{}], rhs_batching_dimensions = [{}], \
             lhs_contracting_dimensions = [{}], rhs_contracting_dimensions = [{}]>",
            bare(batch.0),
            bare(batch.1),
            bare(contract.0),
            bare(contract.1)
        );
        Ok(self.op("dot_general", &[lhs, rhs], &attrs, TensorType::new(&shape_to, lhs.element())))
    }

    /// `x` folded over `axes` (which disappear from the shape).
    pub fn reduce(&mut self, x: &Value, axes: &[usize], how: Reduction) -> Result<Value> {
        if axes.is_empty() || axes.iter().any(|&a| a >= x.ty.rank()) || !x.element().is_float() {
            return Err(shape("reduce", format!("{} over {axes:?}", x.ty)));
        }
        let (init, fold) = match how {
            Reduction::Sum => (0.0, "add"),
            Reduction::Max => (f64::NEG_INFINITY, "maximum"),
        };
        let init = self.scalar(init, x.element());
        let shape_to: Vec<i64> = (0..x.ty.rank()).filter(|i| !axes.contains(i)).map(|i| x.shape()[i]).collect();
        let result = TensorType::new(&shape_to, x.element());
        let s = TensorType::scalar(x.element());
        let v = self.fresh(result);
        // The region's names start with `-`, which argument names never do
        // (`sanitize`), so nothing outside is shadowed.
        let _ = write!(
            self.body,
            "    {v} = \"stablehlo.reduce\"({x}, {init}) ({{\n    ^bb0(%-acc: {s}, %-elt: {s}):\n      \
             %-folded = \"stablehlo.{fold}\"(%-acc, %-elt) : ({s}, {s}) -> {s}\n      \
             \"stablehlo.return\"(%-folded) : ({s}) -> ()\n    }}) {{dimensions = array<i64{dims}>}} : ({xt}, {s}) -> {rt}\n",
            v = v.name,
            x = x.name,
            init = init.name,
            dims = list(axes),
            xt = x.ty,
            rt = v.ty,
        );
        Ok(v)
    }

    // ------------------------------------------------------------- indexing

    fn indices(op: &'static str, x: &Value, starts: &[&Value]) -> Result<()> {
        let ok =
            starts.len() == x.ty.rank() && starts.iter().all(|s| s.ty.rank() == 0 && s.element() == ElementType::I32);
        if !ok {
            return Err(shape(op, format!("{} starts for {} (one i32 scalar per axis)", starts.len(), x.ty)));
        }
        Ok(())
    }

    /// `operand` with `update` written at `starts` (one i32 scalar per axis;
    /// clamped so the update fits, as StableHLO defines it).
    pub fn dynamic_update_slice(&mut self, operand: &Value, update: &Value, starts: &[&Value]) -> Result<Value> {
        Self::indices("dynamic_update_slice", operand, starts)?;
        let fits = update.element() == operand.element()
            && update.ty.rank() == operand.ty.rank()
            && update.shape().iter().zip(operand.shape()).all(|(u, o)| u <= o);
        if !fits {
            return Err(shape("dynamic_update_slice", format!("{} into {}", update.ty, operand.ty)));
        }
        let mut operands = vec![operand, update];
        operands.extend_from_slice(starts);
        Ok(self.op("dynamic_update_slice", &operands, "", operand.ty.clone()))
    }

    /// The `sizes` block of `operand` at `starts` (clamped to fit).
    pub fn dynamic_slice(&mut self, operand: &Value, starts: &[&Value], sizes: &[i64]) -> Result<Value> {
        Self::indices("dynamic_slice", operand, starts)?;
        if sizes.len() != operand.ty.rank() || sizes.iter().zip(operand.shape()).any(|(s, o)| *s < 0 || s > o) {
            return Err(shape("dynamic_slice", format!("{sizes:?} of {}", operand.ty)));
        }
        let mut operands = vec![operand];
        operands.extend_from_slice(starts);
        let attrs = format!("slice_sizes = array<i64{}>", list(sizes));
        Ok(self.op("dynamic_slice", &operands, &attrs, TensorType::new(sizes, operand.element())))
    }

    /// The entries `indices` (constants) of `x` along `axis`: the same shape
    /// with that axis `indices.len()` long.
    pub fn take(&mut self, x: &Value, axis: usize, indices: &[i64]) -> Result<Value> {
        let r = x.ty.rank();
        if axis >= r || indices.is_empty() || indices.iter().any(|&i| i < 0 || i >= x.shape()[axis]) {
            return Err(shape("gather", format!("entries {indices:?} of axis {axis} of {}", x.ty)));
        }
        let entries: Vec<String> = indices.iter().map(i64::to_string).collect();
        let ity = TensorType::new(&[indices.len() as i64, 1], ElementType::I32);
        let attrs = format!("value = dense<[[{}]]> : {ity}", entries.join("], ["));
        let ids = self.op("constant", &[], &attrs, ity);
        let offset_dims: Vec<usize> = (0..r).filter(|&d| d != axis).collect();
        let mut sizes = x.shape().to_vec();
        sizes[axis] = 1;
        let mut shape_to = x.shape().to_vec();
        shape_to[axis] = indices.len() as i64;
        let attrs = format!(
            "dimension_numbers = #stablehlo.gather<offset_dims = [{}], collapsed_slice_dims = [{axis}], \
             start_index_map = [{axis}], index_vector_dim = 1>, slice_sizes = array<i64{}>",
            bare(&offset_dims),
            list(&sizes)
        );
        Ok(self.op("gather", &[x, &ids], &attrs, TensorType::new(&shape_to, x.element())))
    }

    /// Rows of a 2-D `table` picked by `ids` (i32, any shape): `[..ids, row]`.
    pub fn gather_rows(&mut self, table: &Value, ids: &Value) -> Result<Value> {
        if table.ty.rank() != 2 || ids.element() != ElementType::I32 {
            return Err(shape("gather", format!("rows of {} by {}", table.ty, ids.ty)));
        }
        let r = ids.ty.rank();
        let mut shape_to = ids.shape().to_vec();
        shape_to.push(table.shape()[1]);
        let attrs = format!(
            "dimension_numbers = #stablehlo.gather<offset_dims = [{r}], collapsed_slice_dims = [0], \
             start_index_map = [0], index_vector_dim = {r}>, slice_sizes = array<i64: 1, {}>",
            table.shape()[1]
        );
        Ok(self.op("gather", &[table, ids], &attrs, TensorType::new(&shape_to, table.element())))
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// `: a, b, c` for an `array<i64...>` attribute (empty for none).
fn list<T: std::fmt::Display>(xs: &[T]) -> String {
    if xs.is_empty() { String::new() } else { format!(": {}", bare(xs)) }
}

fn bare<T: std::fmt::Display>(xs: &[T]) -> String {
    xs.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

/// An identifier MLIR accepts bare (letters, digits, `_`, `$`, `.`; not
/// starting with a digit): anything else becomes `_`.
fn sanitize(name: &str) -> String {
    let mut s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "_$.".contains(c) { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// `name` as an MLIR string literal.
fn quoted(name: &str) -> String {
    let mut s = String::from("\"");
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                s.push('\\');
                s.push(c);
            }
            c if c.is_ascii_graphic() || c == ' ' => s.push(c),
            c => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(s, "\\{b:02X}");
                }
            }
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[i64]) -> TensorType {
        TensorType::new(shape, ElementType::F32)
    }

    #[test]
    fn mismatched_operands_are_refused_with_the_op_named() {
        let m = Module::new("m");
        let mut f = m.function("f", &[("a", f32s(&[2, 3])), ("b", f32s(&[3, 2]))]);
        let (a, b) = (f.arg(0), f.arg(1));
        assert!(f.add(&a, &b).unwrap_err().to_string().starts_with("add: "));
        assert!(f.dot_general(&a, &a, (&[], &[]), (&[1], &[1])).is_ok());
        assert!(f.dot_general(&a, &b, (&[], &[]), (&[1], &[1])).is_err());
        assert!(f.transpose(&a, &[0, 0]).is_err());
        assert!(f.reshape(&a, &[5]).is_err());
        assert!(f.slice(&a, &[0, 0], &[3, 3]).is_err());
        assert!(f.broadcast_in_dim(&a, &[4, 2, 3], &[1, 2]).is_ok());
        assert!(f.broadcast_in_dim(&a, &[4, 2, 3], &[0, 1]).is_err());
    }

    #[test]
    fn a_parameter_used_twice_is_one_global_and_conflicting_types_are_refused() {
        let mut m = Module::new("m");
        let mut f = m.function("f", &[]);
        let w = f.parameter("layer.weight", f32s(&[4])).unwrap();
        f.parameter("layer.weight", f32s(&[4])).unwrap();
        assert!(f.parameter("layer.weight", f32s(&[5])).is_err());
        f.finish(&mut m, &[&w]).unwrap();
        let mut g = m.function("g", &[]);
        let w = g.parameter("layer.weight", f32s(&[3])).unwrap();
        assert!(matches!(g.finish(&mut m, &[&w]), Err(Error::ParameterType { .. })));
        assert_eq!(m.parameters().len(), 1);
        assert_eq!(m.to_mlir().matches("util.global private").count(), 1);
    }

    #[test]
    fn results_written_into_arguments_are_marked_and_checked() {
        let mut m = Module::new("m");
        let mut f = m.function("step", &[("x", f32s(&[4])), ("cache", f32s(&[4]))]);
        let (x, cache) = (f.arg(0), f.arg(1));
        let sum = f.add(&x, &cache).unwrap();
        f.write_result_into(1, 1).unwrap();
        assert!(f.write_result_into(1, 0).is_err(), "an argument takes one result");
        assert!(f.write_result_into(0, 1).is_err(), "a result goes into one argument");
        assert!(f.write_result_into(2, 0).is_err(), "no third argument");
        f.finish(&mut m, &[&x, &sum]).unwrap();
        assert!(m.to_mlir().contains("%cache: tensor<4xf32> {iree.abi.output = 1 : index}"), "{}", m.to_mlir());

        let mut g = m.function("bad", &[("x", f32s(&[4])), ("cache", f32s(&[8]))]);
        let x = g.arg(0);
        g.write_result_into(1, 0).unwrap();
        let e = g.finish(&mut m, &[&x]).unwrap_err().to_string();
        assert!(e.contains("result 0 written into argument 1 tensor<8xf32>: tensor<4xf32>"), "{e}");
    }

    #[test]
    fn argument_and_function_names_stay_unique() {
        let mut m = Module::new("m");
        let f = m.function("f", &[("x", f32s(&[1])), ("x", f32s(&[1])), ("-acc", f32s(&[1]))]);
        let names: Vec<String> = f.args().iter().map(|a| a.to_string()).collect();
        assert_eq!(names, ["%x", "%x_1", "%_acc"]);
        let x = f.arg(0);
        f.finish(&mut m, &[&x]).unwrap();
        let g = m.function("f", &[("x", f32s(&[1]))]);
        let x = g.arg(0);
        assert!(g.finish(&mut m, &[&x]).unwrap_err().to_string().contains("second function @f"));
    }

    #[test]
    fn odd_names_are_quoted_or_sanitised() {
        assert_eq!(quoted("model.layers.0.q\"x"), "\"model.layers.0.q\\\"x\"");
        assert_eq!(sanitize("0bad name"), "_0bad_name");
    }
}

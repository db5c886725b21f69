//! `route.value_format = "json_expanded"` and `"json_expanded_with_schema"`: the value Debezium's
//! Outbox Event Router wrote with `table.expand.json.payload = true` through Kafka Connect's
//! `JsonConverter` with `schemas.enable = false` and `true`.
//!
//! Debezium (`EventRouterDelegate`, `JsonSchemaData`, `table.json.payload.null.behavior =
//! ignore`, its default) parses a payload that starts with `{` or `[` with Jackson, infers a
//! Connect schema from it (`toConnectSchema(<payload column name>, node)`) and builds a struct
//! (`toConnectData`); the converter then writes the struct compactly. What that does to a
//! document, and what this module does alike:
//!
//! - Object members keep their order; a member whose value is `null` or `[]` has no schema and
//!   is left out. A key seen twice keeps its first place and last value (Jackson's `ObjectNode`).
//! - Numbers: an integer that fits 32 bits is an `int32`, 64 bits an `int64`, anything else a
//!   `float64` written as Java's `Double.toString` writes it (`1.5`, `100.0`, `1.0E-4`,
//!   `1.0E21`; the shortest digits that read back, as JDK 19+ prints them). Checked against
//!   JDK 17's `Double.toString` on 200,000 doubles (random bits, money-like and scaled values):
//!   every value in 10⁻³..10⁷ agrees; 2,641 outside it differ only where JDK 17 and older print
//!   one more digit than needed (`7.8475983056526093E17`), which JDK 19+ no longer does, so a
//!   Debezium on an older JVM wrote those few values longer. An integer beyond
//!   64 bits becomes a `BigDecimal` that the converter cannot write: the connector's task
//!   failed there, and Ferry reports a routing error.
//! - Arrays take the schema of their first non-null element; `null` elements stay `null`.
//!   Elements of different kinds (a string and a number, an `int32` and an `int64`, an integer
//!   and a fraction) or an array of nulls only make the schema inference throw, and Debezium
//!   then sent the payload unexpanded, with the column's own schema: as a JSON string, which is
//!   what Ferry writes too. An array of objects takes the union of its elements' schemas, in an
//!   order that depends on Java hash codes when the elements differ in shape: Ferry reproduces
//!   arrays of objects of one shape and reports a routing error for the others rather than
//!   guess.
//! - A member named `""` with a value that has a schema makes Connect's `SchemaBuilder.field`
//!   throw ("fieldName cannot be null."), at any depth: the payload went out unexpanded, a JSON
//!   string (found by the parity test against Debezium 3.6.1).
//! - A payload that does not start with `{` or `[` (a JSON scalar, text, leading whitespace) or
//!   does not parse is not expanded: a JSON string with the column's schema.
//! - A top-level array: `[]` has no schema at all (`toConnectSchema` returns null), so the
//!   string went out with a null schema (`{"schema":null,"payload":"[]"}` with schemas). Any
//!   other array whose schema could be inferred got an array schema, `toConnectData` then failed
//!   (`new Struct` of an array schema) and left the string behind, and the converter failed on a
//!   string under an array schema: no bytes, so a routing error. (An array whose inference threw
//!   is a JSON string, as above.)
//!
//! With schemas (`JsonConverter.asJsonSchema`): every inferred schema is optional; the top-level
//! struct is named after the payload column (`payload`), a nested struct after its path
//! (`payload.address`, `payload.address.geo`), an array's object elements after the array's own
//! path (`payload.lines`), and under an array of scalars or arrays the path starts again with no
//! name (`toConnectSchema(null, sample)`). An array schema has no name. Members come in the order
//! `type`, `items` or `fields`, `optional`, `name`, and `field` last in a field's schema;
//! `float64` is written `"double"`. No version, doc or parameters.
//!
//! Strings are escaped as Jackson escapes them (`jackson.rs`), as in [`crate::format`].

use std::borrow::Cow;
use std::io::Write as _;

use serde::{Deserialize, Serialize};

use crate::encode::jackson::jackson_string;

/// `route.expand_null_behavior`: Debezium's `table.json.payload.null.behavior`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ExpandNullBehavior {
    /// A `null` member has no schema and is left out (Debezium's default).
    #[default]
    Ignore,
    /// A `null` member is an optional `bytes` field written as `null`, and an array of nulls
    /// only an array of optional bytes.
    OptionalBytes,
}

spelling!(ExpandNullBehavior {
    Ignore => "ignore",
    OptionalBytes => "optional_bytes",
});

/// A parsed JSON value, with numbers classified as Jackson's tree model classifies them.
#[derive(Debug, Clone, PartialEq)]
enum Node<'a> {
    Null,
    Bool(bool),
    /// An integer in `i32` range (Jackson `IntNode`).
    Int(i64),
    /// An integer in `i64` range (`LongNode`).
    Long(i64),
    /// An integer beyond (`BigIntegerNode`).
    Big,
    /// A number with a fraction or exponent (`DoubleNode`).
    Double(f64),
    /// Borrowed from the payload where it has no escapes.
    Str(Cow<'a, str>),
    Arr(Vec<Node<'a>>),
    Obj(Vec<(Cow<'a, str>, Node<'a>)>),
}

/// A Connect schema as `JsonSchemaData::toConnectSchema` infers it.
#[derive(Debug, Clone, PartialEq)]
enum Schema<'a> {
    Str,
    Bool,
    Int32,
    Int64,
    Float64,
    /// `table.json.payload.null.behavior = optional_bytes`: a `null` member.
    Bytes,
    Array(Box<Schema<'a>>),
    /// Field names borrowed from the parsed document (`'a` is the document's borrow).
    Struct(Vec<(&'a str, Schema<'a>)>),
}

/// Why a document is not written expanded.
#[derive(Debug, Clone, PartialEq)]
enum NotExpanded {
    /// Debezium's expansion failed before it replaced the schema: the payload went out as a
    /// string with the column's own schema.
    AsString,
    /// The schema inference returned no schema (a top-level `[]`): the string went out with a
    /// null schema.
    NoSchema,
    /// Debezium failed later (or did something Ferry cannot reproduce): a routing error.
    Error(String),
}

/// Writes `payload` (a JSON document's text, valid UTF-8) as Debezium's expansion and
/// `JsonConverter` without schemas wrote it; `Err` where that cannot be reproduced (see the
/// module docs).
pub(crate) fn write_expanded(
    buf: &mut Vec<u8>,
    payload: &str,
    nulls: ExpandNullBehavior,
) -> Result<(), String> {
    match with_expansion(payload, nulls, |node, schema| {
        write_value(buf, node, schema)
    }) {
        Ok(written) => written,
        Err(NotExpanded::AsString | NotExpanded::NoSchema) => {
            jackson_string(buf, payload);
            Ok(())
        }
        Err(NotExpanded::Error(e)) => Err(e),
    }
}

/// Writes `payload` as Debezium's expansion and `JsonConverter` with schemas wrote it:
/// `{"schema":<inferred>,"payload":<struct>}`, the top-level struct named `name` (the payload
/// column's name). Where Debezium left the payload unexpanded, `unexpanded` writes it with the
/// column's own schema.
pub(crate) fn write_expanded_with_schema(
    buf: &mut Vec<u8>,
    payload: &str,
    name: &str,
    nulls: ExpandNullBehavior,
    unexpanded: impl FnOnce(&mut Vec<u8>) -> Result<(), String>,
) -> Result<(), String> {
    let written = with_expansion(payload, nulls, |node, schema| {
        let start = buf.len();
        buf.extend_from_slice(b"{\"schema\":");
        write_schema(buf, schema, Some(name), None);
        buf.extend_from_slice(b",\"payload\":");
        write(buf, node, schema).inspect_err(|_| buf.truncate(start))?;
        buf.push(b'}');
        Ok(())
    });
    match written {
        Ok(written) => written,
        Err(NotExpanded::AsString) => unexpanded(buf),
        Err(NotExpanded::NoSchema) => {
            buf.extend_from_slice(b"{\"schema\":null,\"payload\":");
            jackson_string(buf, payload);
            buf.push(b'}');
            Ok(())
        }
        Err(NotExpanded::Error(e)) => Err(e),
    }
}

/// [`write`], leaving `buf` as it was when it fails.
fn write_value(buf: &mut Vec<u8>, node: &Node<'_>, schema: &Schema<'_>) -> Result<(), String> {
    let start = buf.len();
    write(buf, node, schema).inspect_err(|_| buf.truncate(start))
}

/// Runs `f` on the parsed document and its inferred schema, or says why Debezium did not expand
/// it.
fn with_expansion<T>(
    payload: &str,
    nulls: ExpandNullBehavior,
    f: impl FnOnce(&Node<'_>, &Schema<'_>) -> T,
) -> Result<T, NotExpanded> {
    let node = parse(payload)?;
    let schema = inferred(&node, nulls)?;
    Ok(f(&node, &schema))
}

/// The document Debezium parsed (`parseJsonPayload`), or why it was not expanded.
fn parse(payload: &str) -> Result<Node<'_>, NotExpanded> {
    if !payload.starts_with('{') && !payload.starts_with('[') {
        return Err(NotExpanded::AsString);
    }
    Parser::new(payload)
        .document()
        .map_err(|_| NotExpanded::AsString)
}

/// The schema Debezium inferred for a parsed document, or why it was not expanded.
fn inferred<'n>(node: &'n Node<'_>, nulls: ExpandNullBehavior) -> Result<Schema<'n>, NotExpanded> {
    Ok(match node {
        Node::Arr(items) if items.is_empty() => return Err(NotExpanded::NoSchema),
        Node::Arr(items) => {
            element_schema(items, nulls)?;
            return Err(NotExpanded::Error(
                "table.expand.json.payload: the payload is a JSON array; Debezium inferred an \
                 array schema for it, failed to build a struct from it and left the text under \
                 that schema, on which Kafka Connect's JsonConverter failed, so there are no \
                 bytes to reproduce (wrap the array in an object, or use route.value_format = \
                 \"as_stored\" or \"json\")"
                    .to_owned(),
            ));
        }
        node => schema_of(node, nulls)?.ok_or(NotExpanded::AsString)?,
    })
}

/// `JsonConverter.asJsonSchema` of an inferred schema: `key` is the path `JsonSchemaData` named
/// it by (a struct's name), `field` the member it is the schema of.
fn write_schema(out: &mut Vec<u8>, schema: &Schema<'_>, key: Option<&str>, field: Option<&str>) {
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(match schema {
        Schema::Str => b"string".as_slice(),
        Schema::Bool => b"boolean",
        Schema::Int32 => b"int32",
        Schema::Int64 => b"int64",
        Schema::Float64 => b"double",
        Schema::Bytes => b"bytes",
        Schema::Array(_) => b"array",
        Schema::Struct(_) => b"struct",
    });
    out.push(b'"');
    let mut name = None;
    match schema {
        Schema::Array(element) => {
            out.extend_from_slice(b",\"items\":");
            // Objects are inferred under the array's own key; anything else under none.
            let key = if matches!(**element, Schema::Struct(_)) {
                key
            } else {
                None
            };
            write_schema(out, element, key, None);
        }
        Schema::Struct(fields) => {
            name = key;
            out.extend_from_slice(b",\"fields\":[");
            for (i, (f, s)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // The child's path names only a struct, or an array's objects: built for those.
                let named = match s {
                    Schema::Struct(_) => true,
                    Schema::Array(element) => matches!(**element, Schema::Struct(_)),
                    _ => false,
                };
                // `(Strings.isNullOrBlank(key) ? "" : key + ".") + fieldName`
                let child = match key {
                    Some(k) if named && !k.trim_matches(|c: char| c <= ' ').is_empty() => {
                        Some(format!("{k}.{f}"))
                    }
                    _ => None,
                };
                write_schema(out, s, Some(child.as_deref().unwrap_or(f)), Some(f));
            }
            out.push(b']');
        }
        _ => {}
    }
    out.extend_from_slice(b",\"optional\":true");
    if let Some(name) = name {
        out.extend_from_slice(b",\"name\":");
        jackson_string(out, name);
    }
    if let Some(field) = field {
        out.extend_from_slice(b",\"field\":");
        jackson_string(out, field);
    }
    out.push(b'}');
}

fn schema_of<'n>(
    node: &'n Node<'_>,
    nulls: ExpandNullBehavior,
) -> Result<Option<Schema<'n>>, NotExpanded> {
    Ok(Some(match node {
        Node::Str(_) => Schema::Str,
        Node::Bool(_) => Schema::Bool,
        Node::Int(_) => Schema::Int32,
        Node::Long(_) => Schema::Int64,
        Node::Big | Node::Double(_) => Schema::Float64,
        Node::Null if nulls == ExpandNullBehavior::OptionalBytes => Schema::Bytes,
        Node::Null => return Ok(None),
        Node::Arr(items) if items.is_empty() => return Ok(None),
        Node::Arr(items) => Schema::Array(Box::new(element_schema(items, nulls)?)),
        Node::Obj(members) => {
            let mut fields: Vec<(&'n str, Schema<'n>)> = Vec::with_capacity(members.len());
            for (k, v) in members {
                if let Some(s) = schema_of(v, nulls)? {
                    if k.is_empty() {
                        // Connect's `SchemaBuilder.field` refuses an empty name ("fieldName
                        // cannot be null."): Debezium then sent the payload unexpanded.
                        return Err(NotExpanded::AsString);
                    }
                    if !fields.iter().any(|(f, _)| f == k) {
                        fields.push((k.as_ref(), s));
                    }
                }
            }
            Schema::Struct(fields)
        }
    }))
}

fn kind(node: &Node<'_>) -> u8 {
    match node {
        Node::Null => 0,
        Node::Bool(_) => 1,
        Node::Int(_) | Node::Long(_) | Node::Big | Node::Double(_) => 2,
        Node::Str(_) => 3,
        Node::Arr(_) => 4,
        Node::Obj(_) => 5,
    }
}

/// `toConnectSchemaWithCycles` with `getFirstArrayElement`.
fn element_schema<'n>(
    items: &'n [Node<'_>],
    nulls: ExpandNullBehavior,
) -> Result<Schema<'n>, NotExpanded> {
    let mut sample: Option<&Node<'_>> = None;
    for item in items.iter().filter(|i| **i != Node::Null) {
        let first = *sample.get_or_insert(item);
        if kind(item) != kind(first) {
            return Err(NotExpanded::AsString);
        }
        if kind(first) == 2 && schema_of(item, nulls)? != schema_of(first, nulls)? {
            return Err(NotExpanded::AsString);
        }
    }
    let Some(sample) = sample else {
        // Nulls only: the sample is the NullNode, whose schema is optional bytes or none.
        return match nulls {
            ExpandNullBehavior::OptionalBytes => Ok(Schema::Bytes),
            ExpandNullBehavior::Ignore => Err(NotExpanded::AsString),
        };
    };
    if let Node::Obj(_) = sample {
        let mut shapes: Vec<Schema<'n>> = Vec::new();
        for item in items.iter().filter(|i| matches!(i, Node::Obj(_))) {
            if let Some(s) = schema_of(item, nulls)? {
                if !shapes.contains(&s) {
                    shapes.push(s);
                }
            }
        }
        return match shapes.len() {
            1 => Ok(shapes.remove(0)),
            _ => Err(NotExpanded::Error(
                "table.expand.json.payload: an array holds objects of different shapes, whose \
                 merged schema Debezium ordered by Java hash codes; Ferry cannot reproduce that \
                 order (use route.value_format = \"as_stored\" or \"json\")"
                    .to_owned(),
            )),
        };
    }
    schema_of(sample, nulls)?.ok_or(NotExpanded::AsString)
}

fn mismatch(what: &str) -> String {
    format!(
        "table.expand.json.payload: {what}; Kafka Connect's JsonConverter failed on such a \
         document, so there are no bytes to reproduce (use route.value_format = \"as_stored\" or \
         \"json\")"
    )
}

fn write(out: &mut Vec<u8>, node: &Node<'_>, schema: &Schema<'_>) -> Result<(), String> {
    match (node, schema) {
        (Node::Null, _) => out.extend_from_slice(b"null"),
        (Node::Str(s), Schema::Str) => jackson_string(out, s),
        (Node::Bool(b), Schema::Bool) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        (Node::Int(n), Schema::Int32) | (Node::Long(n), Schema::Int64) => {
            let _ = write!(out, "{n}");
        }
        (Node::Double(d), Schema::Float64) => java_double(out, *d)?,
        (Node::Big, _) => {
            return Err(mismatch(
                "an integer beyond 64 bits became a BigDecimal in a float64 field",
            ))
        }
        (Node::Arr(items), Schema::Array(element)) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(out, item, element)?;
            }
            out.push(b']');
        }
        (Node::Obj(members), Schema::Struct(fields)) => {
            out.push(b'{');
            // Fields come in member order (a repeated key was merged by the parser: Jackson's
            // first place, last value), so the search goes on from the last one found.
            let mut at = 0;
            for (i, (name, field)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                jackson_string(out, name);
                out.push(b':');
                let is = |(k, _): &(Cow<'_, str>, Node<'_>)| k.as_ref() == *name;
                let found = members[at..]
                    .iter()
                    .position(is)
                    .map(|p| at + p)
                    .or_else(|| members.iter().position(is));
                match found {
                    Some(p) => {
                        at = p + 1;
                        write(out, &members[p].1, field)?;
                    }
                    None => out.extend_from_slice(b"null"),
                }
            }
            out.push(b'}');
        }
        _ => {
            return Err(mismatch(
                "an array's elements differ from its first one's schema",
            ))
        }
    }
    Ok(())
}

/// `Double.toString` (JDK 19+: the shortest digits that read back): plain notation with at
/// least one fraction digit for 10⁻³ ≤ |d| < 10⁷, else `d.dddE±n`.
fn java_double(out: &mut Vec<u8>, d: f64) -> Result<(), String> {
    if !d.is_finite() {
        return Err(mismatch("a number overflows a double"));
    }
    if d == 0.0 {
        out.extend_from_slice(if d.is_sign_negative() {
            b"-0.0"
        } else {
            b"0.0"
        });
        return Ok(());
    }
    if d < 0.0 {
        out.push(b'-');
    }
    let a = d.abs();
    // Rust's `{:e}` gives the shortest round-tripping digits: "3.998e1", "1e-7". Java never
    // picks fewer than two: where one would do, it takes the two-digit decimal closest to the
    // value (`4.9E-324` for the smallest subnormal, whose shortest is 5e-324), with a trailing
    // zero dropped again (`1.0E21` is digits "1").
    let mut sci = format!("{a:e}");
    if !sci.contains('.') {
        sci = format!("{a:.1e}");
    }
    let (mantissa, exp) = sci.split_once('e').expect("LowerExp writes an exponent");
    let exp: i32 = exp.parse().expect("LowerExp writes an integer exponent");
    let mut digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    while digits.len() > 1 && digits.ends_with('0') {
        digits.pop();
    }
    if (1e-3..1e7).contains(&a) {
        let point = exp + 1;
        if point <= 0 {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', (-point) as usize));
            out.extend_from_slice(digits.as_bytes());
        } else if point as usize >= digits.len() {
            out.extend_from_slice(digits.as_bytes());
            out.extend(std::iter::repeat_n(b'0', point as usize - digits.len()));
            out.extend_from_slice(b".0");
        } else {
            let (int, frac) = digits.split_at(point as usize);
            out.extend_from_slice(int.as_bytes());
            out.push(b'.');
            out.extend_from_slice(frac.as_bytes());
        }
    } else {
        out.extend_from_slice(&digits.as_bytes()[..1]);
        out.push(b'.');
        out.extend_from_slice(if digits.len() > 1 {
            &digits.as_bytes()[1..]
        } else {
            b"0"
        });
        out.push(b'E');
        let _ = write!(out, "{exp}");
    }
    Ok(())
}

/// A strict JSON (RFC 8259) reader into [`Node`]s.
struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
}

/// Nesting deeper than this is refused (Jackson's default `maxNestingDepth` is 1000).
const MAX_DEPTH: usize = 1000;

impl<'a> Parser<'a> {
    fn new(s: &'a str) -> Self {
        Parser {
            s: s.as_bytes(),
            i: 0,
            depth: 0,
        }
    }

    fn document(mut self) -> Result<Node<'a>, ()> {
        let v = self.value()?;
        self.ws();
        if self.i == self.s.len() {
            Ok(v)
        } else {
            Err(())
        }
    }

    fn ws(&mut self) {
        while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &[u8]) -> Result<(), ()> {
        if self.s[self.i..].starts_with(lit) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(())
        }
    }

    fn value(&mut self) -> Result<Node<'a>, ()> {
        self.ws();
        match self.s.get(self.i).ok_or(())? {
            b'{' => {
                self.enter()?;
                self.i += 1;
                let mut members: Vec<(Cow<'a, str>, Node<'a>)> = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                } else {
                    loop {
                        self.ws();
                        let k = self.string()?;
                        self.ws();
                        self.eat(b":")?;
                        let v = self.value()?;
                        match members.iter_mut().find(|(m, _)| *m == k) {
                            Some(m) => m.1 = v,
                            None => members.push((k, v)),
                        }
                        self.ws();
                        match self.s.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b'}') => {
                                self.i += 1;
                                break;
                            }
                            _ => return Err(()),
                        }
                    }
                }
                self.depth -= 1;
                Ok(Node::Obj(members))
            }
            b'[' => {
                self.enter()?;
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                } else {
                    loop {
                        items.push(self.value()?);
                        self.ws();
                        match self.s.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b']') => {
                                self.i += 1;
                                break;
                            }
                            _ => return Err(()),
                        }
                    }
                }
                self.depth -= 1;
                Ok(Node::Arr(items))
            }
            b'"' => Ok(Node::Str(self.string()?)),
            b't' => self.eat(b"true").map(|_| Node::Bool(true)),
            b'f' => self.eat(b"false").map(|_| Node::Bool(false)),
            b'n' => self.eat(b"null").map(|_| Node::Null),
            _ => self.number(),
        }
    }

    fn enter(&mut self) -> Result<(), ()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            Err(())
        } else {
            Ok(())
        }
    }

    fn number(&mut self) -> Result<Node<'a>, ()> {
        let start = self.i;
        if self.s.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        let digits = |p: &mut Self| {
            let from = p.i;
            while p.s.get(p.i).is_some_and(u8::is_ascii_digit) {
                p.i += 1;
            }
            p.i - from
        };
        let int_start = self.i;
        let n = digits(self);
        if n == 0 || (n > 1 && self.s[int_start] == b'0') {
            return Err(());
        }
        let mut integral = true;
        if self.s.get(self.i) == Some(&b'.') {
            self.i += 1;
            integral = false;
            if digits(self) == 0 {
                return Err(());
            }
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            integral = false;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if digits(self) == 0 {
                return Err(());
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).map_err(|_| ())?;
        if !integral {
            return text.parse().map(Node::Double).map_err(|_| ());
        }
        Ok(match text.parse::<i64>() {
            Ok(v) if i32::try_from(v).is_ok() => Node::Int(v),
            Ok(v) => Node::Long(v),
            Err(_) => Node::Big,
        })
    }

    fn hex4(&mut self) -> Result<u32, ()> {
        let h = self.s.get(self.i..self.i + 4).ok_or(())?;
        let h = std::str::from_utf8(h).map_err(|_| ())?;
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(());
        }
        self.i += 4;
        u32::from_str_radix(h, 16).map_err(|_| ())
    }

    /// A string, borrowed from the input when it has no escapes.
    fn string(&mut self) -> Result<Cow<'a, str>, ()> {
        self.eat(b"\"")?;
        let start = self.i;
        while let Some(&b) = self.s.get(self.i) {
            match b {
                b'"' => {
                    // The input is a &str and the run stops at ASCII: a char boundary.
                    let run = std::str::from_utf8(&self.s[start..self.i]).map_err(|_| ())?;
                    self.i += 1;
                    return Ok(Cow::Borrowed(run));
                }
                b'\\' | 0..=0x1f => break,
                _ => self.i += 1,
            }
        }
        let mut out = self.s[start..self.i].to_vec();
        loop {
            let b = *self.s.get(self.i).ok_or(())?;
            self.i += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let e = *self.s.get(self.i).ok_or(())?;
                    self.i += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let cp = if (0xd800..0xdc00).contains(&hi) {
                                self.eat(b"\\u")?;
                                let lo = self.hex4()?;
                                if !(0xdc00..0xe000).contains(&lo) {
                                    return Err(());
                                }
                                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                            } else {
                                hi
                            };
                            // A lone surrogate: Jackson would keep it; text cannot. Not expanded.
                            char::from_u32(cp).ok_or(())?
                        }
                        _ => return Err(()),
                    };
                    let mut tmp = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut tmp).as_bytes());
                }
                0..=0x1f => return Err(()),
                _ => out.push(b),
            }
        }
        String::from_utf8(out).map(Cow::Owned).map_err(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(payload: &str) -> Result<String, String> {
        let mut buf = Vec::new();
        write_expanded(&mut buf, payload, ExpandNullBehavior::Ignore)
            .map(|()| String::from_utf8(buf).unwrap())
    }

    /// Java's `Double.toString` for values around each boundary of its two notations.
    #[test]
    fn java_double_notation() {
        let cases: &[(f64, &str)] = &[
            (1.5, "1.5"),
            (39.98, "39.98"),
            (100.0, "100.0"),
            (0.001, "0.001"),
            (0.0001, "1.0E-4"),
            (0.00015, "1.5E-4"),
            (1234567.0, "1234567.0"),
            (9999999.0, "9999999.0"),
            (10000000.0, "1.0E7"),
            (12345678.9, "1.23456789E7"),
            (1e21, "1.0E21"),
            (-2.5, "-2.5"),
            (0.1 + 0.2, "0.30000000000000004"),
            (f64::MAX, "1.7976931348623157E308"),
            (f64::MIN_POSITIVE, "2.2250738585072014E-308"),
            (5e-324, "4.9E-324"),
            (0.0, "0.0"),
        ];
        for (d, want) in cases {
            let mut out = Vec::new();
            java_double(&mut out, *d).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), *want, "{d:?}");
        }
    }

    #[test]
    fn objects_numbers_strings_nulls_and_arrays() {
        // PostgreSQL's jsonb text: spaces, its own key order; nulls and [] are left out.
        assert_eq!(
            exp(r#"{"n": 1, "id": 7, "big": 3000000000, "total": 39.98, "q": 1.50, "note": "x\ny", "gone": null, "none": [], "ok": true}"#).unwrap(),
            r#"{"n":1,"id":7,"big":3000000000,"total":39.98,"q":1.5,"note":"x\ny","ok":true}"#
        );
        assert_eq!(
            exp(r#"{"a": {"b": {"c": [1, null, 3]}, "e": {}}, "s": ["x", null]}"#).unwrap(),
            r#"{"a":{"b":{"c":[1,null,3]},"e":{}},"s":["x",null]}"#
        );
        // An array of objects of one shape.
        assert_eq!(
            exp(r#"{"lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}]}"#).unwrap(),
            r#"{"lines":[{"sku":"a","qty":1},{"sku":"b","qty":2}]}"#
        );
        // Escapes decoded, then written the way Jackson escapes.
        assert_eq!(
            exp(r#"{"t": "\u00e9\/\u0001\ud83d\ude00"}"#).unwrap(),
            "{\"t\":\"é/\\u0001\\uD83D\\uDE00\"}"
        );
    }

    fn exp_schema(payload: &str, name: &str) -> Result<String, String> {
        exp_schema_nulls(payload, name, ExpandNullBehavior::Ignore)
    }

    fn exp_schema_nulls(
        payload: &str,
        name: &str,
        nulls: ExpandNullBehavior,
    ) -> Result<String, String> {
        let mut buf = Vec::new();
        write_expanded_with_schema(&mut buf, payload, name, nulls, |b: &mut Vec<u8>| {
            b.extend_from_slice(b"<column schema>");
            Ok(())
        })
        .map(|()| String::from_utf8(buf).unwrap())
    }

    /// `JsonSchemaData.toConnectSchema(<payload column>, node)` written by
    /// `JsonConverter.asJsonSchema`: structs named by their path from the payload column, array
    /// elements that are objects by the array's path, the path restarted (no name) under an
    /// array of arrays; every schema optional; `float64` as `"double"`.
    #[test]
    fn the_inferred_schema_names_structs_by_their_path() {
        let payload = r#"{"id": 7, "big": 3000000000, "total": 39.98, "ok": true, "note": "x", "gone": null, "none": [], "address": {"city": "Oslo", "geo": {"lat": 59.9}}, "tags": ["a", null], "lines": [{"sku": "a", "qty": 1}], "grid": [[{"x": {"y": 1}}]]}"#;
        let schema = concat!(
            r#"{"type":"struct","fields":["#,
            r#"{"type":"int32","optional":true,"field":"id"},"#,
            r#"{"type":"int64","optional":true,"field":"big"},"#,
            r#"{"type":"double","optional":true,"field":"total"},"#,
            r#"{"type":"boolean","optional":true,"field":"ok"},"#,
            r#"{"type":"string","optional":true,"field":"note"},"#,
            r#"{"type":"struct","fields":[{"type":"string","optional":true,"field":"city"},"#,
            r#"{"type":"struct","fields":[{"type":"double","optional":true,"field":"lat"}],"#,
            r#""optional":true,"name":"payload.address.geo","field":"geo"}],"#,
            r#""optional":true,"name":"payload.address","field":"address"},"#,
            r#"{"type":"array","items":{"type":"string","optional":true},"optional":true,"field":"tags"},"#,
            r#"{"type":"array","items":{"type":"struct","fields":["#,
            r#"{"type":"string","optional":true,"field":"sku"},{"type":"int32","optional":true,"field":"qty"}],"#,
            r#""optional":true,"name":"payload.lines"},"optional":true,"field":"lines"},"#,
            r#"{"type":"array","items":{"type":"array","items":{"type":"struct","fields":["#,
            r#"{"type":"struct","fields":[{"type":"int32","optional":true,"field":"y"}],"optional":true,"name":"x","field":"x"}],"#,
            r#""optional":true},"optional":true},"optional":true,"field":"grid"}"#,
            r#"],"optional":true,"name":"payload"}"#,
        );
        let value = r#"{"id":7,"big":3000000000,"total":39.98,"ok":true,"note":"x","address":{"city":"Oslo","geo":{"lat":59.9}},"tags":["a",null],"lines":[{"sku":"a","qty":1}],"grid":[[{"x":{"y":1}}]]}"#;
        assert_eq!(
            exp_schema(payload, "payload").unwrap(),
            format!(r#"{{"schema":{schema},"payload":{value}}}"#)
        );
        // Without schemas, the same value alone.
        assert_eq!(exp(payload).unwrap(), value);
        // Another payload column names the root; an empty object is an empty struct.
        assert_eq!(
            exp_schema(r#"{"a": {}}"#, "body").unwrap(),
            concat!(
                r#"{"schema":{"type":"struct","fields":[{"type":"struct","fields":[],"#,
                r#""optional":true,"name":"body.a","field":"a"}],"optional":true,"name":"body"},"#,
                r#""payload":{"a":{}}}"#
            )
        );
        // Names are written with Jackson's escaping.
        assert_eq!(
            exp_schema("{\"q\\\"\": {\"z\": 1}}", "payload").unwrap(),
            concat!(
                r#"{"schema":{"type":"struct","fields":[{"type":"struct","fields":["#,
                r#"{"type":"int32","optional":true,"field":"z"}],"optional":true,"#,
                r#""name":"payload.q\"","field":"q\""}],"optional":true,"name":"payload"},"#,
                r#""payload":{"q\"":{"z":1}}}"#
            )
        );
    }

    /// `table.json.payload.null.behavior = optional_bytes`: a null member is an optional bytes
    /// field written as `null`, an array of nulls an array of optional bytes; `[]` still has
    /// no schema and is left out.
    #[test]
    fn null_members_as_optional_bytes() {
        let bytes = ExpandNullBehavior::OptionalBytes;
        assert_eq!(
            exp_schema_nulls(
                r#"{"a": null, "b": [null, null], "c": [], "d": 1}"#,
                "payload",
                bytes
            )
            .unwrap(),
            concat!(
                r#"{"schema":{"type":"struct","fields":[{"type":"bytes","optional":true,"field":"a"},"#,
                r#"{"type":"array","items":{"type":"bytes","optional":true},"optional":true,"field":"b"},"#,
                r#"{"type":"int32","optional":true,"field":"d"}],"optional":true,"name":"payload"},"#,
                r#""payload":{"a":null,"b":[null,null],"d":1}}"#
            )
        );
        let mut buf = Vec::new();
        write_expanded(&mut buf, r#"{"a": null, "b": [null]}"#, bytes).unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), r#"{"a":null,"b":[null]}"#);
        // A top-level array of nulls now has a schema, so the converter failed on it.
        assert!(exp_schema_nulls("[null]", "payload", bytes).is_err());
    }

    /// A top-level array: `[]` got no schema (the string went out under a null schema); an
    /// array whose schema was inferred made the converter fail; one whose inference threw was
    /// not expanded.
    #[test]
    fn top_level_arrays() {
        assert_eq!(exp("[]").unwrap(), r#""[]""#);
        assert_eq!(
            exp_schema("[]", "payload").unwrap(),
            r#"{"schema":null,"payload":"[]"}"#
        );
        for payload in ["[1, 2]", r#"[{"a": 1}]"#, "[[1]]", r#"[null, "a"]"#] {
            let e = exp(payload).unwrap_err();
            assert!(e.contains("JSON array"), "{payload}: {e}");
            let e = exp_schema(payload, "payload").unwrap_err();
            assert!(e.contains("JSON array"), "{payload}: {e}");
        }
        for payload in [r#"[1, "a"]"#, "[null]", "[1, 1.5]", "[[]]"] {
            let mut want = Vec::new();
            jackson_string(&mut want, payload);
            assert_eq!(exp(payload).unwrap(), String::from_utf8(want).unwrap());
            assert_eq!(exp_schema(payload, "payload").unwrap(), "<column schema>");
        }
    }

    /// What Debezium did not expand goes out with the column's own schema.
    #[test]
    fn what_debezium_did_not_expand_keeps_the_column_schema() {
        for payload in [
            r#""text""#,
            "42",
            " {\"a\": 1}",
            r#"{"mixed": [1, "a"]}"#,
            r#"{"broken": "#,
            // An empty member name, at the top or deeper (Connect refuses the field).
            r#"{"": 0, "a": "b"}"#,
            r#"{"a": {"b": [{"": true}]}}"#,
        ] {
            assert_eq!(
                exp_schema(payload, "payload").unwrap(),
                "<column schema>",
                "{payload}"
            );
        }
        let e = exp_schema(r#"{"a": 1, "huge": 123456789012345678901234567890}"#, "p");
        assert!(e.unwrap_err().contains("table.expand.json.payload"));
    }

    /// Where Debezium's expansion failed, it sent the payload as a JSON string.
    #[test]
    fn what_debezium_did_not_expand_is_a_json_string() {
        // An empty name whose value has no schema (null, ignored) is left out like any other.
        assert_eq!(exp(r#"{"": null, "a": 1}"#).unwrap(), r#"{"a":1}"#);
        for payload in [
            r#"[1, "a"]"#,
            r#""text""#,
            "42",
            "not json",
            r#"{"mixed": [1, "a"]}"#,
            r#"{"ints": [1, 3000000000]}"#,
            r#"{"nums": [1, 1.5]}"#,
            r#"{"nulls": [null, null]}"#,
            r#"{"deep": [[]]}"#,
            r#"{"broken": "#,
        ] {
            let mut want = Vec::new();
            jackson_string(&mut want, payload);
            assert_eq!(
                exp(payload).unwrap(),
                String::from_utf8(want).unwrap(),
                "{payload}"
            );
        }
    }

    /// Where Debezium's converter failed, or its output depends on Java hash codes: an error.
    #[test]
    fn what_cannot_be_reproduced_is_an_error() {
        for payload in [
            r#"{"huge": 123456789012345678901234567890}"#,
            r#"{"a": [{"x": 1}, {"y": 2}]}"#,
            r#"{"a": [[1], [1.5]]}"#,
            r#"{"over": 1e400}"#,
        ] {
            let e = exp(payload).unwrap_err();
            assert!(e.contains("table.expand.json.payload"), "{payload}: {e}");
        }
    }

    #[test]
    fn duplicate_keys_keep_the_first_place_and_the_last_value() {
        assert_eq!(
            exp(r#"{"a": 1, "b": 2, "a": 3}"#).unwrap(),
            r#"{"a":3,"b":2}"#
        );
    }

    #[test]
    fn hostile_input_never_panics() {
        let deep = "{\"a\":".repeat(2000);
        assert!(exp(&deep).is_ok());
        for s in [
            "{",
            "{\"a\"",
            "{\"a\":-}",
            "{\"a\":01}",
            "{\"a\":\"\\ud800\"}",
            "{\"a\":1.}",
        ] {
            assert!(exp(s).is_ok(), "{s}");
        }
    }
}

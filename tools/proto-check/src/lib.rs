//! One source of truth for Tally's wire format (ADR 0002): the Rust protobuf
//! types are derived by hand in `settlement/src/proto.rs`, and this crate
//! checks them against the published schema, `proto/tally/v1/*.proto`.
//!
//! How: [`generate`] compiles the `.proto` files with `protox` (a pure-Rust
//! protobuf compiler, so no system `protoc`) and has `prost-build` generate
//! the Rust types it would generate for them. [`describe`] reads Rust source
//! (the generated file or the hand-derived one) with `syn` into a
//! [`Schema`]: for each `prost::Message` struct its fields' prost attributes
//! (type, tag, repeated/optional, enumeration, oneof tags) and the message a
//! message field holds; for each `prost::Oneof` enum its variants' attributes;
//! for each `prost::Enumeration` enum its variants' values. [`compare`] lists
//! every difference as a [`Mismatch`]; a message, oneof or enum that only one
//! side has is one too.
//!
//! Items are named by their Rust path inside the file (`Tx`, `tx::Sum`,
//! `Outcome`), which is how prost-build names the `.proto`'s messages.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use syn::punctuated::Punctuated;
use syn::{Attribute, Expr, Fields, Item, Lit, Meta, Token, Type};

/// Errors reading or generating the two sides.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// protox refused the `.proto` files.
    #[error("compiling the .proto files: {0}")]
    Protox(String),
    /// prost-build failed.
    #[error("generating Rust from the .proto files: {0}")]
    ProstBuild(String),
    /// Rust source did not parse.
    #[error("parsing {name}: {msg}")]
    Parse {
        /// Which source.
        name: String,
        /// What syn said.
        msg: String,
    },
    /// A prost attribute or enum value has a shape this check does not read.
    #[error("{name}: {item}: {msg}")]
    Unreadable {
        /// Which source.
        name: String,
        /// The item.
        item: String,
        /// What was wrong.
        msg: String,
    },
}

/// What the wire format says about one field or oneof variant, in a
/// canonical text: its prost attribute's entries (type, then labels, then
/// tag or `tags`, normalised), then, for a message, `-> MessageName`. For
/// example `message, optional, tag = "5" -> HubResult`.
pub type FieldSpec = String;

/// The protobuf view of one Rust file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Schema {
    /// `prost::Message` structs: field name -> spec.
    pub messages: BTreeMap<String, BTreeMap<String, FieldSpec>>,
    /// `prost::Oneof` enums: variant name -> spec.
    pub oneofs: BTreeMap<String, BTreeMap<String, FieldSpec>>,
    /// `prost::Enumeration` enums: variant name -> value.
    pub enums: BTreeMap<String, BTreeMap<String, i64>>,
}

/// One difference between the expected (`.proto`) and the found (Rust)
/// schema. `None` on a side means it does not have the item or member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// `message ReportUsage`, `oneof tx::Sum` or `enum Outcome`.
    pub item: String,
    /// The field, variant or enum value; `None` for the item itself.
    pub member: Option<String>,
    /// What the `.proto` says.
    pub expected: Option<String>,
    /// What the Rust source has.
    pub found: Option<String>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |s: &Option<String>| match s {
            Some(v) => format!("`{v}`"),
            None => "(missing)".into(),
        };
        match &self.member {
            Some(m) => write!(f, "{} / {m}: ", self.item)?,
            None => write!(f, "{}: ", self.item)?,
        }
        write!(
            f,
            "expected {}, found {}",
            side(&self.expected),
            side(&self.found)
        )
    }
}

/// Every `.proto` file directly in `dir`, sorted.
pub fn proto_files(dir: &Path) -> Result<Vec<PathBuf>, CheckError> {
    let io = |source| CheckError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let p = entry.map_err(io)?.path();
        if p.extension().is_some_and(|e| e == "proto") {
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

/// Compiles `files` (paths under `include`) with protox and returns the Rust
/// source prost-build generates for protobuf package `package`.
pub fn generate(files: &[PathBuf], include: &Path, package: &str) -> Result<String, CheckError> {
    let fds = protox::compile(files, [include]).map_err(|e| CheckError::Protox(e.to_string()))?;
    let out = tempfile::tempdir().map_err(|source| CheckError::Io {
        path: std::env::temp_dir(),
        source,
    })?;
    prost_build::Config::new()
        .out_dir(out.path())
        .compile_fds(fds)
        .map_err(|e| CheckError::ProstBuild(e.to_string()))?;
    let path = out.path().join(format!("{package}.rs"));
    std::fs::read_to_string(&path).map_err(|source| CheckError::Io { path, source })
}

/// Reads the protobuf types of Rust `source` (named `name` in errors).
pub fn describe(name: &str, source: &str) -> Result<Schema, CheckError> {
    let file = syn::parse_file(source).map_err(|e| CheckError::Parse {
        name: name.into(),
        msg: e.to_string(),
    })?;
    let mut schema = Schema::default();
    walk(name, &file.items, "", &mut schema)?;
    Ok(schema)
}

fn walk(name: &str, items: &[Item], prefix: &str, schema: &mut Schema) -> Result<(), CheckError> {
    for item in items {
        match item {
            Item::Mod(m) if !is_cfg_test(&m.attrs) => {
                if let Some((_, inner)) = &m.content {
                    walk(name, inner, &format!("{prefix}{}::", m.ident), schema)?;
                }
            }
            Item::Struct(s) if derives(&s.attrs, "Message") => {
                let item = format!("{prefix}{}", s.ident);
                let mut fields = BTreeMap::new();
                if let Fields::Named(named) = &s.fields {
                    for f in &named.named {
                        let fname = f
                            .ident
                            .as_ref()
                            .map(ToString::to_string)
                            .unwrap_or_default();
                        let spec = field_spec(&f.attrs, &f.ty)
                            .map_err(|msg| unreadable(name, &item, &fname, msg))?;
                        fields.insert(fname, spec);
                    }
                }
                schema.messages.insert(item, fields);
            }
            Item::Enum(e) if derives(&e.attrs, "Oneof") => {
                let item = format!("{prefix}{}", e.ident);
                let mut variants = BTreeMap::new();
                for v in &e.variants {
                    let vname = v.ident.to_string();
                    let ty = match &v.fields {
                        Fields::Unnamed(u) => u.unnamed.first().map(|f| &f.ty),
                        _ => None,
                    };
                    let spec = match ty {
                        Some(ty) => field_spec(&v.attrs, ty),
                        None => Err("a oneof variant holds one value".into()),
                    }
                    .map_err(|msg| unreadable(name, &item, &vname, msg))?;
                    variants.insert(vname, spec);
                }
                schema.oneofs.insert(item, variants);
            }
            Item::Enum(e) if derives(&e.attrs, "Enumeration") => {
                let item = format!("{prefix}{}", e.ident);
                let mut values = BTreeMap::new();
                for v in &e.variants {
                    let vname = v.ident.to_string();
                    let value = v
                        .discriminant
                        .as_ref()
                        .and_then(|(_, e)| int_value(e))
                        .ok_or_else(|| {
                            unreadable(name, &item, &vname, "no integer discriminant".into())
                        })?;
                    values.insert(vname, value);
                }
                schema.enums.insert(item, values);
            }
            _ => {}
        }
    }
    Ok(())
}

fn unreadable(name: &str, item: &str, member: &str, msg: String) -> CheckError {
    CheckError::Unreadable {
        name: name.into(),
        item: format!("{item} / {member}"),
        msg,
    }
}

fn is_cfg_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Ident>()
                .map(|i| i == "test")
                .unwrap_or(false)
    })
}

/// Whether `attrs` derive a macro whose last path segment is `what`
/// (`prost::Message`, `::prost::Message`, `Message`).
fn derives(attrs: &[Attribute], what: &str) -> bool {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("derive"))
        .any(|a| {
            a.parse_args_with(Punctuated::<syn::Path, Token![,]>::parse_terminated)
                .map(|paths| {
                    paths
                        .iter()
                        .any(|p| p.segments.last().is_some_and(|s| s.ident == what))
                })
                .unwrap_or(false)
        })
}

fn int_value(e: &Expr) -> Option<i64> {
    match e {
        Expr::Lit(l) => match &l.lit {
            Lit::Int(i) => i.base10_parse().ok(),
            _ => None,
        },
        Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => int_value(&u.expr).map(|v| -v),
        Expr::Group(g) => int_value(&g.expr),
        Expr::Paren(p) => int_value(&p.expr),
        _ => None,
    }
}

/// The canonical spec of a field or oneof variant from its `#[prost(...)]`
/// attribute and its Rust type.
fn field_spec(attrs: &[Attribute], ty: &Type) -> Result<FieldSpec, String> {
    let attr = attrs
        .iter()
        .find(|a| a.path().is_ident("prost"))
        .ok_or("no #[prost(...)] attribute")?;
    let metas = attr
        .parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
        .map_err(|e| format!("#[prost(...)]: {e}"))?;
    let mut entries: BTreeMap<String, Option<String>> = BTreeMap::new();
    for m in &metas {
        let key = path_text(m.path());
        let value = match m {
            Meta::Path(_) => None,
            Meta::NameValue(nv) => match &nv.value {
                Expr::Lit(l) => match &l.lit {
                    Lit::Str(s) => Some(normalise(&key, &s.value())),
                    Lit::Int(i) => Some(i.base10_digits().to_string()),
                    Lit::Bool(b) => Some(b.value.to_string()),
                    _ => return Err(format!("#[prost(...)]: unexpected value of {key}")),
                },
                _ => return Err(format!("#[prost(...)]: unexpected value of {key}")),
            },
            Meta::List(_) => return Err(format!("#[prost(...)]: unexpected list {key}(...)")),
        };
        entries.insert(key, value);
    }
    // The type first, then labels, then the tag(s), as prost-build writes
    // them; alphabetical within each group.
    let rank = |k: &str| match k {
        "tag" | "tags" => 2,
        "repeated" | "optional" | "required" | "packed" | "boxed" => 1,
        _ => 0,
    };
    let mut keys: Vec<&String> = entries.keys().collect();
    keys.sort_by_key(|k| (rank(k), k.as_str()));
    let mut spec = keys
        .iter()
        .map(|k| match &entries[*k] {
            Some(v) => format!("{k} = \"{v}\""),
            None => k.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    if entries.contains_key("message") {
        spec.push_str(" -> ");
        spec.push_str(&held_type(ty));
    }
    Ok(spec)
}

fn path_text(p: &syn::Path) -> String {
    p.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

/// Attribute values that may be written differently but mean the same.
fn normalise(key: &str, value: &str) -> String {
    match key {
        // "1, 2, 3" and "1,2,3" and "3, 1, 2" name the same tags.
        "tags" => {
            let mut tags: Vec<u64> = value
                .split(',')
                .filter_map(|t| t.trim().parse().ok())
                .collect();
            tags.sort_unstable();
            tags.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        }
        // Paths as written, without spaces: "tx :: Sum" is "tx::Sum".
        _ => value.split_whitespace().collect(),
    }
}

/// The message type a field holds: the last path segment of the innermost
/// type of `Option<..>`, `Vec<..>`, `Box<..>` or a plain path.
fn held_type(ty: &Type) -> String {
    let Type::Path(p) = ty else {
        return "?".into();
    };
    let Some(last) = p.path.segments.last() else {
        return "?".into();
    };
    if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
        if let Some(syn::GenericArgument::Type(inner)) = args.args.first() {
            return held_type(inner);
        }
    }
    last.ident.to_string()
}

/// Every difference between `expected` (generated from the `.proto`) and
/// `found` (the hand-derived Rust), in a stable order.
pub fn compare(expected: &Schema, found: &Schema) -> Vec<Mismatch> {
    let mut out = Vec::new();
    diff_items("message", &expected.messages, &found.messages, &mut out);
    diff_items("oneof", &expected.oneofs, &found.oneofs, &mut out);
    diff_items("enum", &expected.enums, &found.enums, &mut out);
    out
}

fn diff_items<V: PartialEq + ToString>(
    kind: &str,
    expected: &BTreeMap<String, BTreeMap<String, V>>,
    found: &BTreeMap<String, BTreeMap<String, V>>,
    out: &mut Vec<Mismatch>,
) {
    let names: std::collections::BTreeSet<&String> = expected.keys().chain(found.keys()).collect();
    for name in names {
        let item = format!("{kind} {name}");
        match (expected.get(name), found.get(name)) {
            (Some(e), Some(f)) => {
                let members: std::collections::BTreeSet<&String> =
                    e.keys().chain(f.keys()).collect();
                for m in members {
                    let (ev, fv) = (e.get(m), f.get(m));
                    if ev != fv {
                        out.push(Mismatch {
                            item: item.clone(),
                            member: Some(m.clone()),
                            expected: ev.map(ToString::to_string),
                            found: fv.map(ToString::to_string),
                        });
                    }
                }
            }
            (e, f) => out.push(Mismatch {
                item,
                member: None,
                expected: e.map(|_| "defined".to_string()),
                found: f.map(|_| "defined".to_string()),
            }),
        }
    }
}

/// A readable report of `mismatches`, one per line, under a heading naming
/// the two sides.
pub fn report(expected_name: &str, found_name: &str, mismatches: &[Mismatch]) -> String {
    let mut s = format!(
        "{} wire-format mismatch(es): expected = {expected_name}, found = {found_name}\n",
        mismatches.len()
    );
    for m in mismatches {
        s.push_str("  ");
        s.push_str(&m.to_string());
        s.push('\n');
    }
    s
}

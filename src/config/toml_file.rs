//! Reading a config file so that every mistake is reported by line and
//! dotted key: a pass over the document's shape (with spans) checks keys
//! against the ones serde knows and suggests the nearest; a serde error is then
//! located by the span toml attaches to it.

use std::fmt;
use std::ops::Range;
use std::path::Path;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::ConfigError;
use crate::suggest::nearest;

/// The keys allowed in the table at a dotted path (`""` is the top level);
/// `None` leaves a table's keys to serde.
pub(super) type KnownKeys = fn(&str) -> Option<&'static [&'static str]>;

/// Parses a config file into `T`, after checking its keys against
/// `known_keys(table path)`; every error names the file, and the line and
/// dotted key where toml knows them.
pub(super) fn parse<T: DeserializeOwned>(
    text: &str,
    path: &Path,
    known_keys: KnownKeys,
) -> Result<T, ConfigError> {
    let tree: Tree = toml::from_str(text).map_err(|e| ConfigError::Syntax {
        path: path.into(),
        message: e.to_string().trim_end().to_string(),
    })?;
    check_keys(&tree, "", text, path, known_keys)?;
    toml::from_str(text).map_err(|e| {
        let offset = e.span().map(|s| s.start);
        let key = offset.and_then(|at| key_at(&tree, at));
        let at = match (offset, key) {
            (Some(at), Some(key)) => format!(" line {}: {key}", line_of(text, at)),
            (Some(at), None) => format!(" line {}", line_of(text, at)),
            (None, _) => String::new(),
        };
        ConfigError::BadValue {
            path: path.into(),
            at,
            message: e.message().to_string(),
        }
    })
}

/// Reports the first key that no struct knows, with its line and a hint.
fn check_keys(
    tree: &Tree,
    table: &str,
    text: &str,
    path: &Path,
    known_keys: KnownKeys,
) -> Result<(), ConfigError> {
    let (Tree::Table(entries), Some(known)) = (tree, known_keys(table)) else {
        return Ok(());
    };
    for (key, value) in entries {
        let full = if table.is_empty() {
            key.clone()
        } else {
            format!("{table}.{key}")
        };
        if !known.contains(&key.as_str()) {
            let hint = match nearest(key, known.iter().copied()) {
                Some(near) => format!("did you mean {near}?"),
                None => format!("known keys here: {}", known.join(", ")),
            };
            return Err(ConfigError::UnknownKey {
                path: path.into(),
                at: value
                    .span
                    .as_ref()
                    .map_or_else(String::new, |s| format!(" line {}", line_of(text, s.start))),
                key: full,
                hint,
            });
        }
        check_keys(&value.value, &full, text, path, known_keys)?;
    }
    Ok(())
}

/// The dotted key whose value most tightly contains byte `at`.
fn key_at(tree: &Tree, at: usize) -> Option<String> {
    fn walk(tree: &Tree, prefix: &str, at: usize, best: &mut Option<(usize, String)>) {
        let children: Vec<(String, &Spanned)> = match tree {
            Tree::Table(entries) => entries
                .iter()
                .map(|(k, v)| {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    (key, v)
                })
                .collect(),
            Tree::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("{prefix}[{i}]"), v))
                .collect(),
            Tree::Leaf => return,
        };
        for (key, child) in children {
            if let Some(span) = child.span.as_ref().filter(|s| s.contains(&at)) {
                if best.as_ref().is_none_or(|(len, _)| span.len() <= *len) {
                    *best = Some((span.len(), key.clone()));
                }
            }
            walk(&child.value, &key, at, best);
        }
    }
    let mut best = None;
    walk(tree, "", at, &mut best);
    best.map(|(_, key)| key)
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The shape of a TOML document with the byte span of every value, so that
/// messages can name keys and lines.
enum Tree {
    Table(Vec<(String, Spanned)>),
    Array(Vec<Spanned>),
    Leaf,
}

struct Spanned {
    /// `None` for a table that only exists through a dotted header such as
    /// `[server.raft]`: toml has no span for it.
    span: Option<Range<usize>>,
    value: Tree,
}

// toml hands out spans through serde_spanned's (doc-hidden, stable) protocol;
// speaking it directly, instead of via `toml::Spanned`, lets a value without a
// span through instead of failing.
const SPANNED_NAME: &str = "$__serde_spanned_private_Spanned";
const SPANNED_START: &str = "$__serde_spanned_private_start";
const SPANNED_END: &str = "$__serde_spanned_private_end";
const SPANNED_VALUE: &str = "$__serde_spanned_private_value";

impl<'de> Deserialize<'de> for Spanned {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct(
            SPANNED_NAME,
            &[SPANNED_START, SPANNED_END, SPANNED_VALUE],
            SpannedVisitor,
        )
    }
}

struct SpannedVisitor;

impl<'de> Visitor<'de> for SpannedVisitor {
    type Value = Spanned;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a TOML value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Spanned, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Ok(unspanned(Tree::Table(Vec::new())));
        };
        if first != SPANNED_START {
            return table(Some(first), map).map(unspanned);
        }
        let start: usize = map.next_value()?;
        map.next_key::<de::IgnoredAny>()?;
        let end: usize = map.next_value()?;
        map.next_key::<de::IgnoredAny>()?;
        let value: Tree = map.next_value()?;
        Ok(Spanned {
            span: Some(start..end),
            value,
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Spanned, A::Error> {
        TreeVisitor.visit_seq(seq).map(unspanned)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Spanned, E> {
        Ok(unspanned(Tree::Leaf))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Spanned, E> {
        Ok(unspanned(Tree::Leaf))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Spanned, E> {
        Ok(unspanned(Tree::Leaf))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Spanned, E> {
        Ok(unspanned(Tree::Leaf))
    }
    fn visit_str<E>(self, _: &str) -> Result<Spanned, E> {
        Ok(unspanned(Tree::Leaf))
    }
}

fn unspanned(value: Tree) -> Spanned {
    Spanned { span: None, value }
}

/// The entries of a table whose first key may already have been read.
fn table<'de, A: MapAccess<'de>>(first: Option<String>, mut map: A) -> Result<Tree, A::Error> {
    let mut entries = Vec::new();
    let mut key = first;
    if key.is_none() {
        key = map.next_key()?;
    }
    while let Some(k) = key {
        if k == TOML_DATETIME_KEY {
            map.next_value::<de::IgnoredAny>()?;
            return Ok(Tree::Leaf);
        }
        entries.push((k, map.next_value()?));
        key = map.next_key()?;
    }
    Ok(Tree::Table(entries))
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

/// toml's marker key for a datetime, which arrives as a one-entry map.
const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a TOML value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_str<E>(self, _: &str) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Tree::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Tree, A::Error> {
        table(None, map)
    }
}

/// The field names serde knows for `T`, which its derived `Deserialize` hands
/// to `deserialize_struct`. Captured with a deserializer that does nothing else.
pub(super) fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Capture<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Capture<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("fields captured"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
            enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Capture(&mut fields));
    fields
}

//! The YAML that CDI spec files are written in (`nvidia-ctk cdi generate`
//! writes YAML by default), read into a JSON value: block mappings and
//! sequences by indentation, `- key: value` items, plain, single- and
//! double-quoted scalars, one-line flow sequences and mappings (`[a, b]`,
//! `{}`), comments and a leading `---`. Anchors, tags, block scalars
//! (`|`, `>`) and multi-line flow collections are refused with the line,
//! never misread. Plain `true`/`false`/`null`/`~` and integers become
//! JSON booleans, null and numbers; everything else is a string.

use serde_json::{Map, Value};

/// One meaningful line: its indentation, its text (comment removed), its
/// number from 1.
struct Line {
    indent: usize,
    text: String,
    number: usize,
}

/// Parses `text`; the error names the line.
pub(super) fn parse(text: &str) -> Result<Value, String> {
    let mut lines = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let body = strip_comment(raw.trim_end());
        let trimmed = body.trim_start();
        if trimmed.is_empty() || (lines.is_empty() && trimmed == "---") {
            continue;
        }
        if trimmed == "---" || trimmed == "..." {
            return Err(format!("line {}: one document only", i + 1));
        }
        if raw.starts_with('\t') {
            return Err(format!("line {}: a tab in the indentation", i + 1));
        }
        lines.push(Line {
            indent: body.len() - trimmed.len(),
            text: trimmed.to_string(),
            number: i + 1,
        });
    }
    if lines.is_empty() {
        return Ok(Value::Null);
    }
    let mut at = 0;
    let indent = lines[0].indent;
    let value = block(&mut lines, &mut at, indent)?;
    match lines.get(at) {
        Some(l) => Err(format!("line {}: unexpected indentation", l.number)),
        None => Ok(value),
    }
}

/// `text` without a `#` comment (one at the start or after a space, outside
/// quotes).
fn strip_comment(text: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in text.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single && prev != '\\' => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return &text[..i],
            _ => {}
        }
        prev = c;
    }
    text
}

fn is_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

fn block(lines: &mut [Line], at: &mut usize, indent: usize) -> Result<Value, String> {
    match is_item(&lines[*at].text) {
        true => sequence(lines, at, indent),
        false => mapping(lines, at, indent),
    }
}

fn sequence(lines: &mut [Line], at: &mut usize, indent: usize) -> Result<Value, String> {
    let mut items = Vec::new();
    while *at < lines.len() && lines[*at].indent == indent && is_item(&lines[*at].text) {
        let rest = lines[*at].text[1..].trim_start().to_string();
        if rest.is_empty() {
            *at += 1;
            match lines.get(*at) {
                Some(next) if next.indent > indent => {
                    let inner = next.indent;
                    items.push(block(lines, at, inner)?);
                }
                _ => items.push(Value::Null),
            }
        } else if key_split(&rest).is_some() || is_item(&rest) {
            // `- key: value` opens a mapping (or `- - x` a sequence) whose
            // entries line up with `key`.
            let offset = lines[*at].text.len() - rest.len();
            lines[*at].indent = indent + offset;
            lines[*at].text = rest;
            let inner = lines[*at].indent;
            items.push(block(lines, at, inner)?);
        } else {
            items.push(scalar(&rest, lines[*at].number)?);
            *at += 1;
        }
    }
    Ok(Value::Array(items))
}

fn mapping(lines: &mut [Line], at: &mut usize, indent: usize) -> Result<Value, String> {
    let mut map = Map::new();
    while *at < lines.len() && lines[*at].indent == indent && !is_item(&lines[*at].text) {
        let number = lines[*at].number;
        let text = lines[*at].text.clone();
        let (key, value) = key_split(&text)
            .ok_or_else(|| format!("line {number}: expected `key: value`, found {text:?}"))?;
        let key = match scalar(key, number)? {
            Value::String(s) => s,
            other => other.to_string(),
        };
        *at += 1;
        let value = if value.is_empty() {
            match lines.get(*at) {
                Some(next) if next.indent > indent => {
                    let inner = next.indent;
                    block(lines, at, inner)?
                }
                Some(next) if next.indent == indent && is_item(&next.text) => {
                    sequence(lines, at, indent)?
                }
                _ => Value::Null,
            }
        } else {
            scalar(value, number)?
        };
        if map.insert(key.clone(), value).is_some() {
            return Err(format!("line {number}: key {key:?} appears twice"));
        }
    }
    Ok(Value::Object(map))
}

/// `key: value` (or `key:`) outside quotes and brackets: the two halves.
fn key_split(text: &str) -> Option<(&str, &str)> {
    let (mut single, mut double, mut depth) = (false, false, 0i32);
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'\'' if !double => single = !single,
            b'"' if !single && (i == 0 || bytes[i - 1] != b'\\') => double = !double,
            b'[' | b'{' if !single && !double => depth += 1,
            b']' | b'}' if !single && !double => depth -= 1,
            b':' if !single
                && !double
                && depth == 0
                && (i + 1 == bytes.len() || bytes[i + 1] == b' ') =>
            {
                return Some((text[..i].trim(), text[i + 1..].trim()));
            }
            _ => {}
        }
    }
    None
}

/// A scalar or a one-line flow collection.
fn scalar(text: &str, number: usize) -> Result<Value, String> {
    let text = text.trim();
    let refuse = |what: &str| {
        Err(format!(
            "line {number}: {what} are not supported in CDI specs"
        ))
    };
    match text.chars().next() {
        Some('|') | Some('>') => return refuse("block scalars (| and >)"),
        Some('&') | Some('*') => return refuse("anchors and aliases"),
        Some('!') => return refuse("tags"),
        Some('[') | Some('{') => return flow(text, number),
        Some('"') => return double_quoted(text, number).map(Value::String),
        Some('\'') => {
            let inner = text
                .strip_prefix('\'')
                .and_then(|t| t.strip_suffix('\''))
                .filter(|_| text.len() >= 2)
                .ok_or_else(|| format!("line {number}: an unterminated quote"))?;
            return Ok(Value::String(inner.replace("''", "'")));
        }
        _ => {}
    }
    Ok(match text {
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        "null" | "Null" | "NULL" | "~" | "" => Value::Null,
        _ => match text.parse::<i64>() {
            Ok(n) => Value::from(n),
            Err(_) => match text.strip_prefix("0o").map(|o| i64::from_str_radix(o, 8)) {
                Some(Ok(n)) => Value::from(n),
                _ => Value::String(text.to_string()),
            },
        },
    })
}

fn double_quoted(text: &str, number: usize) -> Result<String, String> {
    let inner = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .filter(|_| text.len() >= 2)
        .ok_or_else(|| format!("line {number}: an unterminated quote"))?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('"') => out.push('"'),
            Some('\\') => out.push('\\'),
            Some('/') => out.push('/'),
            other => {
                return Err(format!(
                    "line {number}: the escape \\{} is not supported",
                    other.map_or(String::new(), String::from)
                ))
            }
        }
    }
    Ok(out)
}

/// `[a, b]` or `{k: v}` on one line, nested ones too.
fn flow(text: &str, number: usize) -> Result<Value, String> {
    let (open, close) = match text.as_bytes()[0] {
        b'[' => ('[', ']'),
        _ => ('{', '}'),
    };
    let inner = text
        .strip_prefix(open)
        .and_then(|t| t.strip_suffix(close))
        .ok_or_else(|| {
            format!("line {number}: a flow collection must close on its own line: {text}")
        })?;
    // Top-level commas, outside quotes and nested brackets.
    let mut parts = Vec::new();
    let (mut single, mut double, mut depth, mut start) = (false, false, 0i32, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '[' | '{' if !single && !double => depth += 1,
            ']' | '}' if !single && !double => depth -= 1,
            ',' if !single && !double && depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    let parts = parts.into_iter().map(str::trim).filter(|p| !p.is_empty());
    if open == '[' {
        return parts
            .map(|p| scalar(p, number))
            .collect::<Result<_, _>>()
            .map(Value::Array);
    }
    let mut map = Map::new();
    for part in parts {
        let (k, v) = key_split(part)
            .ok_or_else(|| format!("line {number}: expected `key: value` in {text}"))?;
        let key = match scalar(k, number)? {
            Value::String(s) => s,
            other => other.to_string(),
        };
        map.insert(key, scalar(v, number)?);
    }
    Ok(Value::Object(map))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_cdi_spec_as_nvidia_ctk_writes_it_reads_as_its_json() {
        let text = r#"---
cdiVersion: 0.5.0
kind: nvidia.com/gpu   # the vendor's class
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      major: 195
      fileMode: 0o666
- name: MIG-1c2d
  containerEdits:
    deviceNodes: [{path: /dev/nvidia-caps/nvidia-cap12}]
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  - 'QUOTED=it''s # not a comment'
  hooks:
    - hookName: createContainer
      path: /usr/bin/nvidia-ctk
      args:
        - nvidia-ctk
        - hook
  mounts:
  - hostPath: /usr/lib/libcuda.so.535
    containerPath: /usr/lib/libcuda.so.535
    options: [ro, nosuid, nodev, bind]
  empty: []
"#;
        let v = parse(text).unwrap();
        let want = json!({
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "devices": [
                {"name": "0", "containerEdits": {"deviceNodes": [
                    {"path": "/dev/nvidia0", "major": 195, "fileMode": 438}]}},
                {"name": "MIG-1c2d", "containerEdits": {"deviceNodes": [
                    {"path": "/dev/nvidia-caps/nvidia-cap12"}]}},
            ],
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=void", "QUOTED=it's # not a comment"],
                "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk",
                    "args": ["nvidia-ctk", "hook"]}],
                "mounts": [{"hostPath": "/usr/lib/libcuda.so.535",
                    "containerPath": "/usr/lib/libcuda.so.535",
                    "options": ["ro", "nosuid", "nodev", "bind"]}],
                "empty": [],
            },
        });
        assert_eq!(v, want);
    }

    #[test]
    fn what_it_cannot_read_is_refused_with_the_line() {
        for (text, line) in [
            ("a: |\n  text\n", "line 1"),
            ("a: &x 1\n", "line 1"),
            ("a: 1\nb: [1,\n  2]\n", "line 2"),
            ("a: 1\na: 2\n", "line 2"),
            ("a:\n  b: 1\n c: 2\n", "line 3"),
            ("a: \"open\n", "line 1"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.starts_with(line), "{text:?}: {err}");
        }
    }
}

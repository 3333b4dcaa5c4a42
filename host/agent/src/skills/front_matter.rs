//! A `SKILL.md` read into what the loader needs: its YAML front matter (saphyr, bounded, aliases
//! limited) with `name`, `description` and the programs it requires, in clawcage's form
//! (`requires: {programs: [...]}`) or OpenClaw's (`metadata.openclaw.requires.bins` and
//! `anyBins`), the keys that grant nothing noted as ignored, and the markdown after it.

use saphyr::{LoadableYamlNode, Scalar, Yaml};
use serde_json::{Map, Value};

use super::{INERT_KEYS, MAX_DESCRIPTION_CHARS, MAX_FRONT_MATTER_BYTES, SKILL_FILE};

/// What a `SKILL.md` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ParsedSkill {
    pub(super) name: String,
    pub(super) description: String,
    pub(super) requires: Vec<String>,
    pub(super) requires_any: Vec<String>,
    pub(super) notes: Vec<String>,
    /// Why the skill itself asks not to be offered.
    pub(super) refusal: Option<String>,
    /// The markdown after the front matter.
    pub(super) instructions: String,
}

/// Whether `name` can name a skill or its folder: letters, digits, `.`, `_`, `-`, at most 64,
/// not starting with `.` or `-`.
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Whether `name` can be a program name (as exec's catalog names them).
fn valid_program_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['-', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'))
}

/// Parses the text of a `SKILL.md`: front matter between a first line `---` and the next line
/// `---` (or `...`), then the instructions.
pub(super) fn parse_skill_file(text: &str) -> Result<ParsedSkill, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or_default();
    if first.trim_end() != "---" {
        return Err(format!(
            "{SKILL_FILE} has no front matter: its first line must be `---`, followed by `name:` and `description:` lines and a closing `---`"
        ));
    }
    let start = first.len();
    let mut offset = start;
    let mut end = None;
    for line in lines {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed == "..." {
            end = Some((offset, offset + line.len()));
            break;
        }
        offset += line.len();
        if offset - start > MAX_FRONT_MATTER_BYTES {
            break;
        }
    }
    let Some((front_end, body_start)) = end else {
        return Err(if offset - start > MAX_FRONT_MATTER_BYTES {
            format!("the front matter is longer than {MAX_FRONT_MATTER_BYTES} bytes")
        } else {
            "the front matter is not closed: no line `---` follows the first".to_string()
        });
    };
    let front = &text[start..front_end];
    let instructions = text[body_start..].to_string();
    let value = parse_yaml(front)?;
    let Value::Object(map) = value else {
        return Err(
            "the front matter is not a mapping of keys (`name: ...`, `description: ...`)"
                .to_string(),
        );
    };
    let name = match map.get("name") {
        Some(Value::String(name)) => name.trim().to_string(),
        Some(_) => return Err("the front matter's `name` must be text".to_string()),
        None => return Err("the front matter has no `name` (it is required)".to_string()),
    };
    if !valid_name(&name) {
        return Err(format!(
            "the name `{}` is not a skill name: letters, digits, '.', '_' and '-', at most 64 characters",
            name.chars().take(80).collect::<String>()
        ));
    }
    let description = match map.get("description") {
        Some(Value::String(text)) => text.split_whitespace().collect::<Vec<_>>().join(" "),
        Some(_) => return Err("the front matter's `description` must be text".to_string()),
        None => {
            return Err("the front matter has no `description` (it is required)".to_string());
        }
    };
    if description.is_empty() {
        return Err("the description is empty".to_string());
    }
    let chars = description.chars().count();
    if chars > MAX_DESCRIPTION_CHARS {
        return Err(format!(
            "the description is {chars} characters, more than {MAX_DESCRIPTION_CHARS}"
        ));
    }
    let mut parsed = ParsedSkill {
        name,
        description,
        requires: Vec::new(),
        requires_any: Vec::new(),
        notes: Vec::new(),
        refusal: None,
        instructions,
    };
    if let Some(requires) = map.get("requires") {
        match requires {
            Value::Object(requires) => {
                for (key, value) in requires {
                    if key == "programs" {
                        parsed
                            .requires
                            .extend(program_names("requires.programs", value)?);
                    } else {
                        parsed.notes.push(format!(
                            "ignored `requires.{key}`: only `requires.programs` is checked"
                        ));
                    }
                }
            }
            other => parsed.requires.extend(program_names("requires", other)?),
        }
    }
    if let Some(metadata) = map.get("metadata") {
        read_openclaw_metadata(metadata, &mut parsed)?;
    }
    if map.get("disable-model-invocation") == Some(&Value::Bool(true)) {
        parsed.refusal = Some(
            "`disable-model-invocation: true`: the skill is meant to be started by a user's command, which clawcage does not have"
                .to_string(),
        );
    }
    let mut ignored: Vec<String> = map
        .keys()
        .filter(|key| !INERT_KEYS.contains(&key.as_str()) && *key != "disable-model-invocation")
        .map(|key| format!("`{}`", key.chars().take(64).collect::<String>()))
        .collect();
    // Named in one order whatever the map's.
    ignored.sort();
    if !ignored.is_empty() {
        parsed.notes.push(format!(
            "ignored {}: a skill is instructions; its front matter cannot grant tools, hosts, paths or programs, nor change approvals or limits",
            ignored.join(", ")
        ));
    }
    parsed.requires.sort();
    parsed.requires.dedup();
    Ok(parsed)
}

/// OpenClaw's `metadata: {"openclaw": {"requires": {"bins": [...], "anyBins": [...]}}}` (also
/// as a JSON string, as OpenClaw writes it on one line).
fn read_openclaw_metadata(metadata: &Value, parsed: &mut ParsedSkill) -> Result<(), String> {
    let from_text;
    let metadata = match metadata {
        Value::String(text) => {
            from_text = serde_json::from_str::<Value>(text).map_err(|error| {
                format!("the front matter's `metadata` is text but not JSON: {error}")
            })?;
            &from_text
        }
        other => other,
    };
    let Some(openclaw) = metadata.get("openclaw") else {
        return Ok(());
    };
    let Some(requires) = openclaw.get("requires") else {
        if openclaw.get("install").is_some() {
            parsed.notes.push(install_note());
        }
        return Ok(());
    };
    let Value::Object(requires) = requires else {
        return Err("`metadata.openclaw.requires` must be a mapping".to_string());
    };
    for (key, value) in requires {
        match key.as_str() {
            "bins" => parsed
                .requires
                .extend(program_names("metadata.openclaw.requires.bins", value)?),
            "anyBins" => parsed.requires_any.extend(program_names(
                "metadata.openclaw.requires.anyBins",
                value,
            )?),
            other => parsed.notes.push(format!(
                "not checked: `metadata.openclaw.requires.{other}` (clawcage checks the programs, `bins` and `anyBins`)"
            )),
        }
    }
    if openclaw.get("install").is_some() {
        parsed.notes.push(install_note());
    }
    Ok(())
}

fn install_note() -> String {
    "ignored `metadata.openclaw.install`: clawcage installs nothing for a skill; see `clawcage programs list` for what exec runs".to_string()
}

/// The program names of `value` (one name or a list of names) at `key`.
fn program_names(key: &str, value: &Value) -> Result<Vec<String>, String> {
    let names: Vec<&Value> = match value {
        Value::Array(items) => items.iter().collect(),
        Value::Null => Vec::new(),
        other => vec![other],
    };
    names
        .into_iter()
        .map(|name| match name {
            Value::String(name) if valid_program_name(name) => Ok(name.clone()),
            Value::String(name) => Err(format!(
                "`{key}` names `{}`, which is not a program name",
                name.chars().take(64).collect::<String>()
            )),
            _ => Err(format!("`{key}` must be a program name or a list of them")),
        })
        .collect()
}

/// The front matter as JSON: one YAML document, errors with their line in `SKILL.md`.
fn parse_yaml(front: &str) -> Result<Value, String> {
    let documents = Yaml::load_from_str(front).map_err(|error| {
        format!(
            "the front matter is not valid YAML: line {}, column {}: {}",
            // The front matter starts on the file's second line.
            error.marker().line() + 1,
            error.marker().col() + 1,
            error.info()
        )
    })?;
    match documents.as_slice() {
        [] => Err("the front matter is empty; it needs `name:` and `description:`".to_string()),
        [document] => Ok(to_json(document)),
        _ => Err("the front matter holds more than one YAML document".to_string()),
    }
}

/// A YAML node as JSON (a key that is not text is written as its YAML scalar's text).
fn to_json(node: &Yaml) -> Value {
    match node {
        Yaml::Value(scalar) => scalar_to_json(scalar),
        Yaml::Representation(text, _, _) => Value::String(text.to_string()),
        Yaml::Tagged(_, inner) => to_json(inner),
        Yaml::Sequence(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Mapping(entries) => {
            let mut map = Map::new();
            for (key, value) in entries {
                let key = match to_json(key) {
                    Value::String(key) => key,
                    other => other.to_string(),
                };
                map.insert(key, to_json(value));
            }
            Value::Object(map)
        }
        _ => Value::Null,
    }
}

fn scalar_to_json(scalar: &Scalar) -> Value {
    match scalar {
        Scalar::Null => Value::Null,
        Scalar::Boolean(value) => Value::Bool(*value),
        Scalar::Integer(value) => Value::from(*value),
        Scalar::FloatingPoint(value) => {
            serde_json::Number::from_f64(value.into_inner()).map_or(Value::Null, Value::Number)
        }
        Scalar::String(text) => Value::String(text.to_string()),
    }
}

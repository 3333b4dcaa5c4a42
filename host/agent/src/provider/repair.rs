//! Tool-call arguments arrive as JSON text the model wrote, and models sometimes get it slightly
//! wrong. A repair is made only when exactly one reading is possible: surrounding whitespace or a
//! Markdown code fence, an empty string for a call without arguments, stray closing brackets after
//! a complete object, or closing brackets missing at the very end of an otherwise complete object.
//! Anything else — a cut-off string, a second object, a value that is not an object — is refused
//! and reported to the model, which can send the call again.

use serde_json::Value;

/// A successful parse.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// The text was a JSON object as it stood.
    Clean(Value),
    /// The text was repaired; the string says how.
    Repaired(Value, String),
}

/// Parse tool-call arguments, repairing them where that is unambiguous.
pub fn parse_tool_arguments(raw: &str) -> Result<Parsed, String> {
    if let Ok(value) = serde_json::from_str::<Value>(raw) {
        return as_object(value).map(Parsed::Clean);
    }
    let mut text = raw.trim();
    let mut steps = Vec::new();
    if let Some(inner) = strip_code_fence(text) {
        text = inner.trim();
        steps.push("removed a Markdown code fence");
    }
    if text.is_empty() {
        return Ok(Parsed::Repaired(
            Value::Object(Default::default()),
            "empty arguments read as {}".to_string(),
        ));
    }
    if !text.starts_with('{') {
        return Err("the arguments do not start with `{`".to_string());
    }
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return as_object(value).map(|value| Parsed::Repaired(value, steps.join(", ")));
    }

    // A complete object followed by something: accept only stray closing brackets.
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    if let Some(Ok(value)) = stream.next() {
        let rest = &text[stream.byte_offset()..];
        if rest
            .chars()
            .all(|c| c == '}' || c == ']' || c.is_whitespace())
        {
            steps.push("dropped stray closing brackets after the object");
            return as_object(value).map(|value| Parsed::Repaired(value, steps.join(", ")));
        }
        return Err(format!(
            "unexpected text after the arguments object: {}",
            super::preview(rest.trim(), 60)
        ));
    }

    // Missing closing brackets at the end.
    if let Some(closers) = missing_closers(text) {
        let completed = format!("{text}{closers}");
        if let Ok(value) = serde_json::from_str::<Value>(&completed) {
            steps.push("added missing closing brackets");
            return as_object(value).map(|value| Parsed::Repaired(value, steps.join(", ")));
        }
    }
    match serde_json::from_str::<Value>(text) {
        Err(error) => Err(format!("not valid JSON: {error}")),
        Ok(_) => Err("not valid JSON".to_string()),
    }
}

fn as_object(value: Value) -> Result<Value, String> {
    match value {
        Value::Object(_) => Ok(value),
        other => Err(format!(
            "the arguments must be a JSON object, not {}",
            match other {
                Value::Null => "null",
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                Value::Array(_) => "an array",
                Value::Object(_) => "an object",
            }
        )),
    }
}

fn strip_code_fence(text: &str) -> Option<&str> {
    let body = text.strip_prefix("```")?.strip_suffix("```")?;
    let body = body.strip_prefix("json").unwrap_or(body);
    Some(body)
}

/// The brackets that would close `text`, if the text ends at a point where closing is the only
/// possible continuation: outside a string, and not right after `:` or `,`.
fn missing_closers(text: &str) -> Option<String> {
    let mut stack = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    let mut last_significant = ' ';
    for c in text.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
                last_significant = '"';
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => stack.push('}'),
            '[' => stack.push(']'),
            '}' | ']' => match stack.pop() {
                Some(expected) if expected == c => {}
                _ => return None,
            },
            _ => {}
        }
        if !c.is_whitespace() {
            last_significant = c;
        }
    }
    if in_string || stack.is_empty() || matches!(last_significant, ':' | ',' | '{' | '[') {
        return None;
    }
    Some(stack.iter().rev().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn repaired(raw: &str) -> Value {
        match parse_tool_arguments(raw) {
            Ok(Parsed::Repaired(value, _)) => value,
            other => panic!("{raw:?} should be repaired, got {other:?}"),
        }
    }

    #[test]
    fn clean_objects_pass_untouched() {
        assert_eq!(
            parse_tool_arguments(r#"{"path": "a b"}"#),
            Ok(Parsed::Clean(json!({"path": "a b"})))
        );
    }

    #[test]
    fn unambiguous_damage_is_repaired() {
        assert_eq!(repaired(""), json!({}));
        assert_eq!(repaired("  \n"), json!({}));
        assert_eq!(repaired(r#"{"path":"a"}}"#), json!({"path": "a"}));
        assert_eq!(repaired(r#"{"path":"a"} ] }"#), json!({"path": "a"}));
        assert_eq!(repaired(r#"{"path":"a""#), json!({"path": "a"}));
        assert_eq!(repaired(r#"{"a":{"b":[1,2]"#), json!({"a": {"b": [1, 2]}}));
        assert_eq!(repaired(r#"{"a":[1,2"#), json!({"a": [1, 2]}));
        assert_eq!(
            repaired("```json\n{\"path\":\"a\"}\n```"),
            json!({"path": "a"})
        );
        assert_eq!(
            repaired(r#"{"text":"has } and { inside""#),
            json!({"text": "has } and { inside"})
        );
    }

    #[test]
    fn ambiguous_damage_is_refused() {
        for raw in [
            r#"{"path":"a"#,       // cut inside a string
            r#"{"path":"#,         // cut after a colon
            r#"{"path":"a","#,     // cut after a comma
            r#"{"a":1}{"b":2}"#,   // two objects
            r#"{"a":1} and more"#, // prose after the object
            r#"["a"]"#,            // not an object
            r#""just a string""#,
            "null",
            "read the file please",
            r#"{"a":1]"#,  // mismatched bracket
            r#"{'a': 1}"#, // single quotes
            r#"{"a":{"#,   // cut after an opening brace
        ] {
            assert!(
                parse_tool_arguments(raw).is_err(),
                "{raw:?} should be refused"
            );
        }
    }
}

//! Reading fields of the arguments object, with errors that name the field.
//!
//! The host has validated the arguments against the tool's schema already;
//! these helpers still check, so a tool never misreads a value and the model
//! gets a precise [`ToolError::InvalidArgs`] if anything slipped through.
//! A field that is present with the value `null` counts as absent.

use crate::{ToolError, Value};

/// The arguments text of a call as a JSON object (empty text counts as `{}`). Components that
/// write their own export glue (those with extra imports) parse with this, as the SDK's does.
pub fn parse(text: &str) -> Result<Value, ToolError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    let value: Value = serde_json::from_str(text)
        .map_err(|e| ToolError::InvalidArgs(format!("the arguments are not valid JSON: {e}")))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(ToolError::InvalidArgs(
            "the arguments must be a JSON object".to_string(),
        ))
    }
}

/// The JSON type of a value, as a word for error messages.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The field's value, or `None` when it is missing or `null`.
fn field<'a>(args: &'a Value, field: &str) -> Option<&'a Value> {
    args.get(field).filter(|v| !v.is_null())
}

fn wrong_type(field: &str, expected: &str, got: &Value) -> ToolError {
    ToolError::InvalidArgs(format!(
        "argument '{field}' must be {expected}, got {}",
        type_name(got)
    ))
}

/// A string field that must be present.
///
/// Errors: `InvalidArgs("missing required argument 'path' (a string)")`, or
/// `InvalidArgs("argument 'path' must be a string, got an integer")`.
pub fn required_str<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolError> {
    match field(args, name) {
        None => Err(ToolError::InvalidArgs(format!(
            "missing required argument '{name}' (a string)"
        ))),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(wrong_type(name, "a string", other)),
    }
}

/// A string field that may be absent.
pub fn optional_str<'a>(args: &'a Value, name: &str) -> Result<Option<&'a str>, ToolError> {
    match field(args, name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(wrong_type(name, "a string", other)),
    }
}

/// A non-negative integer field that may be absent. A number with a zero
/// fraction such as `3.0` counts as an integer, as in JSON Schema.
pub fn optional_u64(args: &Value, name: &str) -> Result<Option<u64>, ToolError> {
    let Some(value) = field(args, name) else {
        return Ok(None);
    };
    let Value::Number(n) = value else {
        return Err(wrong_type(name, "a non-negative integer", value));
    };
    if let Some(u) = n.as_u64() {
        return Ok(Some(u));
    }
    if let Some(f) = n.as_f64()
        && f.fract() == 0.0
        && (0.0..=u64::MAX as f64).contains(&f)
    {
        // Exact for every value a schema-valid call can carry.
        return Ok(Some(f as u64));
    }
    Err(ToolError::InvalidArgs(format!(
        "argument '{name}' must be a non-negative integer, got {n}"
    )))
}

/// A non-negative integer field that must be present.
pub fn required_u64(args: &Value, name: &str) -> Result<u64, ToolError> {
    optional_u64(args, name)?.ok_or_else(|| {
        ToolError::InvalidArgs(format!(
            "missing required argument '{name}' (a non-negative integer)"
        ))
    })
}

/// A boolean field that may be absent.
pub fn optional_bool(args: &Value, name: &str) -> Result<Option<bool>, ToolError> {
    match field(args, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(name, "a boolean", other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json;

    fn invalid(msg: &str) -> ToolError {
        ToolError::InvalidArgs(msg.to_string())
    }

    #[test]
    fn strings() {
        let args = json!({"path": "a.txt", "n": 3, "gone": null});
        assert_eq!(required_str(&args, "path"), Ok("a.txt"));
        assert_eq!(
            required_str(&args, "missing"),
            Err(invalid("missing required argument 'missing' (a string)"))
        );
        assert_eq!(
            required_str(&args, "gone"),
            Err(invalid("missing required argument 'gone' (a string)"))
        );
        assert_eq!(
            required_str(&args, "n"),
            Err(invalid("argument 'n' must be a string, got an integer"))
        );
        assert_eq!(optional_str(&args, "missing"), Ok(None));
        assert_eq!(optional_str(&args, "path"), Ok(Some("a.txt")));
    }

    #[test]
    fn integers() {
        let args = json!({"a": 7, "b": 2.0, "c": -1, "d": 1.5, "e": "3"});
        assert_eq!(optional_u64(&args, "a"), Ok(Some(7)));
        assert_eq!(optional_u64(&args, "b"), Ok(Some(2)));
        assert_eq!(optional_u64(&args, "z"), Ok(None));
        assert_eq!(
            optional_u64(&args, "c"),
            Err(invalid(
                "argument 'c' must be a non-negative integer, got -1"
            ))
        );
        assert_eq!(
            optional_u64(&args, "d"),
            Err(invalid(
                "argument 'd' must be a non-negative integer, got 1.5"
            ))
        );
        assert_eq!(
            optional_u64(&args, "e"),
            Err(invalid(
                "argument 'e' must be a non-negative integer, got a string"
            ))
        );
        assert_eq!(required_u64(&args, "a"), Ok(7));
        assert!(required_u64(&args, "z").is_err());
    }

    #[test]
    fn booleans() {
        let args = json!({"t": true, "s": "yes"});
        assert_eq!(optional_bool(&args, "t"), Ok(Some(true)));
        assert_eq!(optional_bool(&args, "x"), Ok(None));
        assert!(optional_bool(&args, "s").is_err());
    }
}

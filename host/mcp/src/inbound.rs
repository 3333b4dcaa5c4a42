//! The checks every message from a client passes before rmcp parses it: its size, how deeply its
//! arrays and objects nest, whether it is JSON and a JSON-RPC message at all. rmcp drops what it
//! cannot parse without answering (serde_json refuses to nest deeper than 128 levels, and rmcp's
//! stdio transport ignores syntax errors and lines over its cap), so the client would wait
//! forever; here a refused request is answered with a JSON-RPC error that carries its id whenever
//! the id can be read. The [`Scan`] is iterative and keeps a bounded amount of state however long
//! or deep its input is, so it reads the id even of a message too large to keep, and nothing
//! nested deeper than [`MAX_MESSAGE_DEPTH`] levels ever reaches a recursive parser, schema
//! validator, serializer or destructor.

use rmcp::model::ClientJsonRpcMessage;
use serde_json::Value;

/// The largest message accepted, in bytes: one line over stdio, one request body over HTTP.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

/// How deeply the arguments of a tool call may nest arrays and objects; the arguments object
/// itself is the first level.
pub const MAX_ARGUMENT_DEPTH: usize = 64;

/// How deeply a whole message may nest: the arguments of `tools/call` sit two levels down
/// (`{"params": {"arguments": {…}}}`).
pub const MAX_MESSAGE_DEPTH: usize = MAX_ARGUMENT_DEPTH + 2;

/// JSON-RPC: the message is not valid JSON.
pub const PARSE_ERROR: i32 = -32700;
/// JSON-RPC: the JSON is not a valid request (or is too large or too deep to take).
pub const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC: the request's parameters are invalid.
pub const INVALID_PARAMS: i32 = -32602;

/// The most bytes kept of a top-level key or of the value of `id` or `method`.
const MAX_CAPTURE: usize = 256;

/// The UTF-8 byte order mark, which RFC 8259 lets a parser ignore.
const BOM: &[u8; 3] = b"\xEF\xBB\xBF";

/// What the top level of the message is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Root {
    /// Nothing but whitespace yet.
    #[default]
    Empty,
    /// An object: a request, notification or response.
    Object,
    /// An array (a batch, which MCP no longer has) or a scalar.
    Other,
}

/// Where the scan is among the members of the top-level object.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Member {
    /// Expecting a key (or the end of the object).
    #[default]
    Key,
    /// Inside a key's string.
    InKey,
    /// After a key, expecting `:`.
    Colon,
    /// After `:`, expecting the value.
    Value,
    /// Inside a string value.
    StringValue,
    /// Inside a number or literal.
    Scalar,
    /// Inside an array or object value.
    Nested,
    /// After a value, expecting `,` or the end of the object.
    Comma,
}

/// A bounded copy of a few bytes.
#[derive(Debug, Default)]
struct Capture {
    bytes: Vec<u8>,
    overflow: bool,
}

impl Capture {
    fn push(&mut self, byte: u8) {
        if self.bytes.len() < MAX_CAPTURE {
            self.bytes.push(byte);
        } else {
            self.overflow = true;
        }
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.overflow = false;
    }

    fn is(&self, text: &str) -> bool {
        !self.overflow && self.bytes == text.as_bytes()
    }

    fn take(&mut self) -> Option<Vec<u8>> {
        let kept = (!self.overflow).then(|| std::mem::take(&mut self.bytes));
        self.clear();
        kept
    }
}

/// A single pass over a message's bytes, fed in chunks: its length, the deepest nesting of arrays
/// and objects, and the top-level `id` and `method` (what a reply needs). It does not check the
/// syntax — serde_json does that once the message is known to be small and shallow enough — so
/// on malformed input its findings are a best guess.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    bytes: usize,
    bom: usize,
    content: bool,
    /// The current level of nesting.
    level: usize,
    max_depth: usize,
    in_string: bool,
    escaped: bool,
    root: Root,
    member: Member,
    key: Capture,
    value: Capture,
    /// `Some(None)`: the key is present but its value is not a usable scalar.
    id: Option<Option<Vec<u8>>>,
    method: Option<Option<Vec<u8>>>,
    /// A `result` or `error` member: the message is a response to the server.
    answer: bool,
}

impl Scan {
    /// Reads the next chunk of the message.
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        for &byte in chunk {
            self.step(byte);
        }
    }

    /// How many bytes were fed.
    pub(crate) fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the message is only whitespace (a blank line).
    pub(crate) fn is_blank(&self) -> bool {
        !self.content
    }

    /// The deepest nesting of arrays and objects seen (the top-level object is level 1).
    pub(crate) fn depth(&self) -> usize {
        self.max_depth
    }

    fn step(&mut self, byte: u8) {
        let position = self.bytes;
        self.bytes += 1;
        if position == self.bom && position < BOM.len() && byte == BOM[position] {
            self.bom += 1;
            return;
        }
        if self.in_string {
            self.string_byte(byte);
            return;
        }
        if !matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
            self.content = true;
        }
        let top = self.level == 1 && self.root == Root::Object;
        match byte {
            b'"' => {
                self.in_string = true;
                if self.level == 0 && self.root == Root::Empty {
                    self.root = Root::Other;
                } else if top {
                    match self.member {
                        Member::Key => {
                            self.key.clear();
                            self.member = Member::InKey;
                        }
                        Member::Value => {
                            self.begin_value();
                            self.value.push(byte);
                            self.member = Member::StringValue;
                        }
                        _ => {}
                    }
                }
            }
            b'{' | b'[' => {
                self.level += 1;
                self.max_depth = self.max_depth.max(self.level);
                if self.level == 1 {
                    if self.root == Root::Empty {
                        self.root = if byte == b'{' {
                            Root::Object
                        } else {
                            Root::Other
                        };
                    }
                } else if self.level == 2
                    && self.root == Root::Object
                    && self.member == Member::Value
                {
                    self.begin_value();
                    self.member = Member::Nested;
                }
            }
            b'}' | b']' => {
                if top && self.member == Member::Scalar {
                    self.finish_value();
                }
                self.level = self.level.saturating_sub(1);
                if self.level == 1 && self.root == Root::Object && self.member == Member::Nested {
                    self.finish_value();
                }
            }
            b':' if top && self.member == Member::Colon => self.member = Member::Value,
            b',' if top => {
                if self.member == Member::Scalar {
                    self.finish_value();
                }
                if self.member == Member::Comma {
                    self.member = Member::Key;
                }
            }
            b' ' | b'\t' | b'\n' | b'\r' => {
                if top && self.member == Member::Scalar {
                    self.finish_value();
                }
            }
            _ => {
                if self.level == 0 && self.root == Root::Empty {
                    self.root = Root::Other;
                } else if top {
                    match self.member {
                        Member::Value => {
                            self.begin_value();
                            self.value.push(byte);
                            self.member = Member::Scalar;
                        }
                        Member::Scalar => self.value.push(byte),
                        _ => {}
                    }
                }
            }
        }
    }

    fn string_byte(&mut self, byte: u8) {
        if self.escaped {
            self.escaped = false;
        } else if byte == b'\\' {
            self.escaped = true;
        } else if byte == b'"' {
            self.in_string = false;
        }
        if self.level != 1 || self.root != Root::Object {
            return;
        }
        match self.member {
            Member::InKey if self.in_string => self.key.push(byte),
            Member::InKey => self.member = Member::Colon,
            Member::StringValue => {
                self.value.push(byte);
                if !self.in_string {
                    self.finish_value();
                }
            }
            _ => {}
        }
    }

    fn begin_value(&mut self) {
        self.value.clear();
        if self.key.is("id") {
            self.id = Some(None);
        } else if self.key.is("method") {
            self.method = Some(None);
        } else if self.key.is("result") || self.key.is("error") {
            self.answer = true;
        }
    }

    fn finish_value(&mut self) {
        let nested = self.member == Member::Nested;
        let value = self.value.take().filter(|_| !nested);
        if self.key.is("id") {
            self.id = Some(value);
        } else if self.key.is("method") {
            self.method = Some(value);
        }
        self.member = Member::Comma;
    }

    /// The request's id, if it is a string or a number (what JSON-RPC allows).
    pub(crate) fn id(&self) -> Option<Value> {
        let raw = self.id.as_ref()?.as_ref()?;
        match serde_json::from_slice::<Value>(raw).ok()? {
            id @ (Value::String(_) | Value::Number(_)) => Some(id),
            _ => None,
        }
    }

    /// The method named at the top level, if it is a string.
    pub(crate) fn method(&self) -> Option<String> {
        let raw = self.method.as_ref()?.as_ref()?;
        serde_json::from_slice::<String>(raw).ok()
    }

    /// Whether the sender waits for an answer: JSON-RPC answers neither a notification (a
    /// method without an id) nor a response, and answers everything else, with a `null` id when
    /// it has none.
    pub(crate) fn expects_answer(&self) -> bool {
        if self.root != Root::Object {
            return true;
        }
        match (&self.method, &self.id) {
            (Some(_), None) => false,
            (None, _) if self.answer => false,
            _ => true,
        }
    }

    /// `message` without a leading byte order mark, if the scan saw one.
    pub(crate) fn without_bom<'a>(&self, message: &'a [u8]) -> &'a [u8] {
        if self.bom == BOM.len() {
            message.get(BOM.len()..).unwrap_or_default()
        } else {
            message
        }
    }
}

/// Why a message was not passed on, and the JSON-RPC error that answers it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    /// The JSON-RPC error code.
    pub code: i32,
    /// What was wrong and what to do instead.
    pub message: String,
    /// The id of the refused request, when it could be read.
    pub id: Option<Value>,
    /// Whether the sender waits for an answer (false for notifications and responses).
    pub answer: bool,
    /// Whether the message was refused for its size (HTTP 413 rather than 400).
    pub too_large: bool,
}

impl Refusal {
    /// Logs the refusal: a warning when the sender waits for the answer, else (a broken
    /// notification, perhaps a client's extension) a debug line.
    pub fn log(&self) {
        if self.answer {
            tracing::warn!(code = self.code, id = ?self.id, "refused an MCP request: {}", self.message);
        } else {
            tracing::debug!(code = self.code, "dropped an MCP message: {}", self.message);
        }
    }

    fn new(scan: &Scan, code: i32, message: String) -> Refusal {
        Refusal {
            code,
            message,
            id: scan.id(),
            answer: scan.expects_answer(),
            too_large: false,
        }
    }

    /// The JSON-RPC error response, or `None` when the sender expects no answer.
    pub fn reply(&self) -> Option<Value> {
        self.answer.then(|| {
            serde_json::json!({
                "jsonrpc": "2.0",
                "id": self.id.clone().unwrap_or(Value::Null),
                "error": {"code": self.code, "message": self.message},
            })
        })
    }
}

/// Checks a whole message (`message` is `None` when it was too large to keep) and parses it, or
/// says why not. `scan` must have been fed exactly the message's bytes.
pub(crate) fn admit(message: Option<&[u8]>, scan: &Scan) -> Result<ClientJsonRpcMessage, Refusal> {
    let message = match message {
        Some(message) if scan.len() <= MAX_MESSAGE_BYTES => message,
        _ => return Err(too_large(scan)),
    };
    if scan.depth() > MAX_MESSAGE_DEPTH {
        return Err(too_deep(scan));
    }
    // Shallow enough for serde_json's recursive parser (whose own limit is 128 levels).
    serde_json::from_slice(scan.without_bom(message)).map_err(|error| {
        use serde_json::error::Category;
        match error.classify() {
            Category::Syntax | Category::Eof => Refusal::new(
                scan,
                PARSE_ERROR,
                format!(
                    "Parse error: the message is not valid JSON ({error}); send one JSON-RPC message as one line of JSON"
                ),
            ),
            Category::Data | Category::Io => Refusal::new(
                scan,
                INVALID_REQUEST,
                format!(
                    "Invalid request: the message is JSON but not a JSON-RPC 2.0 request, notification or response this server reads ({error})"
                ),
            ),
        }
    })
}

/// The refusal of a message over [`MAX_MESSAGE_BYTES`] (`scan` may have seen only its start).
pub(crate) fn too_large(scan: &Scan) -> Refusal {
    let mut refusal = Refusal::new(
        scan,
        INVALID_REQUEST,
        format!(
            "Invalid request: the message is larger than {MAX_MESSAGE_BYTES} bytes ({} MiB), the most this server accepts; send large content in smaller parts (for example, write a large file with several calls)",
            MAX_MESSAGE_BYTES >> 20
        ),
    );
    refusal.too_large = true;
    refusal
}

fn too_deep(scan: &Scan) -> Refusal {
    if scan.method().as_deref() == Some("tools/call") {
        Refusal::new(
            scan,
            INVALID_PARAMS,
            format!(
                "Invalid params: arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels (the request nests arrays and objects {} levels deep, at most {MAX_MESSAGE_DEPTH} are accepted in all); flatten the arguments",
                scan.depth()
            ),
        )
    } else {
        Refusal::new(
            scan,
            INVALID_REQUEST,
            format!(
                "Invalid request: the message nests arrays and objects {} levels deep, more than the {MAX_MESSAGE_DEPTH} this server accepts; flatten it",
                scan.depth()
            ),
        )
    }
}

/// How deeply `value` nests arrays and objects (a scalar is 0, `{}` and `[]` are 1), counted
/// without recursion.
pub fn nesting_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(value, 1)];
    while let Some((value, depth)) = pending.pop() {
        match value {
            Value::Array(items) => {
                deepest = deepest.max(depth);
                pending.extend(items.iter().map(|item| (item, depth + 1)));
            }
            Value::Object(members) => {
                deepest = deepest.max(depth);
                pending.extend(members.values().map(|item| (item, depth + 1)));
            }
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scan(text: &str) -> Scan {
        let mut scan = Scan::default();
        // Fed in small pieces, as a transport would.
        for chunk in text.as_bytes().chunks(3) {
            scan.feed(chunk);
        }
        scan
    }

    fn nested(depth: usize) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":"deep-1","method":"tools/call","params":{{"name":"t","arguments":{{"a":{}{}}}}}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    }

    #[test]
    fn the_scan_reads_id_method_and_depth() {
        let found = scan(
            r#" {"params": {"x": [1, {"id": 9}], "s": "}]\"{"}, "id" : 42 , "method":"tools/call"}"#,
        );
        assert_eq!(found.id(), Some(json!(42)));
        assert_eq!(found.method().as_deref(), Some("tools/call"));
        assert_eq!(found.depth(), 4);
        assert!(found.expects_answer());

        let string_id = scan("\u{feff}{\"id\":\"a\\\"b\",\"method\":\"ping\"}\r\n");
        assert_eq!(string_id.id(), Some(json!("a\"b")));
        assert_eq!(string_id.depth(), 1);

        let notification = scan(r#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#);
        assert_eq!(notification.id(), None);
        assert!(!notification.expects_answer());

        let response = scan(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#);
        assert!(!response.expects_answer());

        let object_id = scan(r#"{"id":{"x":1},"method":"ping"}"#);
        assert_eq!(object_id.id(), None);
        assert!(object_id.expects_answer());

        assert!(scan(" \r\n").is_blank());
        assert!(!scan("x").is_blank());
        assert!(scan("[1,2]").expects_answer());
    }

    #[test]
    fn a_deep_message_is_refused_with_its_id_and_without_recursion() {
        for depth in [MAX_MESSAGE_DEPTH, 200, 100_000] {
            let text = nested(depth);
            let refusal = admit(Some(text.as_bytes()), &scan(&text)).unwrap_err();
            assert_eq!(refusal.code, INVALID_PARAMS, "{refusal:?}");
            assert_eq!(refusal.id, Some(json!("deep-1")));
            assert!(
                refusal.message.contains(&format!(
                    "arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels"
                )),
                "{}",
                refusal.message
            );
        }
        // The deepest arguments accepted parse.
        let text = nested(MAX_ARGUMENT_DEPTH - 1);
        assert!(admit(Some(text.as_bytes()), &scan(&text)).is_ok());
    }

    #[test]
    fn invalid_json_is_a_parse_error_and_the_wrong_shape_an_invalid_request() {
        let garbage = "this is not json";
        let refusal = admit(Some(garbage.as_bytes()), &scan(garbage)).unwrap_err();
        assert_eq!(refusal.code, PARSE_ERROR);
        assert_eq!(
            refusal.reply().unwrap(),
            json!({"jsonrpc":"2.0","id":null,"error":{"code":PARSE_ERROR,"message":refusal.message}})
        );

        let broken = r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"x": tru}}"#;
        let refusal = admit(Some(broken.as_bytes()), &scan(broken)).unwrap_err();
        assert_eq!(refusal.code, PARSE_ERROR);
        assert_eq!(refusal.id, Some(json!(5)));

        let shape = r#"{"foo":"bar"}"#;
        let refusal = admit(Some(shape.as_bytes()), &scan(shape)).unwrap_err();
        assert_eq!(refusal.code, INVALID_REQUEST);

        let bad_notification =
            r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":7"#;
        let refusal =
            admit(Some(bad_notification.as_bytes()), &scan(bad_notification)).unwrap_err();
        assert_eq!(refusal.reply(), None, "a notification is never answered");
    }

    #[test]
    fn an_oversized_message_is_refused_with_the_id_seen_so_far() {
        let start = r#"{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"t","arguments":{"text":""#;
        let mut found = scan(start);
        found.feed(&vec![b'x'; MAX_MESSAGE_BYTES]);
        let refusal = admit(None, &found).unwrap_err();
        assert!(refusal.too_large);
        assert_eq!(refusal.code, INVALID_REQUEST);
        assert_eq!(refusal.id, Some(json!(77)));
        assert!(
            refusal.message.contains("smaller parts"),
            "{}",
            refusal.message
        );
    }

    #[test]
    fn nesting_depth_counts_levels() {
        assert_eq!(nesting_depth(&json!(1)), 0);
        assert_eq!(nesting_depth(&json!({})), 1);
        assert_eq!(nesting_depth(&json!({"a": [1, [2]], "b": {}})), 3);
    }
}

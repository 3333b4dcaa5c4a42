//! The context window a model server reports for the model it serves, asked when the
//! configuration does not give it: llama.cpp (`/v1/models` → `meta.n_ctx`; older builds `/props`
//! → `default_generation_settings.n_ctx`), vLLM (`/v1/models` → `max_model_len`), lists with a
//! `context_length` or `context_window` per model (OpenRouter, Groq), Ollama (`/api/show` →
//! `num_ctx` in `parameters`, else `model_info.<arch>.context_length`). Each server and model is
//! asked once per process ([`ServerWindow::window`]) and the whole question takes at most
//! [`PROBE_TIMEOUT`]: a server that does not answer, answers an error or something unreadable
//! costs that one short request, is not asked again, and never fails a turn (the window then
//! comes from the built-in table). Also the note a provider appends to an overflow error that
//! names the server's window (llama.cpp's `n_ctx`), read back by [`window_in_overflow_note`]
//! so the window is learned from the refusal too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};

use super::{ApiKey, HttpSettings, ProviderConfig, ProviderKind};

/// The longest the question to a server may take, all its requests together.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The largest answer read (OpenRouter's list of every model is a few MiB).
const MAX_ANSWER_BYTES: usize = 8 << 20;

/// Hosts whose model lists carry no window: their models are in the built-in table, so they are
/// not asked.
const SILENT_HOSTS: &[&str] = &["api.anthropic.com", "api.openai.com"];

/// Where to ask one server for one model's window.
#[derive(Clone)]
pub struct ServerWindow {
    kind: ProviderKind,
    base_url: String,
    model: String,
    api_key: Option<ApiKey>,
}

impl std::fmt::Debug for ServerWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerWindow")
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ServerWindow {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

/// What the process knows of one server's window: what it answered when asked, and what it
/// said when it refused a request as too long.
#[derive(Default)]
struct Known {
    answered: tokio::sync::OnceCell<Option<u64>>,
    /// 0: nothing learned from a refusal.
    refused_at: AtomicU64,
}

fn known(key: String) -> Arc<Known> {
    static KNOWN: OnceLock<Mutex<HashMap<String, Arc<Known>>>> = OnceLock::new();
    let mut map = KNOWN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    map.entry(key).or_default().clone()
}

impl ServerWindow {
    /// Ask the server at `base_url` (as the provider of `kind` is configured: an OpenAI-compatible
    /// base usually ends in `/v1`) about `model`.
    pub fn new(
        kind: ProviderKind,
        base_url: impl Into<String>,
        model: impl Into<String>,
        api_key: Option<ApiKey>,
    ) -> Self {
        Self {
            kind,
            base_url: base_url.into().trim_end_matches('/').to_string(),
            model: model.into(),
            api_key,
        }
    }

    /// Where to ask for the window of the model `config` talks to; `None` for the scripted
    /// provider and for the public APIs whose lists carry no window.
    pub fn for_config(config: &ProviderConfig) -> Option<Self> {
        let (kind, settings): (ProviderKind, &HttpSettings) = match config {
            ProviderConfig::Anthropic(settings) => (ProviderKind::Anthropic, settings),
            ProviderConfig::OpenAi(settings) => (ProviderKind::OpenAi, settings),
            ProviderConfig::Scripted(_) => return None,
        };
        let host = reqwest::Url::parse(&settings.base_url)
            .ok()?
            .host_str()?
            .to_ascii_lowercase();
        if SILENT_HOSTS.contains(&host.as_str()) {
            return None;
        }
        Some(Self::new(
            kind,
            &settings.base_url,
            &settings.model,
            settings.api_key.clone(),
        ))
    }

    /// The model asked about.
    pub fn model(&self) -> &str {
        &self.model
    }

    fn key(&self) -> String {
        format!("{} {} {}", self.kind.as_str(), self.base_url, self.model)
    }

    /// The window the server reports for the model: what it said when it refused a request as
    /// too long, else its answer to the question (asked once per process, at most
    /// [`PROBE_TIMEOUT`]); `None` when it says nothing readable.
    pub async fn window(&self) -> Option<u64> {
        let known = known(self.key());
        match known.refused_at.load(Ordering::Relaxed) {
            0 => *known.answered.get_or_init(|| self.ask()).await,
            window => Some(window),
        }
    }

    /// The window the server named when it refused a request (it holds for the whole process).
    pub fn learn(&self, window: u64) {
        known(self.key())
            .refused_at
            .store(window, Ordering::Relaxed);
    }

    async fn ask(&self) -> Option<u64> {
        let client = reqwest::Client::builder()
            .timeout(PROBE_TIMEOUT)
            .connect_timeout(PROBE_TIMEOUT)
            .user_agent(concat!("clawcage/", env!("CARGO_PKG_VERSION")))
            .build()
            .ok()?;
        match tokio::time::timeout(PROBE_TIMEOUT, self.ask_with(&client)).await {
            Ok(window) => {
                tracing::debug!(server = %self.base_url, model = %self.model, ?window, "asked the server for the context window");
                window
            }
            Err(_) => {
                tracing::debug!(server = %self.base_url, "the server did not say its context window in time");
                None
            }
        }
    }

    /// `/v1/models` first; llama.cpp's `/props` or Ollama's `/api/show` only when the list
    /// answered without a window.
    async fn ask_with(&self, client: &reqwest::Client) -> Option<u64> {
        let list = self.get_json(client.get(self.models_url())).await?;
        let entry = model_entry(&list, &self.model);
        if let Some(window) = entry.and_then(window_in_entry) {
            return Some(window);
        }
        let root = self.server_root();
        if entry.is_some_and(|entry| entry["owned_by"] == "llamacpp" || entry["meta"].is_object()) {
            let props = self.get_json(client.get(format!("{root}/props"))).await;
            return props
                .and_then(|props| positive(&props["default_generation_settings"]["n_ctx"]))
                .or_else(|| entry.and_then(|entry| positive(&entry["meta"]["n_ctx_train"])));
        }
        let show = client
            .post(format!("{root}/api/show"))
            .header("content-type", "application/json")
            .body(json!({"model": self.model, "name": self.model}).to_string());
        window_in_ollama_show(&self.get_json(show).await?)
    }

    /// `GET {models}`: the base plus `/models` for an OpenAI-compatible server (whose base ends
    /// in `/v1`), plus `/v1/models` for the Anthropic wire format.
    fn models_url(&self) -> String {
        match self.kind {
            ProviderKind::Anthropic => format!("{}/v1/models", self.base_url),
            _ => format!("{}/models", self.base_url),
        }
    }

    /// The server's root, where llama.cpp's `/props` and Ollama's `/api/show` are.
    fn server_root(&self) -> &str {
        match self.kind {
            ProviderKind::Anthropic => &self.base_url,
            _ => self.base_url.strip_suffix("/v1").unwrap_or(&self.base_url),
        }
    }

    async fn get_json(&self, request: reqwest::RequestBuilder) -> Option<Value> {
        let request = match (&self.api_key, self.kind) {
            (Some(key), ProviderKind::Anthropic) => request
                .header("x-api-key", key.expose())
                .header("anthropic-version", "2023-06-01"),
            (Some(key), _) => request.bearer_auth(key.expose()),
            (None, _) => request,
        };
        let mut response = request.send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.ok()? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return None;
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).ok()
    }
}

fn positive(value: &Value) -> Option<u64> {
    value.as_u64().filter(|window| *window > 0)
}

/// The entry of `model` in a `/v1/models` list (`data`, or llama.cpp's `models`), or the only
/// entry (llama.cpp serves one model whatever the request names).
fn model_entry<'a>(list: &'a Value, model: &str) -> Option<&'a Value> {
    let entries = list["data"].as_array()?;
    entries
        .iter()
        .find(|entry| entry["id"] == model)
        .or(match entries.as_slice() {
            [only] => Some(only),
            _ => None,
        })
}

/// The window in one model entry: vLLM's `max_model_len`, llama.cpp's `meta.n_ctx`, or a
/// `context_length` / `context_window` (OpenRouter, Groq).
fn window_in_entry(entry: &Value) -> Option<u64> {
    positive(&entry["max_model_len"])
        .or_else(|| positive(&entry["meta"]["n_ctx"]))
        .or_else(|| positive(&entry["context_length"]))
        .or_else(|| positive(&entry["context_window"]))
}

/// The window in Ollama's `/api/show` answer: `num_ctx` when the model's parameters set it
/// (what Ollama serves), else the model's own `<arch>.context_length`.
fn window_in_ollama_show(show: &Value) -> Option<u64> {
    let num_ctx = show["parameters"].as_str().and_then(|parameters| {
        parameters.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("num_ctx"))
                .then(|| words.next()?.parse::<u64>().ok())
                .flatten()
        })
    });
    num_ctx.filter(|window| *window > 0).or_else(|| {
        show["model_info"]
            .as_object()?
            .iter()
            .find_map(|(key, value)| {
                key.ends_with(".context_length")
                    .then(|| positive(value))
                    .flatten()
            })
    })
}

/// The words before the window in an overflow note.
const OVERFLOW_NOTE_WINDOW: &str = "the server's context window is ";

/// What a provider appends to an overflow error whose body names the server's window.
pub fn overflow_note(prompt_tokens: Option<u64>, window: u64) -> String {
    match prompt_tokens {
        Some(tokens) => {
            format!(" (the request has {tokens} tokens; {OVERFLOW_NOTE_WINDOW}{window} tokens)")
        }
        None => format!(" ({OVERFLOW_NOTE_WINDOW}{window} tokens)"),
    }
}

/// The window named in an error message by [`overflow_note`].
pub fn window_in_overflow_note(message: &str) -> Option<u64> {
    let (_, after) = message.split_once(OVERFLOW_NOTE_WINDOW)?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|window| *window > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_server_shape_gives_its_window() {
        let llama = json!({"object": "list", "data": [{"id": "smollm2.gguf", "owned_by": "llamacpp",
            "meta": {"n_ctx": 4096, "n_ctx_train": 8192}}]});
        assert_eq!(
            model_entry(&llama, "smollm2").and_then(window_in_entry),
            Some(4096)
        );
        let vllm = json!({"data": [{"id": "a", "max_model_len": 1}, {"id": "Qwen/Qwen2.5-7B", "max_model_len": 32768}]});
        assert_eq!(
            model_entry(&vllm, "Qwen/Qwen2.5-7B").and_then(window_in_entry),
            Some(32768)
        );
        // Several models and none of them the one asked about: no guess.
        assert_eq!(model_entry(&vllm, "other"), None);
        let ollama = json!({"parameters": "stop \"<|eot_id|>\"\nnum_ctx                        16384",
            "model_info": {"llama.context_length": 131072}});
        assert_eq!(window_in_ollama_show(&ollama), Some(16384));
        let ollama =
            json!({"model_info": {"general.architecture": "qwen2", "qwen2.context_length": 32768}});
        assert_eq!(window_in_ollama_show(&ollama), Some(32768));
        assert_eq!(window_in_ollama_show(&json!({"model_info": {}})), None);
        // Zero, negative, text: nothing.
        for bad in [json!(0), json!(-4096), json!("4096"), json!(null)] {
            assert_eq!(
                window_in_entry(&json!({"id": "m", "max_model_len": bad})),
                None
            );
        }
    }

    #[test]
    fn the_overflow_note_is_read_back() {
        let message = format!(
            "the request exceeds the available context size, try increasing it{}",
            overflow_note(Some(5000), 4096)
        );
        assert!(message.ends_with(
            "(the request has 5000 tokens; the server's context window is 4096 tokens)"
        ));
        assert_eq!(window_in_overflow_note(&message), Some(4096));
        assert_eq!(window_in_overflow_note("context length exceeded"), None);
        assert_eq!(
            window_in_overflow_note(&format!("x{}", overflow_note(None, 0))),
            None
        );
    }

    #[test]
    fn the_public_apis_are_not_asked() {
        let mut settings = HttpSettings::new("https://api.anthropic.com", "claude-sonnet-4-5");
        assert_eq!(
            ServerWindow::for_config(&ProviderConfig::Anthropic(settings.clone())),
            None
        );
        settings.base_url = "http://127.0.0.1:8080/v1/".into();
        let local = ServerWindow::for_config(&ProviderConfig::OpenAi(settings));
        let local = local.expect("a local server is asked");
        assert_eq!(local.models_url(), "http://127.0.0.1:8080/v1/models");
        assert_eq!(local.server_root(), "http://127.0.0.1:8080");
    }
}

//! clawcage's providers against a real llama.cpp `llama-server` serving SmolLM2-135M-Instruct
//! (both built or fetched once by `tests/llama/setup.sh` into `target/llama/`): plain and
//! streamed text in the OpenAI and the Anthropic wire formats, a reply cut at `max_tokens`, a
//! tool call plain and streamed (with llama.cpp's Qwen2.5 template) and one cut at `max_tokens`
//! that is never run, the context window read from the server, a context overflow compacted and
//! retried, and a wrong base path named with its URL and the flag to fix. Each test starts its own server on a free
//! port with `--temp 0` (the same answer each run) and stops it when it ends. Without the
//! server or the model a test is skipped with the reason printed; under CI (`CI=true`) it fails.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawcage_agent::agent_loop::TurnObserver;
use clawcage_agent::context::ModelWindow;
use clawcage_agent::provider::window::ServerWindow;
use clawcage_agent::provider::{
    self, ApiKey, ChatRequest, HttpSettings, NoEvents, ProviderConfig, ProviderError,
    ProviderEvents, ProviderKind, StopReason,
};
use clawcage_agent::{AgentConfig, AgentLoop, ContextPolicy, Provider, ToolRegistry, WindowSource};
use clawcage_core::{ChatMessage, ContentBlock, ToolOutput};
use clawcage_tests::host_tools::HostTool;
use clawcage_tests::llm_server::ChannelBody;
use clawcage_tests::toolchains::{repo_root, skip};

/// The files `tests/llama/setup.sh` makes.
struct LlamaFiles {
    server: PathBuf,
    model: PathBuf,
    /// The Qwen2.5 chat template from llama.cpp's source: SmolLM2's own has no tool calls.
    tool_template: PathBuf,
}

/// The server and the model, or the reason they are missing (the test is then skipped, or
/// fails under CI).
fn llama_files(test: &str) -> Option<LlamaFiles> {
    let dir = std::env::var_os("CLAWCAGE_LLAMA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target").join("llama"));
    let files = LlamaFiles {
        server: dir.join("llama-server"),
        model: dir.join("SmolLM2-135M-Instruct.Q4_1.gguf"),
        tool_template: dir.join("qwen2.5.jinja"),
    };
    for path in [&files.server, &files.model, &files.tool_template] {
        if !path.is_file() {
            skip(
                test,
                &format!(
                    "{} is missing; run `just llama-setup` (bash tests/llama/setup.sh) to build it",
                    path.display()
                ),
            );
            return None;
        }
    }
    Some(files)
}

/// A running `llama-server`; stopped (killed and reaped) when dropped.
struct LlamaServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LlamaServer {
    /// Start the server with a context of `context` tokens and the model's own chat template,
    /// and wait until `/health` answers.
    async fn start(files: &LlamaFiles, context: u32) -> LlamaServer {
        Self::start_with(files, context, &[]).await
    }

    /// Like [`LlamaServer::start`], with `extra` arguments for the server.
    async fn start_with(
        files: &LlamaFiles,
        context: u32,
        extra: &[&std::ffi::OsStr],
    ) -> LlamaServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let log = std::env::temp_dir().join(format!("clawcage-llama-server-{port}.log"));
        let log_file = std::fs::File::create(&log).expect("the server's log file");
        let child = Command::new(&files.server)
            .arg("-m")
            .arg(&files.model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--jinja", "-c", &context.to_string(), "--parallel", "1"])
            .args(["--temp", "0", "--threads", "2"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("the log file"))
            .stderr(log_file)
            .spawn()
            .expect("start llama-server");
        let mut server = LlamaServer { child, port, log };
        server.wait_until_healthy().await;
        server
    }

    async fn wait_until_healthy(&mut self) {
        let client = reqwest::Client::new();
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "llama-server exited ({status}) before it was ready:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            let health = client
                .get(format!("{}/health", self.root()))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if health.is_ok_and(|response| response.status().is_success()) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "llama-server did not become ready in 120 s; its log: {}",
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `http://127.0.0.1:PORT`: the Anthropic provider's base URL.
    fn root(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:PORT/v1`: the OpenAI-compatible provider's base URL.
    fn v1(&self) -> String {
        format!("{}/v1", self.root())
    }

    fn settings(&self, kind: ProviderKind, max_tokens: u32) -> HttpSettings {
        let base = match kind {
            ProviderKind::Anthropic => self.root(),
            _ => self.v1(),
        };
        let mut settings = HttpSettings::new(base, "smollm2");
        settings.max_tokens = max_tokens;
        settings.timeout = Duration::from_secs(120);
        // The Anthropic provider needs a key; llama-server takes any.
        settings.api_key = Some(ApiKey::new("unused"));
        settings
    }

    fn provider(&self, kind: ProviderKind, max_tokens: u32) -> Arc<dyn Provider> {
        let settings = self.settings(kind, max_tokens);
        let config = match kind {
            ProviderKind::Anthropic => ProviderConfig::Anthropic(settings),
            _ => ProviderConfig::OpenAi(settings),
        };
        provider::build(config, &[]).expect("a provider")
    }
}

/// Records streamed text and notes.
#[derive(Default)]
struct Heard {
    text: Mutex<String>,
    notes: Mutex<Vec<String>>,
}

impl ProviderEvents for Heard {
    fn text_delta(&self, text: &str) {
        self.text.lock().unwrap().push_str(text);
    }
}

impl TurnObserver for Heard {
    fn note(&self, text: &str) {
        self.notes.lock().unwrap().push(text.to_string());
    }
}

async fn ask(
    provider: &dyn Provider,
    text: &str,
    stream: bool,
    events: &dyn ProviderEvents,
) -> Result<provider::ChatResponse, ProviderError> {
    ask_with_tools(
        provider,
        &[ChatMessage::user(text)],
        &ToolRegistry::new(),
        stream,
        events,
    )
    .await
}

/// One request of `messages` offering `tools`, under the tests' system prompt.
async fn ask_with_tools(
    provider: &dyn Provider,
    messages: &[ChatMessage],
    tools: &ToolRegistry,
    stream: bool,
    events: &dyn ProviderEvents,
) -> Result<provider::ChatResponse, ProviderError> {
    provider
        .complete(
            ChatRequest {
                system: "You are a helpful assistant.",
                messages,
                tools,
                stream,
                max_tokens: None,
            },
            events,
        )
        .await
}

fn answer_text(response: &provider::ChatResponse) -> String {
    response
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_streamed_text_in_both_wire_formats_and_a_reply_cut_at_max_tokens() {
    let test = "llama_server::plain_and_streamed_text";
    let Some(files) = llama_files(test) else {
        return;
    };
    let server = LlamaServer::start(&files, 4096).await;
    for kind in [ProviderKind::OpenAi, ProviderKind::Anthropic] {
        let provider = server.provider(kind, 48);
        let whole = ask(provider.as_ref(), "Say hi.", false, &NoEvents)
            .await
            .unwrap_or_else(|error| panic!("{kind:?}: {error}"));
        let text = answer_text(&whole);
        assert!(!text.trim().is_empty(), "{kind:?}: {whole:?}");
        assert!(
            whole.usage.input_tokens > 0 && whole.usage.output_tokens > 0,
            "{whole:?}"
        );
        assert!(
            matches!(
                whole.stop_reason,
                StopReason::EndTurn | StopReason::MaxTokens
            ),
            "{whole:?}"
        );
        // Streamed, the same request gives the same answer (temperature 0), delta by delta.
        let heard = Heard::default();
        let streamed = ask(provider.as_ref(), "Say hi.", true, &heard)
            .await
            .unwrap_or_else(|error| panic!("{kind:?} streamed: {error}"));
        assert_eq!(answer_text(&streamed), text, "{kind:?}");
        assert_eq!(*heard.text.lock().unwrap(), text, "{kind:?}");
        assert!(streamed.usage.output_tokens > 0, "{streamed:?}");

        // Four tokens: the server stops the reply, and clawcage knows it was cut.
        let short = server.provider(kind, 4);
        let cut = ask(
            short.as_ref(),
            "Tell me a long story about a dragon.",
            true,
            &NoEvents,
        )
        .await
        .unwrap_or_else(|error| panic!("{kind:?} cut: {error}"));
        assert_eq!(cut.stop_reason, StopReason::MaxTokens, "{kind:?}: {cut:?}");
        assert!(cut.usage.output_tokens <= 4, "{cut:?}");
    }
    // Through the agent loop the cut answer is said to be cut.
    let agent = AgentLoop::new(
        server.provider(ProviderKind::OpenAi, 4),
        ToolRegistry::new(),
        AgentConfig::default(),
    );
    let heard = Heard::default();
    agent
        .run_turn(
            &mut vec![ChatMessage::user("Tell me a long story about a dragon.")],
            &heard,
        )
        .await
        .unwrap();
    let notes = heard.notes.lock().unwrap().clone();
    assert!(
        notes.iter().any(|note| note.contains("output-token limit")),
        "{notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_is_read_from_the_server_and_bounds_max_tokens() {
    let test = "llama_server::the_window_is_read_from_the_server";
    let Some(files) = llama_files(test) else {
        return;
    };
    let server = LlamaServer::start(&files, 4096).await;
    // Both wire formats' base URLs lead to the server's answer.
    for (kind, base) in [
        (ProviderKind::OpenAi, server.v1()),
        (ProviderKind::Anthropic, server.root()),
    ] {
        let asked = ServerWindow::new(kind, base, "smollm2", None);
        assert_eq!(asked.window().await, Some(4096), "{kind:?}");
    }
    // An agent whose configuration gives no window: the first model call asks the server, and
    // the reply's max_tokens (8192 configured) is bounded by the 4096 the server has.
    let asked = ServerWindow::new(ProviderKind::OpenAi, server.v1(), "smollm2", None);
    let policy =
        ContextPolicy::for_models(vec![ModelWindow::new("smollm2", None, Some(asked))], 8192)
            .unwrap();
    let agent = AgentLoop::new(
        server.provider(ProviderKind::OpenAi, 8192),
        ToolRegistry::new(),
        AgentConfig::default(),
    )
    .with_context(policy);
    let outcome = agent
        .run_turn(&mut vec![ChatMessage::user("Say hi.")], &NoEvents)
        .await
        .unwrap();
    assert!(!outcome.text.trim().is_empty());
    let policy = agent.context_policy().unwrap();
    assert_eq!(
        (policy.window, policy.window_source),
        (4096, WindowSource::Server)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_overflow_is_compacted_and_retried() {
    let test = "llama_server::a_context_overflow_is_compacted_and_retried";
    let Some(files) = llama_files(test) else {
        return;
    };
    // A small window keeps the summary request short, and the test fast.
    let server = LlamaServer::start(&files, 1024).await;
    // No window configured and the server not asked: clawcage assumes 32k, and learns the
    // server's from its refusal.
    let policy =
        ContextPolicy::for_models(vec![ModelWindow::new("smollm2", None, None)], 48).unwrap();
    let agent = AgentLoop::new(
        server.provider(ProviderKind::OpenAi, 48),
        ToolRegistry::new(),
        AgentConfig::default(),
    )
    .with_context(policy);
    let mut history = Vec::new();
    for turn in 1..=8 {
        history.push(ChatMessage::user(format!(
            "Note {turn}: the garden has {turn} apple trees, and {}",
            "the weather was calm and sunny all through the long summer afternoon. ".repeat(12)
        )));
        history.push(ChatMessage::assistant(format!("Noted, {turn} trees.")));
    }
    history.push(ChatMessage::user("How many apple trees were in note 8?"));
    let heard = Heard::default();
    let outcome = agent.run_turn(&mut history, &heard).await.unwrap();
    assert!(!outcome.text.trim().is_empty(), "{outcome:?}");
    let notes = heard.notes.lock().unwrap().clone();
    assert!(
        notes
            .iter()
            .any(|note| note.contains("compacting it and trying once more")),
        "{notes:?}"
    );
    let policy = agent.context_policy().unwrap();
    assert_eq!(
        (policy.window, policy.window_source),
        (1024, WindowSource::Server)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_base_path_is_named_with_its_url_and_the_flag() {
    let test = "llama_server::a_wrong_base_path_is_named_with_its_url_and_the_flag";
    let Some(files) = llama_files(test) else {
        return;
    };
    let server = LlamaServer::start(&files, 4096).await;
    let mut settings = server.settings(ProviderKind::OpenAi, 16);
    settings.base_url = format!("{}/api", server.root());
    let provider = provider::build(ProviderConfig::OpenAi(settings), &[]).unwrap();
    let error = ask(provider.as_ref(), "Say hi.", false, &NoEvents)
        .await
        .unwrap_err()
        .to_string();
    let url = format!("{}/api/chat/completions", server.root());
    assert!(error.contains(&url), "{error}");
    assert!(error.contains("--base-url"), "{error}");
    assert!(error.chars().count() < 600, "{error}");
}

/// A proxy in front of llama-server that makes the 135M model call a tool, and relays the answer
/// chunk by chunk as the server writes it, so the tool-call chunks the provider reads are the
/// server's own. To each chat request it adds `"tool_choice": "required"` (llama.cpp then holds
/// the reply to its tool-call grammar, which still lets text come first), the call's opening tag
/// `<tool_call>` as the start of the reply (an assistant message the server continues), one call
/// only, and a stop at the closing tag (the grammar allows calls without end). Stops when dropped.
struct ForcingProxy {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ForcingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ForcingProxy {
    async fn start(upstream: String) -> ForcingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        let client = reqwest::Client::new();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let client = client.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let client = client.clone();
                        let upstream = upstream.clone();
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                forward_forcing_a_call(&client, &upstream, request).await,
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        ForcingProxy { url, task }
    }
}

async fn forward_forcing_a_call(
    client: &reqwest::Client,
    upstream: &str,
    request: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<ChannelBody> {
    use http_body_util::BodyExt;
    let path = request
        .uri()
        .path_and_query()
        .map(|path| path.as_str().to_string())
        .unwrap_or_default();
    let method = request.method().clone();
    let body = request
        .into_body()
        .collect()
        .await
        .expect("the request body")
        .to_bytes();
    let body = if path.ends_with("/chat/completions") {
        let mut json: serde_json::Value =
            serde_json::from_slice(&body).expect("a JSON chat request");
        json["tool_choice"] = serde_json::json!("required");
        json["parallel_tool_calls"] = serde_json::json!(false);
        json["stop"] = serde_json::json!(["</tool_call>"]);
        json["messages"]
            .as_array_mut()
            .expect("the request's messages")
            .push(serde_json::json!({"role": "assistant", "content": "<tool_call>\n"}));
        json.to_string().into_bytes()
    } else {
        body.to_vec()
    };
    let mut answer = client
        .request(method, format!("{upstream}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("llama-server answers the proxy");
    let mut response = hyper::Response::builder().status(answer.status().as_u16());
    if let Some(kind) = answer.headers().get("content-type") {
        response = response.header("content-type", kind.as_bytes());
    }
    let (sender, body) = ChannelBody::new();
    tokio::spawn(async move {
        while let Ok(Some(chunk)) = answer.chunk().await {
            if sender.send(chunk).await.is_err() {
                return;
            }
        }
    });
    response.body(body).expect("a valid response")
}

/// The tool the model is made to call. Its argument is optional, so that the `{}` the provider
/// repairs a cut call's `{` into would be valid: only the cut itself keeps it from running.
fn weather_tool() -> Arc<HostTool> {
    HostTool::new(
        "get_weather",
        "Get the current weather in a city.",
        serde_json::json!({
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
        }),
        |_| Ok(ToolOutput::text("sunny, 21 °C")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_comes_back_whole_plain_and_streamed_and_a_cut_one_is_never_run() {
    let test = "llama_server::a_tool_call_comes_back_whole";
    let Some(files) = llama_files(test) else {
        return;
    };
    let template = files.tool_template.clone();
    let server = LlamaServer::start_with(
        &files,
        4096,
        &["--chat-template-file".as_ref(), template.as_os_str()],
    )
    .await;
    let proxy = ForcingProxy::start(server.root()).await;
    let tool = weather_tool();
    let mut tools = ToolRegistry::new();
    tools.register(tool.clone()).expect("one tool");
    let provider_with = |max_tokens: u32| {
        let mut settings = server.settings(ProviderKind::OpenAi, max_tokens);
        settings.base_url = format!("{}/v1", proxy.url);
        provider::build(ProviderConfig::OpenAi(settings), &tools.names()).expect("a provider")
    };
    let provider = provider_with(256);
    let messages = [ChatMessage::user("What is the weather in Paris?")];
    let mut calls = Vec::new();
    for stream in [false, true] {
        let heard = Heard::default();
        let response = ask_with_tools(provider.as_ref(), &messages, &tools, stream, &heard)
            .await
            .unwrap_or_else(|error| panic!("stream {stream}: {error}"));
        assert_eq!(
            response.stop_reason,
            StopReason::ToolUse,
            "stream {stream}: {response:?}"
        );
        assert!(response.malformed.is_empty(), "{response:?}");
        let (id, name, input) = response
            .content
            .iter()
            .find_map(|block| match block {
                ContentBlock::ToolUse { id, name, input } => Some((id, name, input)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("stream {stream}: no tool call in {response:?}"));
        assert!(!id.is_empty(), "{response:?}");
        assert_eq!(name, "get_weather", "{response:?}");
        assert!(
            input.get("city").is_some_and(serde_json::Value::is_string),
            "stream {stream}: {input}"
        );
        calls.push(input.clone());
    }
    // Temperature 0: the call streamed chunk by chunk is the call answered whole.
    assert_eq!(calls[0], calls[1]);

    // Cut at 12 output tokens the server sends the call with its arguments cut to `{`, which
    // the provider would repair into a valid `{}`: the agent loop runs neither this call nor the
    // next model call's, and tells the model why the first was not run.
    let agent = AgentLoop::new(
        provider_with(12),
        tools.clone(),
        AgentConfig {
            max_iterations: 2,
            ..AgentConfig::default()
        },
    );
    let mut history = messages.to_vec();
    let outcome = agent.run_turn(&mut history, &NoEvents).await;
    assert_eq!(tool.calls(), 0, "{outcome:?} {history:?}");
    let first_call = history
        .iter()
        .find(|message| message.tool_uses().next().is_some())
        .unwrap_or_else(|| panic!("no tool call in {history:?}"));
    assert_eq!(
        first_call.cut,
        Some(clawcage_core::Cut::MaxTokens),
        "{history:?}"
    );
    let first_result = history
        .iter()
        .flat_map(|message| &message.content)
        .find_map(|block| match block {
            ContentBlock::ToolResult { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool result in {history:?}"));
    assert_eq!(
        first_result,
        clawcage_agent::agent_loop::CUT_AT_OUTPUT_LIMIT,
        "{history:?}"
    );
}

//! The clawcage gateway: one long-running process that owns the sessions (their lanes,
//! transcripts and event logs), cron, the sub-agents and the audit log, and serves them over one
//! WebSocket protocol (`docs/gateway-protocol.md`) to every front end — the web chat it serves
//! at `/`, terminals, channels. It is a front end over `clawcage-runtime` like `chat`: it asks
//! the runtime for an agent and renders the agent's events as WebSocket frames; it holds no agent
//! logic. Its own crate because only it needs the WebSocket stack.

pub mod approvals;
mod args;
mod auth;
pub mod channels;
pub mod client;
pub mod cluster;
mod connection;
mod forward;
mod http;
pub mod hub;
mod keys;
pub mod limits;
mod methods;
pub mod protocol;
mod relay;
mod status;
pub use relay::relay_clients;
mod stores;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use clawcage_agent::events::{AgentEvent, DiskEventLog, Stream};
use clawcage_agent::{JsonlTranscripts, OutboundMessage, SendCallback, StateDir};
use clawcage_core::BoxFuture;
use clawcage_core::scheduler::Scheduler;
use clawcage_runtime::cluster_config::ServeMode;
use clawcage_runtime::{AgentOptions, CronStatus, Error, Lifetime, Options, Runtime};

use clawcage_agent::runs::InMemoryRuns;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use args::connection_limits;
pub use args::{GatewayArgs, GatewayCommand};
pub use auth::{Token, is_loopback_host};
pub use channels::pairing::{PairingArgs, PairingCommand};
pub use client::{Client, ClientError};
pub use hub::{GatewayParts, Hub};
pub use keys::{check_key, is_gateway_key};

/// The default address: loopback, OpenClaw's port.
pub const DEFAULT_BIND: &str = "127.0.0.1:18789";

/// The largest frame a client may send, in bytes.
pub const MAX_FRAME_BYTES: usize = 256 << 10;

/// Frames queued to one connection at most before it counts as too slow.
pub const SEND_QUEUE_FRAMES: usize = 4096;

/// How long a shutdown waits for running turns to stop.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How the gateway treats its clients.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The token every connection must present.
    pub token: Token,
    /// Origins besides the page's own that may connect.
    pub allowed_origins: Vec<String>,
    /// Whether the listener is on loopback (then only loopback `Host` names are served).
    pub loopback: bool,
    /// `chat.send` and `agent` requests per minute and connection.
    pub sends_per_minute: u32,
    /// The largest frame accepted.
    pub max_frame_bytes: usize,
    /// Frames queued per connection before it is cut off.
    pub send_queue: usize,
    /// How often `tick` events go out.
    pub tick_interval: Duration,
    /// How many connections are held, and how long one may stay without the token.
    pub limits: limits::Limits,
}

impl Settings {
    /// The defaults with `token`.
    pub fn new(token: Token) -> Self {
        Self {
            token,
            allowed_origins: Vec::new(),
            loopback: true,
            sends_per_minute: 30,
            max_frame_bytes: MAX_FRAME_BYTES,
            send_queue: SEND_QUEUE_FRAMES,
            tick_interval: Duration::from_secs(30),
            limits: limits::Limits::for_this_process(),
        }
    }
}

/// A gateway: the hub and how it treats clients.
pub struct Gateway {
    /// The sessions, runs and connections.
    pub hub: Arc<Hub>,
    /// How clients are treated.
    pub settings: Settings,
    /// The channels (Telegram, webhooks), once started.
    pub channels: OnceLock<Arc<channels::Channels>>,
    /// Approvals, when the runtime's policy may ask: approver connections are its operators.
    pub approvals: OnceLock<Arc<approvals::Approvals>>,
    /// The connections, counted against `settings.limits`.
    pub admissions: Arc<limits::Admissions>,
    /// Who serves each partition, when the hosts of a cluster serve partitions: requests about
    /// another host's sessions are forwarded there.
    pub(crate) owners: OnceLock<Arc<forward::Owners>>,
}

impl Gateway {
    /// A gateway over `parts`; takes up what a stopped gateway left (see [`Hub::start`]).
    pub async fn start(parts: GatewayParts, settings: Settings) -> Arc<Self> {
        Arc::new(Self {
            hub: Hub::start(parts).await,
            admissions: limits::Admissions::new(settings.limits.clone(), settings.loopback),
            settings,
            channels: OnceLock::new(),
            approvals: OnceLock::new(),
            owners: OnceLock::new(),
        })
    }

    /// The `hello-ok` payload for connection `id`.
    pub fn hello(&self, id: u64) -> Value {
        json!({
            "type": "hello-ok",
            "protocol": protocol::PROTOCOL_VERSION,
            "server": {
                "name": "clawcage",
                "version": env!("CARGO_PKG_VERSION"),
                "connId": id.to_string(),
            },
            "features": {"methods": protocol::METHODS, "events": protocol::EVENTS},
            "policy": {
                "maxPayload": self.settings.max_frame_bytes,
                "maxBufferedFrames": self.settings.send_queue,
                "tickIntervalMs": self.settings.tick_interval.as_millis() as u64,
                "sendsPerMinute": self.settings.sends_per_minute,
                "replayPage": hub::REPLAY_PAGE,
            },
        })
    }

    /// The `status` payload.
    pub fn status(&self) -> Value {
        let parts = &self.hub.parts;
        let (running, queued) = self.hub.load();
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "protocol": protocol::PROTOCOL_VERSION,
            "uptimeMs": self.hub.started.elapsed().as_millis() as u64,
            "model": parts.label,
            "workspace": parts.workspace,
            "stateDir": parts.state_dir.display().to_string(),
            "connections": self.hub.connection_count(),
            "sessions": self.hub.session_count(),
            "runsInFlight": running,
            "runsQueued": queued,
            "tools": parts.tools.names(),
            "cron": if parts.cron.is_some() { "running".to_string() } else { parts.cron_note.clone() },
            "subagentsRunning": parts.subagents.as_ref().map_or(0, |manager| manager.running()),
            "channels": self.channels.get().map(|channels| channels.status()),
        })
    }

    /// Serves `listener` until `shutdown` is cancelled, then shuts down gracefully: stops
    /// accepting, aborts the runs (messages kept), syncs the events, tells the clients.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: CancellationToken) {
        // What was appended is made durable once a second (a killed process loses nothing
        // written; this covers a crash of the machine).
        let syncer = {
            let events = self.hub.parts.events.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_secs(1));
                loop {
                    every.tick().await;
                    if let Err(error) = events.sync().await {
                        tracing::warn!(%error, "cannot sync the event log");
                    }
                }
            })
        };
        let accepting = CancellationToken::new();
        let acceptor = tokio::spawn(http::accept_loop(
            http::Front::Active(self.clone()),
            listener,
            accepting.clone(),
        ));
        shutdown.cancelled().await;
        accepting.cancel();
        let _ = acceptor.await;
        self.hub.shut_down(SHUTDOWN_GRACE).await;
        syncer.abort();
        // Let the connections send their close frames.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while self.hub.connection_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The token a gateway on `state_dir` generated (`<state-dir>/gateway/token`), for clients on
/// the same machine. Says what to do when there is none.
pub fn saved_token(state_dir: &Path) -> Result<String, Error> {
    let file = StateDir::new(state_dir).gateway_token();
    match std::fs::read_to_string(&file) {
        Ok(text) if !text.trim().is_empty() => Ok(text.trim().to_string()),
        Ok(_) => Err(Error::Usage(format!(
            "the gateway token file {} is empty; pass --token",
            file.display()
        ))),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(Error::Usage(format!(
            "no gateway token in {}: pass --token (the one the gateway was started with), or use the --state-dir of the gateway, which saves its token there on its first start",
            file.display()
        ))),
        Err(error) => Err(Error::Usage(format!(
            "cannot read the gateway token {}: {error}; pass --token",
            file.display()
        ))),
    }
}

/// Takes the state directory's gateway lock: `Ok(None)` when another process holds it.
fn take_lock(state_dir: &Path) -> Result<Option<std::fs::File>, Error> {
    let path = StateDir::new(state_dir).gateway_lock();
    let cannot = |error: std::io::Error| {
        Error::Usage(format!(
            "cannot open the gateway lock {}: {error}; check --state-dir",
            path.display()
        ))
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(cannot)?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(cannot)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(error)) => Err(cannot(error)),
    }
}

/// The web address of the gateway running on `state_dir`, if one runs.
pub fn running_gateway(state_dir: &Path) -> Option<String> {
    if StateDir::new(state_dir).gateway_lock().exists() && matches!(take_lock(state_dir), Ok(None))
    {
        running_info(state_dir)
            .and_then(|info| info.get("url").and_then(Value::as_str).map(str::to_string))
    } else {
        None
    }
}

fn running_info(state_dir: &Path) -> Option<Value> {
    std::fs::read(StateDir::new(state_dir).gateway_info())
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
}

/// `clawcage gateway [status]`.
pub async fn run(options: Options, args: GatewayArgs) -> Result<(), Error> {
    let state_dir = clawcage_runtime::state_dir(options.state_dir.as_deref())?;
    if matches!(args.command, Some(GatewayCommand::Status)) {
        return status::status(&state_dir);
    }
    let Some(lock) = take_lock(&state_dir)? else {
        let at = running_info(&state_dir)
            .and_then(|info| info.get("url").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| "an unknown address".to_string());
        return Err(Error::Usage(format!(
            "a gateway already runs on the state directory {} (at {at}); stop it first, or pass another --state-dir",
            state_dir.display()
        )));
    };
    let token = auth::resolve_token(args.token.as_deref(), args.bind, &state_dir)?;
    let connection_limits = connection_limits(&args)?;
    // A missing API key is said before the tools are loaded (a first start compiles).
    clawcage_runtime::check_provider(&options)?;

    let mut runtime = Runtime::open(options).await?;
    for refused in &runtime.plugins().refused {
        clawcage_runtime::tell!("clawcage: {refused}");
    }
    for warning in &runtime.plugins().warnings {
        clawcage_runtime::tell!("clawcage: warning: {warning}");
    }
    // In a cluster, the sessions live on NATS JetStream and one host serves at a time: this one
    // waits as a standby until it is the active gateway.
    let config_dir = runtime
        .config_source()
        .and_then(|source| source.path.parent())
        .map(Path::to_path_buf);
    let cluster_settings = runtime
        .config()
        .cluster
        .settings(config_dir.as_deref())
        .map_err(|error| Error::Usage(format!("{error:#}")))?;
    let listener = TcpListener::bind(args.bind).await.map_err(|error| {
        Error::Usage(format!(
            "cannot listen on {}: {error}; pick another address with --bind (port 0 picks a free port)",
            args.bind
        ))
    })?;
    let bound = listener
        .local_addr()
        .map_err(|error| Error::Failed(format!("cannot read the listening address: {error}")))?;
    let mut settings = Settings::new(token.clone());
    settings.allowed_origins = args.allow_origins.clone();
    settings.loopback = bound.ip().is_loopback();
    settings.sends_per_minute = args.sends_per_minute.max(1);
    settings.limits = connection_limits;
    let url = format!("http://{bound}/");
    // A standby listens all the same and relays its clients to the active gateway until it
    // takes over: any host of the cluster accepts any client.
    let serving_partitions = cluster_settings
        .as_ref()
        .is_some_and(|settings| settings.serve == ServeMode::Partitions);
    let mut partitioned = None;
    let (active, listener) = match &cluster_settings {
        // Every host serves its share of the partitions at once: no standby, no relay.
        Some(cluster_settings) if serving_partitions => {
            let (active, keeper) = cluster::join_partitions(
                cluster_settings,
                runtime.workspace().path(),
                runtime.redactor().clone(),
                cluster_settings
                    .advertise_url
                    .clone()
                    .unwrap_or_else(|| url.clone()),
            )
            .await?;
            partitioned = Some(keeper);
            (Some(active), listener)
        }
        Some(cluster_settings) => {
            let (active, listener) = cluster::join_relaying(
                cluster_settings,
                &runtime,
                listener,
                settings.clone(),
                &url,
            )
            .await?;
            (Some(active), listener)
        }
        None => (None, listener),
    };

    // In a cluster, the allow-always approvals are the ones every host shares.
    if let (Some(active), Some(store)) = (&active, runtime.approvals().store()) {
        store.share_in(Arc::new(
            active
                .records
                .record(clawcage_cluster::records::APPROVALS_RECORD),
        ));
    }

    // The `message` tool posts into the session whose turn calls it.
    let hub_cell: Arc<OnceLock<Weak<Hub>>> = Arc::new(OnceLock::new());
    let channels_cell: Arc<OnceLock<Weak<channels::Channels>>> = Arc::new(OnceLock::new());
    let mut agent = runtime
        .host(
            Lifetime::LongRunning,
            AgentOptions {
                stores: active.as_ref().map(|active| active.stores.clone()),
                ..AgentOptions::new(message_sender(hub_cell.clone(), channels_cell.clone()))
            },
        )
        .await?;
    let cron_note = match agent.cron_status() {
        CronStatus::Owned => String::new(),
        CronStatus::OwnedElsewhere(dir) | CronStatus::Managed(dir) => {
            let note = format!(
                "another clawcage process (a chat) fires the cron jobs of {}",
                dir.display()
            );
            clawcage_runtime::tell!("note: {note}; this gateway's cron tool changes them there");
            note
        }
        CronStatus::Disabled => "[cron] enabled = false".to_string(),
    };
    let state = runtime.state_dir().clone();
    let parts = GatewayParts {
        sessions: agent.sessions.clone(),
        tools: agent.tools.clone(),
        bus: agent.bus.clone(),
        subagents: agent.subagents.clone(),
        cron: agent.cron().map(|cron| cron.clone() as Arc<dyn Scheduler>),
        cron_note,
        transcripts: agent
            .sessions
            .transcripts()
            .cloned()
            .unwrap_or_else(|| JsonlTranscripts::new(state.sessions()).shared()),
        events: Arc::new(stores::LoggedEvents(match &active {
            Some(active) => active.cluster.event_log(),
            None => Arc::new(DiskEventLog::new(state.gateway_events())),
        })),
        epoch: match &active {
            Some(active) => active.epoch,
            None => stores::next_epoch(&state.gateway())?,
        },
        runs: match &active {
            Some(active) => active.cluster.run_registry(),
            None => Arc::new(InMemoryRuns::default()),
        },
        runs_dir: state.gateway_runs(),
        history_limit: runtime.history_limit(),
        label: agent.label.clone(),
        workspace: runtime.workspace().path().display().to_string(),
        state_dir: state.to_path_buf(),
        shared_records: active.as_ref().map(|active| active.records.clone()),
        partitions: partitioned
            .as_ref()
            .map(|keeper: &cluster::Partitioned| keeper.partitions.clone()),
        write_fences: active.as_ref().map(|active| active.fences.clone()),
    };
    let gateway = Gateway::start(parts, settings).await;
    let _ = hub_cell.set(Arc::downgrade(&gateway.hub));
    // The Telegram poller, when the hosts serve partitions: the one host holding its lease.
    let poller_lease =
        partitioned
            .as_ref()
            .zip(cluster_settings.as_ref())
            .map(|(keeper, settings)| {
                (
                    keeper.leases.clone(),
                    Duration::from_secs(settings.lease_secs),
                )
            });
    // The partitions are taken up as the keeper gains them, from now on.
    let ownership = partitioned.map(|keeper| {
        let _ = gateway.owners.set(forward::Owners::new(
            keeper.leases.clone(),
            keeper.me.clone(),
        ));
        tokio::spawn(cluster::serve_partitions(
            gateway.hub.clone(),
            keeper.changes,
            keeper.partitions,
        ));
        keeper.ownership
    });
    // Always: even with the configuration's policy off, a session may set its own.
    let _ = gateway
        .approvals
        .set(approvals::Approvals::new(runtime.approvals().clone()));
    // Sub-agent results and cron firings become runs of their sessions; cron firings go into
    // their sessions' inboxes exactly once. Started only now, so none goes past the hub.
    let firings = gateway.hub.firing_sink();
    agent.start(gateway.hub.clone(), Some(firings));
    let shutdown = CancellationToken::new();
    if runtime.channels().any() {
        let started = channels::Channels::start(
            gateway.hub.clone(),
            runtime.channels(),
            runtime.http_post(),
            Some(runtime.approvals().clone()),
            shutdown.clone(),
            gateway
                .owners
                .get()
                .map(|_| forward::HostClient::new(&gateway)),
            poller_lease,
        )?;
        let _ = channels_cell.set(Arc::downgrade(&started));
        let _ = gateway.channels.set(started);
    }

    let info = json!({
        "pid": std::process::id(),
        "url": url,
        "ws": format!("ws://{bound}{}", http::WS_PATH),
        "bind": bound.to_string(),
        "startedMs": clawcage_agent::transcript::now_ms(),
        "version": env!("CARGO_PKG_VERSION"),
    });
    if let Err(error) = clawcage_core::files::write_atomically(
        &state.gateway_info(),
        info.to_string().as_bytes(),
        true,
    ) {
        tracing::warn!(%error, "cannot record where the gateway listens");
    }
    println!(
        "clawcage gateway: {} · {} tools · state {}",
        agent.label,
        agent.tools.names().len(),
        state.display()
    );
    if agent.scripted {
        println!("note: the answers come from a recorded script, not from a model");
    }
    match &active {
        Some(active) if serving_partitions => println!(
            "cluster: this host ({}) serves its share of the sessions' partitions beside the other hosts; the sessions live on NATS JetStream",
            active.me.host
        ),
        Some(active) => println!(
            "cluster: this host ({}) is the active gateway (epoch {}); the sessions live on NATS JetStream",
            active.me.host, active.epoch
        ),
        None => {}
    }
    // The operator's own terminal: the address ready to open, token included when it can be
    // read from its file.
    match (&token.file, token.generated) {
        (Some(file), true) => println!(
            "open {url}#token={}\n  (the token was generated and saved in {})",
            token.value(),
            file.display()
        ),
        (Some(file), false) => match saved_token(&state) {
            Ok(saved) if saved == token.value() => {
                println!(
                    "open {url}#token={saved}\n  (the token is kept in {})",
                    file.display()
                )
            }
            _ => println!("open {url}#token=TOKEN   (TOKEN is in {})", file.display()),
        },
        (None, _) => println!("open {url}#token=TOKEN   (TOKEN: the one given with --token)"),
    }
    for line in channel_lines(runtime.channels(), bound) {
        println!("{line}");
    }
    println!("WebSocket: ws://{bound}{} · Ctrl-C stops", http::WS_PATH);

    tokio::spawn(stop_on_signal(shutdown.clone()));
    // An active host that lost its lease stops at once: another serves the sessions now.
    let lost = active.as_ref().map(|active| active.lost.clone());
    if let Some(lost) = lost.clone() {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            lost.cancelled().await;
            shutdown.cancel();
        });
    }
    gateway.clone().serve(listener, shutdown).await;
    // Its partitions given back at once, the lanes stopped and their events stored: the other
    // hosts take them up now rather than after a lease's time to live.
    if let Some(ownership) = ownership {
        ownership.stop().await;
    }
    agent.stop();
    let _ = std::fs::remove_file(state.gateway_info());
    drop(lock);
    if lost.is_some_and(|lost| lost.is_cancelled()) {
        return Err(Error::Failed(
            "gateway: this host lost the cluster's gateway lease (it could not renew it in time, or another host took it); it stopped serving so that only one host writes the sessions. Start it again to wait as a standby".to_string(),
        ));
    }
    clawcage_runtime::tell!("clawcage gateway: stopped");
    Ok(())
}

/// The banner's lines for the channels started: Telegram and each webhook with its address.
fn channel_lines(
    channels: &clawcage_runtime::channel_config::Channels,
    bound: SocketAddr,
) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(telegram) = &channels.telegram {
        lines.push(format!(
            "channel telegram: started (token from ${}; direct messages: {})",
            telegram.token_env,
            format!("{:?}", telegram.dm_policy).to_lowercase()
        ));
    }
    for webhook in &channels.webhooks {
        lines.push(format!(
            "channel webhook {}: POST http://{bound}{}{}",
            webhook.name,
            http::HOOKS_PREFIX,
            webhook.name
        ));
    }
    if lines.is_empty() {
        lines.push("channels: none configured ([channels] in the configuration)".to_string());
    }
    lines
}

/// Cancels `shutdown` on SIGINT or SIGTERM.
async fn stop_on_signal(shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            tracing::error!("cannot listen for SIGINT and SIGTERM");
            return;
        };
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    clawcage_runtime::tell!(
        "clawcage gateway: stopping (running turns are interrupted; their messages are kept)"
    );
    shutdown.cancel();
}

/// The `message` tool's callback: an `assistant` event `{kind: "message"}` in the run of the
/// session whose turn sends it.
fn message_sender(
    hub: Arc<OnceLock<Weak<Hub>>>,
    channels: Arc<OnceLock<Weak<channels::Channels>>>,
) -> SendCallback {
    Arc::new(
        move |message: OutboundMessage| -> BoxFuture<'static, Result<(), String>> {
            let hub = hub.get().and_then(Weak::upgrade);
            let channels = channels.get().and_then(Weak::upgrade);
            Box::pin(async move {
                let Some(hub) = hub else {
                    return Err("the gateway is not serving yet".to_string());
                };
                let Some(key) = clawcage_agent::current_session_key() else {
                    return Err("no session is running a turn".to_string());
                };
                // A channel's session: the person gets it in the chat app (or another
                // destination the configuration allows).
                if let Some(channels) = channels {
                    channels
                        .deliver_message(&key, &message.channel, &message.content)
                        .await?;
                }
                hub.post_message(&key, &message.channel, &message.content)
                    .await;
                Ok(())
            })
        },
    )
}

impl Hub {
    /// Publishes a `message` tool's text as an `assistant` event of `key`'s current run.
    pub async fn post_message(&self, key: &str, channel: &str, content: &str) {
        let run_id = self.current_run(key).unwrap_or_default();
        self.publish_event(AgentEvent::new(
            key,
            &run_id,
            Stream::Assistant,
            json!({"kind": "message", "channel": channel, "content": content}),
        ))
        .await;
    }
}

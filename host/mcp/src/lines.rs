//! The stdio transport: newline-delimited JSON-RPC over any reader and writer, in place of
//! rmcp's `AsyncRwTransport`, which silently drops a line it cannot parse (a syntax error, or
//! JSON nested past serde_json's 128 levels) or that is longer than its cap, so that the client
//! waits forever for an answer. Here a task of its own reads the lines, at most
//! [`MAX_MESSAGE_BYTES`] of each kept in memory, runs each through [`inbound::admit`] and either
//! hands the parsed message to rmcp or writes the JSON-RPC error that answers it; replies and
//! rmcp's own messages share one writer, one whole line at a time.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;

use crate::inbound::{self, MAX_MESSAGE_BYTES, Scan};

/// Messages read ahead of rmcp's loop at most.
const QUEUE: usize = 16;

type Output = Arc<Mutex<Option<Box<dyn AsyncWrite + Send + Unpin>>>>;

/// A line-delimited transport whose every request is answered (see the module documentation).
pub(crate) struct LineTransport {
    incoming: mpsc::Receiver<ClientJsonRpcMessage>,
    output: Output,
    reader: JoinHandle<()>,
}

impl LineTransport {
    /// Reads messages from `read` and writes to `write`; must be called inside a tokio runtime.
    pub(crate) fn new<R, W>(read: R, write: W) -> LineTransport
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let output: Output = Arc::new(Mutex::new(Some(Box::new(write))));
        let (sender, incoming) = mpsc::channel(QUEUE);
        let reader = tokio::spawn(read_messages(read, output.clone(), sender));
        LineTransport {
            incoming,
            output,
            reader,
        }
    }
}

impl Drop for LineTransport {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Transport<RoleServer> for LineTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let output = self.output.clone();
        let line = serde_json::to_vec(&item).map_err(std::io::Error::from);
        async move { write_line(&output, line?).await }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        self.incoming.recv().await
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.reader.abort();
        let writer = self.output.lock().await.take();
        match writer {
            Some(mut writer) => writer.shutdown().await,
            None => Ok(()),
        }
    }
}

/// Writes `line` and a newline, then flushes, while holding the writer.
async fn write_line(output: &Output, mut line: Vec<u8>) -> std::io::Result<()> {
    line.push(b'\n');
    let mut guard = output.lock().await;
    let Some(writer) = guard.as_mut() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            "the MCP transport is closed",
        ));
    };
    writer.write_all(&line).await?;
    writer.flush().await
}

/// One line as read: its bytes (`None` when it was over the limit and dropped) and its scan.
struct Line {
    kept: Option<Vec<u8>>,
    scan: Scan,
}

/// Reads lines until the end of input, passing on the admitted messages and answering the
/// refused ones; ends when the input, the output or rmcp's side closes.
async fn read_messages<R>(read: R, output: Output, sender: mpsc::Sender<ClientJsonRpcMessage>)
where
    R: AsyncRead + Unpin,
{
    let mut read = BufReader::new(read);
    loop {
        let line = match next_line(&mut read).await {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(error) => {
                tracing::error!("cannot read the MCP input: {error}");
                return;
            }
        };
        if line.scan.is_blank() {
            continue;
        }
        match inbound::admit(line.kept.as_deref(), &line.scan) {
            Ok(message) => {
                if sender.send(message).await.is_err() {
                    return;
                }
            }
            Err(refusal) => {
                refusal.log();
                let Some(reply) = refusal.reply() else {
                    continue;
                };
                let bytes = match serde_json::to_vec(&reply) {
                    Ok(bytes) => bytes,
                    Err(error) => {
                        tracing::error!("cannot encode a JSON-RPC error: {error}");
                        continue;
                    }
                };
                if let Err(error) = write_line(&output, bytes).await {
                    tracing::error!("cannot answer on the MCP output: {error}");
                    return;
                }
            }
        }
    }
}

/// The next `\n`-terminated line (the last one may lack it), or `None` at the end of input. At
/// most [`MAX_MESSAGE_BYTES`] are kept; a longer line is still read to its end, and scanned for
/// its id, but not kept.
async fn next_line<R>(read: &mut BufReader<R>) -> std::io::Result<Option<Line>>
where
    R: AsyncRead + Unpin,
{
    let mut scan = Scan::default();
    let mut kept = Some(Vec::new());
    loop {
        let available = read.fill_buf().await?;
        if available.is_empty() {
            return Ok((scan.len() > 0).then_some(Line { kept, scan }));
        }
        let newline = available.iter().position(|&byte| byte == b'\n');
        let content = &available[..newline.unwrap_or(available.len())];
        scan.feed(content);
        if let Some(bytes) = kept.as_mut() {
            if scan.len() > MAX_MESSAGE_BYTES {
                kept = None;
            } else {
                bytes.extend_from_slice(content);
            }
        }
        let consumed = newline.map_or(available.len(), |at| at + 1);
        read.consume(consumed);
        if newline.is_some() {
            return Ok(Some(Line { kept, scan }));
        }
    }
}

//! The streams a pipeline's stages write to and read from: the captured output kept at its head
//! and tail, a file opened by redirection (each write charged to the call's write budget), the
//! bounded pipe between two stages (a closed reader ends the writer quietly), and the boxed
//! standard streams a stage's WASI context takes.

use super::*;

/// Output kept at its head and tail; the middle is counted.
#[derive(Debug)]
pub(super) struct HeadTail {
    pub(super) head_limit: usize,
    pub(super) tail_limit: usize,
    pub(super) head: Vec<u8>,
    pub(super) tail: VecDeque<u8>,
    pub(super) omitted: u64,
}

impl HeadTail {
    pub(super) fn new(head_limit: usize, tail_limit: usize) -> Self {
        Self {
            head_limit,
            tail_limit,
            head: Vec::new(),
            tail: VecDeque::new(),
            omitted: 0,
        }
    }

    pub(super) fn push(&mut self, mut bytes: &[u8]) {
        if self.head.len() < self.head_limit {
            let take = bytes.len().min(self.head_limit - self.head.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.is_empty() {
            return;
        }
        if bytes.len() >= self.tail_limit {
            self.omitted += (self.tail.len() + bytes.len() - self.tail_limit) as u64;
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_limit..]);
            return;
        }
        self.tail.extend(bytes);
        let excess = self.tail.len().saturating_sub(self.tail_limit);
        if excess > 0 {
            self.tail.drain(..excess);
            self.omitted += excess as u64;
        }
    }
}

/// A stream into a [`HeadTail`] shared by every stage that writes to it. Writes never block and
/// never fail, so a program writing past the limit keeps running normally.
#[derive(Clone)]
pub(super) struct Collector(pub(super) Arc<Mutex<HeadTail>>);

impl Collector {
    pub(super) fn new(head_limit: usize, tail_limit: usize) -> Self {
        Self(Arc::new(Mutex::new(HeadTail::new(head_limit, tail_limit))))
    }

    pub(super) fn push(&self, bytes: &[u8]) {
        if let Ok(mut buffer) = self.0.lock() {
            buffer.push(bytes);
        }
    }

    pub(super) fn take(&self) -> HeadTail {
        match self.0.lock() {
            Ok(mut buffer) => {
                let empty = HeadTail::new(buffer.head_limit, buffer.tail_limit);
                std::mem::replace(&mut *buffer, empty)
            }
            Err(_) => HeadTail::new(0, 0),
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Collector {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Collector {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

impl AsyncWrite for Collector {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for Collector {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Collector {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// A redirection's file, shared by every stream that names it, charging the write budget.
#[derive(Clone)]
pub(super) struct FileSink {
    pub(super) file: Arc<Mutex<std::fs::File>>,
    pub(super) budget: Arc<WriteBudget>,
}

impl FileSink {
    pub(super) fn write_bytes(&self, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write as _;
        if !self.budget.charge(bytes.len()) {
            return Err(budget_error());
        }
        let mut file = self
            .file
            .lock()
            .map_err(|_| std::io::Error::other("the file is unusable after a failed write"))?;
        file.write_all(bytes)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for FileSink {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for FileSink {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.write_bytes(&bytes)
            .map_err(|error| StreamError::LastOperationFailed(error.into()))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

impl AsyncWrite for FileSink {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(self.write_bytes(buf).map(|()| buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for FileSink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for FileSink {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// The writing end of a pipe, shared when a stage sends both stdout and stderr into it.
#[derive(Clone)]
pub(super) struct PipeWriter(pub(super) Arc<AsyncStdoutStream>);

impl IsTerminal for PipeWriter {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for PipeWriter {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(PipeEnd(self.0.p2_stream()))
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        self.0.async_stream()
    }
}

/// The writing end of a pipe as a WASI stream: once the reader is gone, writes report a closed
/// stream (the program sees a broken pipe, as `yes | head` expects) rather than an I/O error.
pub(super) struct PipeEnd(pub(super) Box<dyn OutputStream>);

pub(super) fn closed_if_broken(error: StreamError) -> StreamError {
    match error {
        StreamError::LastOperationFailed(cause)
            if cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            StreamError::Closed
        }
        other => other,
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for PipeEnd {
    async fn ready(&mut self) {
        self.0.ready().await;
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for PipeEnd {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.0.write(bytes).map_err(closed_if_broken)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.0.flush().map_err(closed_if_broken)
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.0.check_write().map_err(closed_if_broken)
    }
}

/// A boxed input stream as an input stream.
pub(super) struct BoxedStdin(pub(super) Box<dyn StdinStream>);

impl IsTerminal for BoxedStdin {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdinStream for BoxedStdin {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncRead + Send + Sync> {
        self.0.async_stream()
    }

    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::InputStream> {
        self.0.p2_stream()
    }
}

/// A boxed output stream as an output stream.
pub(super) struct BoxedStdout(pub(super) Box<dyn StdoutStream>);

impl IsTerminal for BoxedStdout {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for BoxedStdout {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        self.0.async_stream()
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        self.0.p2_stream()
    }
}

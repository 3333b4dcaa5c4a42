//! The newline-delimited transport both sides speak, over any tokio reader and writer (the
//! process's stdin and stdout, or an external agent's pipes), handed to the SDK as its `Lines`.
//! A line is read with a bound: one longer than [`MAX_LINE_BYTES`] is skipped to its end and
//! replaced by a short malformed line that names its size, so the SDK answers it with a parse
//! error instead of buffering without limit; a line that is not UTF-8 is replaced the same way.
//! Blank lines are skipped. Each written line is flushed at once.

use std::io;
use std::pin::Pin;

use agent_client_protocol::Lines;
use futures_util::{Sink, Stream};
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _};

/// The longest line read, in bytes (8 MiB, as the MCP server's).
pub const MAX_LINE_BYTES: usize = 8 << 20;

/// The lines the SDK reads.
pub type Incoming = Pin<Box<dyn Stream<Item = io::Result<String>> + Send>>;
/// The lines the SDK writes.
pub type Outgoing = Pin<Box<dyn Sink<String, Error = io::Error> + Send>>;

/// The SDK's line transport over `reader` and `writer`, lines bounded by `max_line`.
pub fn transport<R, W>(reader: R, writer: W, max_line: usize) -> Lines<Outgoing, Incoming>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    Lines::new(outgoing(writer), incoming(reader, max_line))
}

/// Lines read from `reader`, bounded by `max_line`.
pub fn incoming<R>(reader: R, max_line: usize) -> Incoming
where
    R: AsyncRead + Send + Unpin + 'static,
{
    let reader = tokio::io::BufReader::with_capacity(64 << 10, reader);
    Box::pin(futures_util::stream::unfold(
        reader,
        move |mut reader| async move {
            match next_line(&mut reader, max_line).await {
                Ok(Some(line)) => Some((Ok(line), reader)),
                Ok(None) => None,
                Err(error) => Some((Err(error), reader)),
            }
        },
    ))
}

/// A sink writing each line to `writer` with its newline, flushed. Once the reader has gone
/// (a broken pipe: the editor closed its end while an update was on its way), later lines are
/// dropped instead of failing the connection: nobody is left to read them, and the end of the
/// input then ends the session cleanly.
pub fn outgoing<W>(writer: W) -> Outgoing
where
    W: AsyncWrite + Send + Unpin + 'static,
{
    Box::pin(futures_util::sink::unfold(
        (writer, false),
        |(mut writer, gone), line: String| async move {
            if gone {
                return Ok::<_, io::Error>((writer, true));
            }
            let written = async {
                writer.write_all(line.as_bytes()).await?;
                writer.write_all(b"\n").await?;
                writer.flush().await
            }
            .await;
            match written {
                Ok(()) => Ok((writer, false)),
                Err(error) if error.kind() == io::ErrorKind::BrokenPipe => {
                    tracing::debug!("the client closed its input; dropping what is left to send");
                    Ok((writer, true))
                }
                Err(error) => Err(error),
            }
        },
    ))
}

/// The next non-blank line without its line ending; `None` at the end of input.
async fn next_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max_line: usize,
) -> io::Result<Option<String>> {
    loop {
        let mut line = Vec::new();
        let mut skipped = 0usize;
        let mut ended = false;
        loop {
            let chunk = reader.fill_buf().await?;
            if chunk.is_empty() {
                ended = true;
                break;
            }
            let (take, done) = match chunk.iter().position(|byte| *byte == b'\n') {
                Some(at) => (at + 1, true),
                None => (chunk.len(), false),
            };
            if skipped == 0 && line.len() + take <= max_line + 2 {
                line.extend_from_slice(&chunk[..take]);
            } else {
                skipped += take;
            }
            reader.consume(take);
            if done {
                break;
            }
        }
        if ended && line.is_empty() && skipped == 0 {
            return Ok(None);
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        if skipped > 0 || line.len() > max_line {
            let size = line.len() + skipped;
            return Ok(Some(format!(
                "[a line of {size} bytes was discarded: lines may have at most {max_line} bytes]"
            )));
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            if ended {
                return Ok(None);
            }
            continue;
        }
        return Ok(Some(String::from_utf8(line).unwrap_or_else(|_| {
            "[a line that is not UTF-8 was discarded]".to_string()
        })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt as _;

    async fn read_all(input: &'static [u8], max: usize) -> Vec<String> {
        incoming(input, max)
            .map(|line| line.unwrap())
            .collect()
            .await
    }

    #[tokio::test]
    async fn lines_are_split_trimmed_and_blank_ones_skipped() {
        let lines = read_all(b"{\"a\":1}\r\n\n  \n{\"b\":2}", 100).await;
        assert_eq!(lines, vec!["{\"a\":1}", "{\"b\":2}"]);
    }

    #[tokio::test]
    async fn an_oversized_line_is_replaced_and_the_next_one_read() {
        let lines = read_all(b"0123456789abcdef\n{\"ok\":true}\n", 12).await;
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("17 bytes was discarded"), "{}", lines[0]);
        assert!(serde_json::from_str::<serde_json::Value>(&lines[0]).is_err());
        assert_eq!(lines[1], "{\"ok\":true}");
    }

    #[tokio::test]
    async fn lines_to_a_reader_that_has_gone_are_dropped_not_an_error() {
        use futures_util::SinkExt as _;
        let (writer, reader) = tokio::io::duplex(64);
        let mut sink = outgoing(writer);
        sink.send("first".to_string()).await.unwrap();
        drop(reader);
        // The pipe is broken now: sending goes on quietly.
        sink.send("second".to_string()).await.unwrap();
        sink.send("third".to_string()).await.unwrap();
    }

    #[tokio::test]
    async fn invalid_utf8_is_replaced() {
        let lines = read_all(b"\xff\xfe\n", 100).await;
        assert_eq!(lines, vec!["[a line that is not UTF-8 was discarded]"]);
    }
}
